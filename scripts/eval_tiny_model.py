"""Evaluation of the embedded chat model on what the synthetic corpus holds out, and on what a newcomer sends.

Runs prompts through the engine's offline API (`DiffusionEngine.new_request` + `step`, i.e. what
`generate` does, with several requests sharing each forward pass; rows of a batch compute what they would
alone) and prints, per row, the share of right answers and of answers that ended with end-of-turn/EOS
(finish_reason "stop"). Rows:
- each task family in its held-out phrasings (never trained on), then all of them, and the held-out prompts
  of the training phrasings;
- the same held-out-phrasing prompts behind a held-out system prompt, after an earlier exchange, as a raw
  prompt without the chat template (what /v1/completions sends), and those that use number words;
- small talk, other prompts (the help answer), the out-of-range prompts of the corpus's held-out split;
- "out of range (fresh)": 40 prompts drawn at run time (`fresh_out_of_range`, random numbers past each
  family's range and made-up words; not stored anywhere), every one must get the help answer. The test draws
  them with seed 2026; `--rows out-of-range --fresh-seeds 6-15` draws 40 with each of ten other seeds, 400
  prompts that no run was chosen by (the card's unbiased count);
- "chat client": two-turn conversations where the first reply is the model's own, fed back as a chat client
  (`llm -c`) does.
With `--rows phrasings`, one row per held-out phrasing instead, each with every held-out prompt in it (or
`--per-row` of them): a family's row of 48 can hide a phrasing it mostly gets wrong (CF1: compare 83.3% of its
48, `What is the greatest of {a}, {b}, {c}?` 18 of its 120).
Then, with `--checks`: the garble check (`garble_check`: the newcomer prompts at canvases 24–128 and block
lengths down to 8, no repeated or cut word) and the variety check (`variety`: five seeds at temperature 1).

Usage: python scripts/eval_tiny_model.py [--model DIR] [--gen-length 32 --block-length 8 --steps 32
       --temperature 0 --use-local-leap] [--limit N] [--rows tasks] [--quantize int8] [--checks]
       (--rows tasks: the task rows only; --rows phrasings: one row per held-out phrasing;
       --quantize: none, int8 or int4 weights, engine/quantization.py)
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# Spinning OpenMP threads slow everything down 10x when the two cores are shared (see train_tiny_model.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

if __package__ in (None, ""):  # run as a script: make `scripts` and `engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import DiffusionEngine, SamplingParams  # noqa: E402
from scripts.tiny_chat_corpus import (  # noqa: E402
    AFTER,
    ALL_PHRASINGS,
    ASK_NAME,
    BEFORE,
    COUNT,
    FAMILIES,
    HELP_ANSWER,
    INTRO,
    LARGER,
    MINUS,
    NAMES,
    PLUS,
    REPEAT,
    SMALLER,
    SPELL,
    TASK_FAMILIES,
    Example,
    heldout_examples,
    heldout_system_prompts,
    normalized_prompt,
    phrasing_shape,
    training_pool,
)

NUMBER_FAMILIES = ("arithmetic", "compare", "count", "successor")
RAW = "raw"  # marks an example sent as a raw prompt (`prompt=`), not as chat messages
VARIETY_PROMPT = "Write one short sentence about a cat."


def with_system_prompt(examples: list[Example]) -> list[Example]:
    """Each example behind a held-out system prompt (assigned in turn)."""
    systems = heldout_system_prompts()
    return [
        Example(
            [{"role": "system", "content": systems[i % len(systems)]}, *e.messages],
            e.answer,
            e.family,
            answers=e.answers,
        )
        for i, e in enumerate(examples)
    ]


def after_earlier_exchange(examples: list[Example]) -> list[Example]:
    """Each example after another held-out example's exchange (its prompt and a right answer)."""
    out = []
    for i, e in enumerate(examples):
        earlier = examples[(i + 1) % len(examples)]
        turn = [*earlier.messages, {"role": "assistant", "content": earlier.answer}]
        out.append(Example([*turn, *e.messages], e.answer, e.family, answers=e.answers))
    return out


def as_raw_prompts(examples: list[Example]) -> list[Example]:
    """The single-turn examples as raw prompts: the user text alone, no chat template."""
    return [
        Example([{"role": RAW, "content": e.messages[0]["content"]}], e.answer, e.family, answers=e.answers)
        for e in examples
        if e.single_turn
    ]


def uses_number_words(example: Example) -> bool:
    """A number-taking prompt with its numbers spelled out (no digit in it)."""
    text = example.messages[-1]["content"]
    return example.family in NUMBER_FAMILIES and not any(c.isdigit() for c in text)


def fresh_out_of_range(n: int = 40, seed: int = 2026) -> list[Example]:
    """Prompts the model must answer with the help answer, drawn at run time in every family's phrasings
    (held-out ones included): numbers past the family's range, long counts, made-up
    words and names. Made-up words are random letters (not the corpus's syllable words)."""
    rng = random.Random(seed)

    def phrasing(pair):
        return rng.choice(pair[0] + pair[1])

    def word() -> str:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(5, 9)))

    makers = [
        lambda: phrasing(PLUS).format(a=rng.randint(10, 99), b=rng.randint(0, 99)),
        lambda: phrasing(MINUS).format(a=rng.randint(0, 99), b=rng.randint(10, 99)),
        lambda: phrasing(MINUS).format(a=rng.randint(10, 99), b=rng.randint(0, 9)),
        lambda: phrasing(rng.choice([LARGER, SMALLER])).format(
            a=rng.randint(10, 99), b=rng.randint(10, 99), c=rng.randint(10, 99)
        ),
        lambda: phrasing(COUNT).format(a=rng.randint(0, 3), b=rng.randint(10, 30)),
        lambda: phrasing(rng.choice([AFTER, BEFORE])).format(a=rng.randint(25, 500)),
        lambda: phrasing(SPELL).format(w=word()),
        lambda: phrasing(REPEAT).format(s=word()),
        lambda: phrasing(INTRO).format(n=word().capitalize()),
        lambda: f"What is the capital of {word().capitalize()}?",
    ]

    # A draw that the corpus holds (a two-digit sum in one of its training phrasings, say) is drawn
    # again: the set measures what the model makes of prompts it never saw.
    def draw(i: int) -> Example:
        return Example([{"role": "user", "content": makers[i % len(makers)]()}], HELP_ANSWER, "out_of_range")

    seen = {e.key for items in training_pool().values() for e in items}
    out = []
    for i in range(n):
        example = draw(i)
        while example.key in seen:
            example = draw(i)
        seen.add(example.key)
        out.append(example)
    return out


def chat_client_conversations(limit: int = 40) -> list[tuple[list[dict], list[dict], Example]]:
    """(first turn, second turn, expected) where the model's own reply to the first turn goes in between:
    an introduction then a held-out question about the name, and one held-out task after another."""
    rng = random.Random("chat client")
    out = []
    for i in range(limit // 2):
        n = NAMES[i % len(NAMES)]
        intro = rng.choice(INTRO[0] + INTRO[1]).format(n=n)
        ask = rng.choice(ASK_NAME[1])
        out.append(([{"role": "user", "content": intro}], [{"role": "user", "content": ask}], Example([], n, "name")))
    tasks = heldout_examples(limit, phrasing="heldout", families=("arithmetic", "compare", "count", "spell", "repeat"))
    for first, second in zip(tasks[0::2], tasks[1::2]):
        out.append((first.messages, second.messages, second))
    return out[:limit]


def evaluation_rows(
    limit: int, fresh_out_of_range_prompts: int = 40, fresh_seeds: Sequence[int] = (2026,)
) -> dict[str, list[Example]]:
    """Row name -> prompts: one row per task family, then the conversation rows (all held out). The fresh
    out-of-range row holds one draw of `fresh_out_of_range_prompts` per seed."""
    tasks = heldout_examples(limit, phrasing="heldout")
    rows: dict[str, list[Example]] = {
        f"{family} (new phrasing)": [e for e in tasks if e.family == family] for family in TASK_FAMILIES
    }
    rows["tasks, new phrasings"] = tasks
    rows["tasks, trained phrasings"] = heldout_examples(limit, phrasing="trained")
    rows["tasks, system prompt"] = with_system_prompt(tasks)
    rows["tasks, earlier turn"] = after_earlier_exchange(tasks)
    rows["tasks, raw prompt"] = as_raw_prompts(tasks)
    rows["number words"] = [e for e in tasks if uses_number_words(e)]
    rows["small talk"] = heldout_examples(10_000, families=("small_talk",))
    rows["help (other)"] = heldout_examples(10_000, families=("help",))
    rows["help, system prompt"] = with_system_prompt(rows["help (other)"])
    rows["help, raw prompt"] = as_raw_prompts(rows["help (other)"])
    rows["out of range (split)"] = heldout_examples(10_000, families=("out_of_range",))
    rows["out of range (fresh)"] = [e for s in fresh_seeds for e in fresh_out_of_range(fresh_out_of_range_prompts, s)]
    return rows


def heldout_phrasing_rows() -> dict[str, list[Example]]:
    """Row per held-out phrasing ("family: template") -> every held-out prompt in that phrasing, in the
    family's shuffled order (so that a row's first N are a sample of it)."""
    templates = dict.fromkeys(t for _, heldout in ALL_PHRASINGS for t in heldout)  # facts share theirs
    shapes = [(template, re.compile(phrasing_shape(template))) for template in templates]
    rows: dict[str, list[Example]] = {}
    for family in TASK_FAMILIES:
        for e in heldout_examples(10**6, families=(family,), phrasing="heldout"):
            texts = [normalized_prompt(m["content"]) for m in reversed(e.messages) if m["role"] == "user"]
            template = next(t for text in texts for t, shape in shapes if shape.fullmatch(text))
            rows.setdefault(f"{family}: {template}", []).append(e)
    return rows


def _new_request(engine: DiffusionEngine, e: Example, params: SamplingParams):
    if e.messages[0]["role"] == RAW:
        return engine.new_request(e.messages[0]["content"], params=params)
    return engine.new_request(messages=e.messages, params=params)


def run(engine: DiffusionEngine, examples, params: SamplingParams, batch: int):
    results = []
    for i in range(0, len(examples), batch):
        requests = [_new_request(engine, e, params) for e in examples[i : i + batch]]
        done: dict[int, object] = {}
        while len(done) < len(requests):
            live = [(j, r) for j, r in enumerate(requests) if j not in done]
            for (j, _), event in zip(live, engine.step([r for _, r in live])):
                if isinstance(event, Exception):
                    raise event
                if event.finished:
                    done[j] = event.result
        results += [done[j] for j in range(len(requests))]
    return results


def run_chat_client(engine: DiffusionEngine, conversations, params: SamplingParams, batch: int) -> list:
    """The second replies of `chat_client_conversations`, the model's own first reply fed back."""
    firsts = run(engine, [Example(first, "", "") for first, _, _ in conversations], params, batch)
    seconds = [
        Example([*first, {"role": "assistant", "content": r.text.strip()}, *second], e.answer, e.family)
        for (first, second, e), r in zip(conversations, firsts)
    ]
    return run(engine, seconds, params, batch)


# ---- garble check -----------------------------------------------------------------------------------------

# The first prompts a newcomer tries: small talk, questions about the model, tasks, open requests and what
# the model cannot do (40 prompts; the README's examples among them).
NEWCOMER_PROMPTS = [
    "Hello", "Hi!", "How are you?", "Thanks", "Bye", "Who are you?", "What can you do?", "Help",
    "Tell me a joke.", "What is the meaning of life?", "Write a haiku about the sea.", "Explain quantum physics.",
    "What is 2 plus 5?", "what's 12 plus 30", "What is the largest of 3, 8, 5?", "What is the smallest of 6, 3, 9?",
    "Which is larger, 4 or 7?", "What comes after 6?", "What is 9 minus 4?", "Count from one to five.",
    "Count from 1 to 10.", "Spell dog.", "Spell elephant.", "How do you spell apple?", 'Say "green tree".',
    "Repeat after me: chair", "Repeat after me: window", "My name is Rose.", "What is the capital of France?",
    "What is the capital of Peru?", "Write one short sentence about a cat.", "Write a story about a dog.",
    "Write a poem about the moon.", "Tell me about the weather.", "ok", "???", "Translate hello into French.",
    "What is 7 + 8?", "Echo banana", "Good morning",
]  # fmt: skip
CANVASES = (24, 32, 48, 64, 128)
BLOCK_LENGTHS = (128, 64, 48, 32, 24, 16, 8)
_STRIP = ".,!?:;\"'()"


def _words(text: str) -> list[str]:
    return [w.strip(_STRIP).lower() for w in text.split() if w.strip(_STRIP)]


def answer_words() -> set[str]:
    """Every word any answer of the corpus uses: a word outside this set in an output is a cut or invented one."""
    words: set[str] = set()
    for make in FAMILIES.values():
        for e in make():
            for a in e.right_answers:
                words.update(_words(a))
    return words | {n.lower() for n in NAMES}


def garble(text: str, known: set[str]) -> str | None:
    """Why `text` is garbled (a word repeated back to back, or a word no answer uses), or None."""
    words = _words(text)
    for a, b in zip(words, words[1:]):
        if a == b:
            return f"repeated word {a!r}"
    for w in words:
        if w not in known:
            return f"cut or unknown word {w!r}"
    if not words:
        return "empty"
    return None


def garble_check(
    engine: DiffusionEngine,
    prompts=NEWCOMER_PROMPTS,
    block_lengths=BLOCK_LENGTHS,
    batch: int = 40,
    verbose: bool = True,
) -> list:
    """Every prompt at every canvas and block length (block dividing the canvas, at most the canvas):
    returns (canvas, block, prompt, text, why) for each garbled or cut-off (finish "length") answer."""
    known = answer_words()
    examples = [Example([{"role": "user", "content": p}], "", "newcomer") for p in prompts]
    failures = []
    for canvas in CANVASES:
        for block in [b for b in block_lengths if b <= canvas and canvas % b == 0]:
            params = SamplingParams(gen_length=canvas, block_length=block, temperature=0.0)
            results = run(engine, examples, params, batch)
            bad = 0
            for p, r in zip(prompts, results):
                why = garble(r.text, known) or (None if r.finish_reason == "stop" else f"finish {r.finish_reason}")
                if why:
                    bad += 1
                    failures.append((canvas, block, p, r.text, why))
            if verbose:
                print(f"garble check canvas {canvas:3d} block {block:3d}: {bad} of {len(prompts)} garbled", flush=True)
    return failures


def variety(engine: DiffusionEngine, seeds=(0, 1, 2, 3, 4), temperature: float = 1.0) -> list[str]:
    """The answers to VARIETY_PROMPT at `temperature` with each seed (default canvas)."""
    texts = []
    for seed in seeds:
        params = SamplingParams.for_model(engine.sampler_defaults, temperature=temperature, seed=seed)
        texts.append(
            engine.generate(messages=[{"role": "user", "content": VARIETY_PROMPT}], params=params).text.strip()
        )
    return texts


def seed_range(text: str) -> range:
    """`6-15` -> seeds 6 to 15, `7` -> seed 7 alone."""
    first, _, last = text.partition("-")
    try:
        return range(int(first), int(last or first) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a seed or a FIRST-LAST range of seeds: {text!r}") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory or hub id (default: the embedded model)")
    ap.add_argument("--gen-length", type=int, default=32)
    ap.add_argument("--block-length", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (used when temperature > 0)")
    ap.add_argument("--use-local-leap", action="store_true")
    ap.add_argument("--limit", type=int, default=400, help="number of held-out task prompts")
    ap.add_argument("--batch", type=int, default=32, help="requests per forward pass (1 = plain generate)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quantize", default="none", help="weight-only quantization: none, int8, int4")
    ap.add_argument("--dtype", default=None, help="model dtype (default float32 on the CPU)")
    ap.add_argument("--rows", choices=("all", "tasks", "phrasings", "out-of-range", "none"), default="all",
                    help="tasks: no conversation rows; phrasings: one row per held-out phrasing; out-of-range: "
                    "only the fresh out-of-range prompts")  # fmt: skip
    ap.add_argument("--fresh", type=int, default=40, help="fresh out-of-range prompts drawn (the v3 test draws 40)")
    ap.add_argument("--fresh-seeds", type=seed_range, default=range(2026, 2027), metavar="FIRST-LAST",
                    help="draw --fresh prompts with each of these seeds (default 2026, the test's draw); a range "
                    "the test never drew, such as 6-15, counts made-up answers no run was chosen by")  # fmt: skip
    ap.add_argument("--checks", action="store_true", help="also the garble and variety checks")
    ap.add_argument("--show-wrong", type=int, default=0, help="print up to N wrong answers per row")
    ap.add_argument("--per-row", type=int, default=0, help="at most N prompts per row (0: all)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    engine = DiffusionEngine.from_pretrained(args.model, device="cpu", dtype=args.dtype, quantize=args.quantize)
    params = SamplingParams.for_model(  # what the server runs: the model's defaults for what is left out
        engine.sampler_defaults,
        gen_length=args.gen_length,
        block_length=args.block_length,
        num_denoising_steps=args.steps,
        temperature=args.temperature,
        seed=args.seed,
        use_local_leap=args.use_local_leap,
    )
    leap = "on" if params.use_local_leap else "off"
    print(
        f"model {engine.model_name}: gen {params.gen_length}, block {params.block_length}, "
        f"{params.num_denoising_steps} steps, T={params.temperature}, LocalLeap {leap}, "
        f"{next(engine.model.parameters()).dtype}, quantization {engine.quantization}"
    )
    if args.rows != "none":
        report(
            engine,
            params,
            args.limit,
            args.batch,
            args.rows,
            args.show_wrong,
            args.per_row,
            args.fresh,
            args.fresh_seeds,
        )
    if args.checks:
        failures = garble_check(engine)
        for canvas, block, prompt, text, why in failures[:40]:
            print(f"  garbled at canvas {canvas} block {block}: {prompt!r} -> {text!r} ({why})")
        print(f"garble check: {len(failures)} garbled answers in all")
        texts = variety(engine)
        print(f"variety ({VARIETY_PROMPT!r}, T=1, 5 seeds): {len(set(texts))} distinct: {texts}")


def report(
    engine: DiffusionEngine,
    params: SamplingParams,
    limit: int,
    batch: int,
    which: str = "all",
    show_wrong: int = 0,
    per_row: int = 0,
    fresh: int = 40,
    fresh_seeds: Sequence[int] = (2026,),
) -> dict[str, float]:
    """Print one line per evaluation row; returns row -> share of right answers."""
    print(f"{'row':28s} {'n':>4s} {'right':>7s} {'stop':>7s}")
    scores: dict[str, float] = {}
    answered: dict[tuple, object] = {}  # "tasks, new phrasings" and "number words" reuse the per-family results
    tokens, seconds, results_all = 0, 0.0, []
    rows = heldout_phrasing_rows() if which == "phrasings" else evaluation_rows(limit, fresh, fresh_seeds)
    if which == "tasks":
        rows = {name: rows[name] for name in rows if name.endswith("(new phrasing)") or name.startswith("tasks, ")}
    elif which == "out-of-range":
        rows = {"out of range (fresh)": rows["out of range (fresh)"]}
    for name, examples in rows.items():
        examples = examples[:per_row] if per_row else examples
        if not examples:
            continue
        needed = max(len(engine.tokenizer.encode_text(a)) + 1 for e in examples for a in e.right_answers)
        if needed > params.gen_length:
            print(f"{name:28s} {len(examples):4d}  (answers need a {needed}-token canvas)")
            continue
        todo = [e for e in examples if (e.key, e.answer) not in answered]
        start = time.perf_counter()
        for e, r in zip(todo, run(engine, todo, params, batch)):
            answered[(e.key, e.answer)] = r
            tokens += r.completion_tokens
            results_all.append(r)
        seconds += time.perf_counter() - start
        results = [answered[(e.key, e.answer)] for e in examples]
        scores[name] = sum(e.is_right(r.text) for e, r in zip(examples, results)) / len(examples)
        stops = sum(r.finish_reason == "stop" for r in results) / len(examples)
        print(f"{name:28s} {len(examples):4d} {scores[name]:7.1%} {stops:7.1%}", flush=True)
        wrong = [(e, r) for e, r in zip(examples, results) if not e.is_right(r.text)]
        for e, r in wrong[:show_wrong]:
            print(f"    {e.messages[-1]['content']!r} -> {r.text.strip()!r} (want {e.answer!r})")
    if which in ("all", "tasks"):
        conversations = chat_client_conversations()
        results = run_chat_client(engine, conversations, params, batch)
        scores["chat client"] = sum(e.is_right(r.text) for (_, _, e), r in zip(conversations, results)) / len(results)
        print(f"{'chat client (own replies)':28s} {len(results):4d} {scores['chat client']:7.1%}")
    passes = sum(r.num_forward_passes for r in results_all) / max(1, len(results_all))
    print(f"mean forward passes {passes:.1f}")
    print(f"tokens/s            {tokens / max(seconds, 1e-9):.1f}  ({tokens} tokens, {seconds:.1f} s, batch {batch})")
    return scores


if __name__ == "__main__":
    main()
