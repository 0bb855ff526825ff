"""The embedded default model (models/tiny-llada-chat) answers held-out phrasings, says honestly what it cannot
do, and its split is clean.

Besides its task families it must behave for a newcomer: a short reply to small talk, one short honest help
answer to anything it cannot do (numbers past its range, words it does not know, other requests), the same
task answers behind a system prompt, after its own earlier replies and as a raw prompt without the chat
template, no garbled words at any canvas, and open requests answered by sentences that vary with the seed.
The targets are issue 28's; models/tiny-llada-chat/README.md has the measured numbers. The shipped weights
miss a few of them: `UNMET_TARGETS` marks those tests, and `SHIPPED_MISSES` pins the prompts they miss.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys

import pytest

from engine import DiffusionEngine, SamplingParams
from engine.loading import EMBEDDED_MODEL_DIR
from scripts.build_tiny_tokenizer import build_tokenizer
from scripts.eval_tiny_model import (
    NEWCOMER_PROMPTS,
    VARIETY_PROMPT,
    after_earlier_exchange,
    answer_words,
    as_raw_prompts,
    chat_client_conversations,
    evaluation_rows,
    fresh_out_of_range,
    garble,
    garble_check,
    heldout_phrasing_rows,
    run_chat_client,
    seed_range,
    variety,
    with_system_prompt,
)
from scripts.eval_tiny_model import run as run_heldout
from scripts.tiny_chat_corpus import (
    ADJECTIVES,
    COMPARISON_SYNONYMS,
    FACTS,
    FAMILIES,
    HELP_ANSWER,
    LARGER,
    NAMES,
    NEUTRAL_OPENINGS,
    NUMBER_WORDS,
    PHRASINGS,
    SMALLER,
    TASK_FAMILIES,
    WORDS,
    Example,
    heldout_examples,
    heldout_phrasing_shapes,
    heldout_system_prompts,
    lower_first,
    normalized_prompt,
    swap_comparison_word,
    training_pool,
    training_system_prompts,
    training_texts,
    vary_phrasing,
)

# Five prompts per task family, each in a phrasing the model never saw in training.
_NEW = heldout_examples(400, phrasing="heldout")
NEW_PHRASINGS = [e for f in TASK_FAMILIES for e in [x for x in _NEW if x.family == f][:5]]


# Issue 28's targets that the shipped weights miss: target -> what they measured. The issue stays open until
# weights meet every target; strict, so that weights which meet one turn its test red until its entry goes.
UNMET_TARGETS = {
    "out of range, default canvas": "1 of 40 invented (`95-9` -> `45`)",
}


def unmet(target: str):
    """The xfail mark of a target the shipped weights miss (no effect on one they meet)."""
    why = UNMET_TARGETS.get(target)
    return pytest.mark.xfail(why is not None, reason=f"issue 28, unmet by the shipped weights: {why}", strict=True)


def user(text: str) -> dict:
    return {"role": "user", "content": text}


ASSISTANT = {"role": "system", "content": "You are a helpful assistant."}
# The first prompts a newcomer tries, with the answers the README promises.
NEWCOMER = [
    ([user("Hello")], "Hello! Nice to meet you."),
    ([user("Who are you?")], HELP_ANSWER),
    ([user("Write a haiku about the sea.")], HELP_ANSWER),
    ([user("Count from one to five.")], "1 2 3 4 5"),
    ([ASSISTANT, user("What is 2 plus 5?")], "7"),
    ([ASSISTANT, user("Spell dog.")], "d-o-g"),
    ([user("What is the largest of 3, 8, 5?")], "8"),
    ([user("What is the smallest of 6, 3, 9?")], "3"),
    ([user("What comes after 6?")], "7"),
    ([user("Repeat after me: chair")], "chair"),
    ([user("My name is Rose.")], "Nice to meet you, Rose."),
    # What it cannot do: the help answer, never an invented one.
    ([user("what's 12 plus 30")], HELP_ANSWER),
    ([user("Spell elephant.")], HELP_ANSWER),
    ([user("Count from 1 to 10.")], HELP_ANSWER),
    ([user("Repeat after me: window")], HELP_ANSWER),
]


@pytest.fixture(scope="module")
def engine(embedded_engine) -> DiffusionEngine:
    return embedded_engine  # `from_pretrained` with no argument: the embedded model (tests/conftest.py)


def default_request(engine, **knobs) -> SamplingParams:
    """The parameters the server runs a request with that sets only `knobs`: the model's own defaults for the
    rest (its declared block length among them, models/tiny-llada-chat/generation_config.json)."""
    return SamplingParams.for_model(engine.sampler_defaults, temperature=0.0, **knobs)


def share_right(examples, results) -> float:
    return sum(e.is_right(r.text) for e, r in zip(examples, results)) / len(examples)


def right_per_family(examples, results) -> dict[str, list[bool]]:
    """Whether each answer is right, grouped by task family."""
    return {f: [e.is_right(r.text) for e, r in zip(examples, results) if e.family == f] for f in TASK_FAMILIES}


def test_embedded_model_is_small_and_in_llada_layout():
    names = {p.name for p in EMBEDDED_MODEL_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert sum(p.stat().st_size for p in EMBEDDED_MODEL_DIR.iterdir()) <= 25 * 1024 * 1024


def test_embedded_model_declares_the_block_length_its_trainer_writes(engine):
    """Blocks of 8 (scripts/train_tiny_model.py DECODE_BLOCK_LENGTH says why): what a request that sets none gets,
    at the default canvas and at max_tokens 32 alike."""
    from scripts.train_tiny_model import DECODE_BLOCK_LENGTH

    assert engine.sampler_defaults.block_length == DECODE_BLOCK_LENGTH == 8
    assert {default_request(engine, gen_length=n).block_length for n in (128, 32)} == {8}


def test_the_trainer_builds_the_shipped_config_and_evaluates_the_default_request_as_the_server_decodes_it(engine):
    """The trainer's model config is the shipped config.json, and it carries the declared block length, so the
    trainer's final eval at the default request decodes as the server does (the probe's one block does not)."""
    from tokenizers import Tokenizer

    from scripts.train_tiny_model import model_config

    config = model_config(Tokenizer.from_file(str(EMBEDDED_MODEL_DIR / "tokenizer.json")))
    assert config.to_dict() == json.loads((EMBEDDED_MODEL_DIR / "config.json").read_text())
    assert config.sampler_defaults == engine.sampler_defaults


def _run(examples, gen_length: int = 32):
    def answer(engine):
        return examples, run_heldout(engine, examples, default_request(engine, gen_length=gen_length), len(examples))

    return answer


def _chat_client(engine):
    conversations = chat_client_conversations(20)
    results = run_chat_client(engine, conversations, default_request(engine, gen_length=32), batch=20)
    return [Example(second, e.answer, e.family) for _, second, e in conversations], results


def _heldout_row(row: str):
    return lambda engine: _run(evaluation_rows(400)[row][:10])(engine)


# Issue 28's target sets: name -> engine -> (examples, results), each at the default request or max_tokens 32.
# The run-time draws (`fresh_out_of_range`, `evaluation_rows`: 1.5 s) are made when a set first runs, not at import.
CANVASES = {"default canvas": 128, "max_tokens 32": 32}
HELDOUT_ROWS = ("small talk", "help (other)", "out of range (split)", "number words")
TARGET_SETS = {
    **{f"new phrasings, {name}": _run(NEW_PHRASINGS, gen_length) for name, gen_length in CANVASES.items()},
    "system prompt": _run(with_system_prompt(NEW_PHRASINGS)),
    "raw prompt": _run(as_raw_prompts(NEW_PHRASINGS)),
    "chat client": _chat_client,
    **{
        f"out of range, {name}": lambda engine, n=gen_length: _run(fresh_out_of_range(40), n)(engine)
        for name, gen_length in CANVASES.items()
    },
    **{f"held-out {row}": _heldout_row(row) for row in HELDOUT_ROWS},
}


@pytest.fixture(scope="module")
def target_answers(engine):
    """Each target set run once per module: the target tests and the pin of the shipped weights' misses share it."""
    runs = {}

    def answers(name: str):
        if name not in runs:
            runs[name] = TARGET_SETS[name](engine)
        return runs[name]

    return answers


def missed(examples, results) -> list[str]:
    return [e.messages[-1]["content"] for e, r in zip(examples, results) if not e.is_right(r.text)]


@pytest.mark.parametrize("canvas", [pytest.param(c, marks=unmet(f"new phrasings, {c}")) for c in CANVASES])
def test_embedded_model_answers_new_phrasings_of_every_family(target_answers, canvas):
    """>= 90% on held-out phrasings at the default settings and at max_tokens 32."""
    examples, results = target_answers(f"new phrasings, {canvas}")
    assert share_right(examples, results) >= 0.9
    for family, right in right_per_family(examples, results).items():  # no family left behind: 4 of its 5
        assert sum(right) >= len(right) - 1, family
    assert all(r.finish_reason == "stop" for r in results)


@pytest.mark.slow  # 400 prompts, about 40 s
@unmet("every family, 400 new phrasings")
def test_every_family_answers_90_percent_of_its_heldout_phrasings(engine):
    """The model card's per-family rows at max_tokens 32 (about 48 prompts each, the five above among them): a
    family can pass four of its five above and still fall short here. The default canvas's column costs four times
    as long; `scripts/eval_tiny_model.py --gen-length 128` measures it."""
    shares = {family: sum(right) / len(right) for family, right in right_per_family(*_run(_NEW)(engine)).items()}
    assert {family: share for family, share in shares.items() if share < 0.9} == {}


@pytest.mark.parametrize("variant", [pytest.param(v, marks=unmet(v)) for v in ("system prompt", "raw prompt")])
def test_embedded_model_answers_the_same_behind_a_system_prompt_and_as_a_raw_prompt(target_answers, variant):
    """Raw prompts are what /v1/completions (LlamaIndex's OpenAILike default) sends: no chat template."""
    assert share_right(*target_answers(variant)) >= 0.9


@unmet("chat client")
def test_embedded_model_answers_after_its_own_earlier_replies(target_answers):
    """As a chat client (`llm -c`) sends a conversation: the model's own first reply is fed back."""
    examples, results = target_answers("chat client")
    assert sum(e.is_right(r.text) for e, r in zip(examples, results)) >= 18


@pytest.mark.parametrize("canvas", [pytest.param(c, marks=unmet(f"out of range, {c}")) for c in CANVASES])
def test_embedded_model_gives_the_help_answer_outside_its_range(target_answers, canvas):
    """40 prompts drawn at run time (numbers past each range, made-up words and names): none invented."""
    _, results = target_answers(f"out of range, {canvas}")
    assert [r.text.strip() for r in results] == [HELP_ANSWER] * 40


@pytest.mark.parametrize("row", [pytest.param(r, marks=unmet(f"held-out {r}")) for r in HELDOUT_ROWS])
def test_embedded_model_answers_heldout_conversations(target_answers, row):
    assert share_right(*target_answers(f"held-out {row}")) >= 0.9


# The prompts of each target set that the shipped weights answer wrong, as measured when they were committed.
SHIPPED_MISSES = {
    "new phrasings, default canvas": [],
    "new phrasings, max_tokens 32": [],
    "system prompt": [],
    "raw prompt": ["Can you count from three to six?", "Can you count to 5?", "Tell me what comes after 11."],
    "chat client": ['Can you say "lion"?'],
    "out of range, default canvas": ["95-9"],
    "out of range, max_tokens 32": [],
    "held-out small talk": [],
    "held-out help (other)": [],
    "held-out out of range (split)": [],
    "held-out number words": [],
}


def test_the_shipped_weights_miss_only_the_prompts_measured_when_they_were_committed(target_answers):
    """Pins the shipped weights: a change to the engine or the weights that loses or wins a prompt shows here,
    beyond the targets' thresholds (the wrong answers themselves are not pinned: they may differ in a near tie)."""
    assert {name: missed(*target_answers(name)) for name in TARGET_SETS} == SHIPPED_MISSES


def test_help_answer_is_short_and_names_what_works(engine):
    assert len(engine.tokenizer.encode_text(HELP_ANSWER)) <= 20
    assert all(task in HELP_ANSWER for task in ("add", "compare", "count", "spell", "repeat"))


@pytest.mark.parametrize(("messages", "answer"), NEWCOMER, ids=[m[-1]["content"] for m, _ in NEWCOMER])
def test_embedded_model_answers_a_newcomers_first_prompts(engine, messages, answer):
    for gen_length in (128, 32):  # the default request, and max_tokens 32 as the README's examples send
        res = engine.generate(messages=messages, params=default_request(engine, gen_length=gen_length))
        assert (res.text.strip(), res.finish_reason) == (answer, "stop")


def test_an_open_request_gets_a_sentence_about_its_topic_that_varies_with_the_seed(engine):
    texts = variety(engine, seeds=(0, 1, 2, 3, 4), temperature=1.0)
    assert len(set(texts)) >= 3, texts
    assert all(t in {f"The cat is {adj}." for adj in ADJECTIVES} for t in texts), texts
    assert len(set(variety(engine, seeds=(0, 1), temperature=0.0))) == 1  # temperature 0: one stable answer


def test_garble_detector_flags_the_first_models_failures():
    """The failures issue 28 reports: a cut word and a repeated word, then two clean answers."""
    known = answer_words()
    assert garble("This is a tiny demo model- dllm dllm-serve. It add add, compare", known)
    assert garble("It add add, compare", known) == "repeated word 'add'"
    assert garble("m-o-u-!-", known)
    assert garble(HELP_ANSWER, known) is None and garble("d-o-g", known) is None


def test_no_garbled_newcomer_answer_at_small_canvases_and_blocks(engine):
    """The help answer and small talk at every canvas with whole-canvas blocks and with blocks of 8."""
    prompts = [
        "Hello",
        "How are you?",
        "Thanks",
        "Bye",
        "Who are you?",
        "Tell me a joke.",
        VARIETY_PROMPT,
        "Spell dog.",
    ]
    failures = garble_check(engine, prompts, block_lengths=(128, 64, 48, 32, 24, 8), verbose=False)
    assert not failures


@pytest.mark.slow  # 40 prompts x 16 canvas/block settings
def test_no_garbled_answer_on_the_newcomer_set_at_any_canvas(engine):
    assert len(NEWCOMER_PROMPTS) == 40
    assert not garble_check(engine, verbose=False)


@pytest.mark.slow  # 130 prompts at five canvases
def test_no_garbled_reply_to_heldout_small_talk_at_any_canvas(engine):
    """Issue 28: every small-talk reply comes out clean. The newcomer set holds only a few small-talk prompts; a run
    that passed every other test (T3b, docs/embedded-model-runs.md) answered `how are things.` with `I am fine,
    thank youI am` at the default canvas. A wrong but clean reply is the target tests' business, not this one's."""
    prompts = [e.messages[-1]["content"] for e in heldout_examples(10_000, families=("small_talk",))]
    assert len(prompts) >= 100
    assert not garble_check(engine, prompts, block_lengths=(8,), verbose=False)  # the declared block, canvases 24-128


def test_evaluation_rows_wrap_the_task_prompts_in_heldout_conversations():
    tasks = heldout_examples(40)
    systems = set(heldout_system_prompts())
    assert all(e.messages[0]["content"] in systems for e in with_system_prompt(tasks))
    for e, task in zip(after_earlier_exchange(tasks), tasks):
        assert e.messages[-len(task.messages) :] == task.messages and e.answer == task.answer
        assert e.messages[-len(task.messages) - 1]["role"] == "assistant"
    rows = evaluation_rows(400)
    # Number-word prompts carry no digit at all (every number of the prompt is spelled out).
    assert len(rows["number words"]) >= 20
    assert not any(c.isdigit() for e in rows["number words"] for c in e.messages[-1]["content"])


def test_the_per_phrasing_rows_put_every_heldout_prompt_under_its_own_phrasing():
    """`eval_tiny_model.py --rows phrasings`: a family's 48-prompt row hid that CF1 answered 18 of the 120 held-out
    `What is the greatest of ...?` prompts right, so the card also reports each held-out phrasing on its own."""
    rows = heldout_phrasing_rows()
    assert sum(map(len, rows.values())) == len(heldout_examples(10**6, phrasing="heldout"))
    assert {row for row in rows if row.startswith("compare: ")} == {f"compare: {t}" for t in LARGER[1] + SMALLER[1]}
    for template in LARGER[1] + SMALLER[1]:
        opening = template.split("{")[0]
        assert all(e.messages[-1]["content"].startswith(opening) for e in rows[f"compare: {template}"])


def test_fresh_out_of_range_prompts_are_new_to_the_corpus():
    """The run-time set shares no prompt with the corpus, and covers every family that takes a number or word."""
    corpus = {e.key for items in training_pool().values() for e in items}
    fresh = fresh_out_of_range(40)
    assert len({e.key for e in fresh}) == 40 and not corpus & {e.key for e in fresh}


def test_the_fresh_row_draws_once_per_seed_it_is_given():
    """`eval_tiny_model.py --fresh-seeds 6-15`: the card's count on prompts no run was chosen by is ten draws of 40
    with seeds the test never uses; the default stays the test's own draw."""
    assert seed_range("6-15") == range(6, 16) and seed_range("7") == range(7, 8)
    with pytest.raises(argparse.ArgumentTypeError, match="not a seed"):
        seed_range("six")
    assert evaluation_rows(40)["out of range (fresh)"] == fresh_out_of_range(40)
    drawn = evaluation_rows(40, 20, fresh_seeds=range(6, 8))["out of range (fresh)"]
    assert drawn == fresh_out_of_range(20, seed=6) + fresh_out_of_range(20, seed=7)
    assert {e.key for e in drawn[:20]} != {e.key for e in drawn[20:]}


def test_single_digit_differences_below_zero_are_answered_not_out_of_range():
    """`2 - 8` is arithmetic (`-6`): trained as out of range it taught the model subtraction as the help answer's
    task. The run-time out-of-range set holds no prompt on two single-digit numbers either."""
    corpus = [e for items in training_pool().values() for e in items] + heldout_examples(100_000)
    answers = {e.messages[-1]["content"]: (e.family, e.answer) for e in corpus}
    assert answers["What is 2 minus 8?"] == ("arithmetic", "-6")
    assert answers["What is eight minus two?"] == ("arithmetic", "6")
    two_single_digits = re.compile(r"\D*\b\d\b\D*\b\d\b\D*")
    assert not [e for e in fresh_out_of_range(40) if two_single_digits.fullmatch(e.messages[-1]["content"])]


TASK_WORDS = {*WORDS, *NAMES, *NUMBER_WORDS, *(w.capitalize() for w in NUMBER_WORDS), *(a for *_, a in FACTS)}


def split_words(words, encode) -> list[str]:
    """The words that `encode` splits in pieces, alone or after a space."""
    return [w for w in sorted(words) for text in (w, " " + w) if len(encode(text)) != 1]


def test_every_task_word_is_one_token(engine):
    """Spelling and copying are learned per token: a word split in pieces could not be spelled."""
    assert not split_words(TASK_WORDS | set(ADJECTIVES), engine.tokenizer.encode_text)


@pytest.fixture(scope="module")
def corpus_tokenizer():
    """The tokenizer a training run builds from the corpus (2 seconds), checked before a 29-minute run."""
    return build_tokenizer()


def test_the_tokenizer_built_from_the_corpus_keeps_every_task_word_one_token(corpus_tokenizer):
    """More rows of other words (run X) took the merges that made `Madrid` and `Seven` one token, and the
    capitals' answers fell from 100% to 56%."""
    assert not split_words(TASK_WORDS | set(ADJECTIVES), lambda text: corpus_tokenizer.encode(text).ids)


def test_every_token_of_a_heldout_prompt_is_one_that_training_rows_show(corpus_tokenizer):
    """A token no training row holds keeps its initial embedding, so the model cannot read it: with held-out
    prompts in the tokenizer's text, `spelled`, `My` and `"?` were such tokens, and runs answered
    `How is brown spelled?` with `brown brown` and `Hi! My name is Emma.` with a greeting."""

    def ids(text: str) -> set[int]:
        return set(corpus_tokenizer.encode(text).ids)

    trained: set[int] = set()
    for text in training_texts():  # as written, and after an opening as a varied row can be ("OK, what is ...")
        trained |= ids(text) | ids(NEUTRAL_OPENINGS[0] + lower_first(text))
    heldout = heldout_examples(100_000)
    texts = [m["content"] for e in heldout for m in e.messages] + [e.answer for e in heldout] + heldout_system_prompts()
    unseen = {corpus_tokenizer.id_to_token(i): text for text in texts for i in ids(text) - trained}
    assert not unseen


@pytest.mark.slow  # a subprocess builds the tokenizer, about 10 s
def test_stage_1s_corpus_is_this_one_without_its_stage_2_rows_and_builds_the_shipped_tokenizer(tmp_path):
    """`TINY_CHAT_CORPUS_STAGE=1`: the corpus stage 1 of the shipped weights trained on (at commit 3312607), which
    is what lets this commit retrain them; stage 2 keeps stage 1's tokenizer, so it must come out byte for byte."""
    script = (
        "import json, sys; from pathlib import Path; "
        "from scripts.tiny_chat_corpus import training_pool; "
        "from scripts.build_tiny_tokenizer import build_tokenizer, save_tokenizer; "
        "save_tokenizer(build_tokenizer(), Path(sys.argv[1])); "
        "print(json.dumps([e.key for items in training_pool().values() for e in items]))"
    )
    env = {**os.environ, "TINY_CHAT_CORPUS_STAGE": "1"}
    repo = EMBEDDED_MODEL_DIR.parents[1]
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], env=env, cwd=repo, capture_output=True, text=True, check=True
    )
    stage_1 = set(json.loads(done.stdout))
    stage_2 = {e.key for items in training_pool().values() for e in items}
    added = stage_2 - stage_1
    assert stage_1 < stage_2 and len(added) > 500
    # Stage 2 added the `Who ...?` help prompts and differences of a two-digit number and a digit.
    difference = re.compile(r"(?=.*\b\d{2}\b)(?=.*\b\d\b)")
    assert all(key.lower().startswith("user: who") or difference.match(key) for key in added)
    shipped = (EMBEDDED_MODEL_DIR / "tokenizer.json").read_bytes()
    assert (tmp_path / "tokenizer.json").read_bytes() == shipped


def test_heldout_system_prompts_never_in_training():
    assert heldout_system_prompts() and not set(heldout_system_prompts()) & set(training_system_prompts())
    assert ASSISTANT["content"] in training_system_prompts()  # what front-ends send is trained on


def test_heldout_prompts_never_in_training_split():
    train_keys = {e.key for items in training_pool().values() for e in items}
    heldout = heldout_examples(100_000, families=tuple(FAMILIES))
    assert len(heldout) >= 350
    assert {e.family for e in heldout} == set(FAMILIES)
    assert not train_keys & {e.key for e in heldout}
    assert not any(e.heldout_phrasing for items in training_pool().values() for e in items)


def test_heldout_phrasings_are_new_sentences():
    """A held-out phrasing is a new sentence, not a training one with other punctuation or case."""

    def norm(t: str) -> str:
        return t.lower().strip(".?! ")

    for trained, heldout in PHRASINGS:
        assert heldout and not {norm(t) for t in heldout} & {norm(t) for t in trained}


def test_training_prompts_are_varied_but_never_into_a_heldout_prompt():
    """The trainer varies each prompt's surface as it draws it (scripts/tiny_chat_corpus.py `vary_phrasing`);
    a variation must never be a held-out prompt, or the held-out phrasings would be trained on."""
    heldout = {normalized_prompt(m["content"]) for e in heldout_examples(100_000) for m in e.messages}
    rng = random.Random(0)
    prompts = [e.messages[-1]["content"] for f in TASK_FAMILIES for e in training_pool()[f][:400]]
    varied = [(p, vary_phrasing(p, rng)) for p in prompts for _ in range(4)]
    changed = [(p, v) for p, v in varied if v != p]
    assert len(changed) >= len(varied) // 3
    assert not [v for _, v in changed if normalized_prompt(v) in heldout]


def test_no_training_prompt_takes_the_shape_of_a_heldout_phrasing():
    """Nor with other numbers or words: an out-of-range row varied into `Can you subtract 8 from 2?` taught the
    model that phrasing as the help answer's, and held-out `Can you subtract 2 from 9?` got the help answer."""
    shape = heldout_phrasing_shapes()
    assert all(shape.fullmatch(normalized_prompt(p)) for p in ("Can you subtract 8 from 2?", "Tell me 1 minus 9."))
    assert not shape.fullmatch(normalized_prompt("Spell dog."))  # `Please spell {w}.` is a trained phrasing's shape
    rng = random.Random(0)
    prompts = [
        e.messages[-1]["content"] for items in training_pool().values() for e in items[:: max(1, len(items) // 400)]
    ]
    varied = [vary_phrasing(p, rng, synonyms) for p in prompts for synonyms in (0.0, 0.5) for _ in range(4)]
    assert not [v for v in varied if shape.fullmatch(normalized_prompt(v))]
    numbered = [
        e for e in heldout_examples(400, phrasing="heldout") if e.family in ("arithmetic", "compare", "successor")
    ]
    assert all(shape.fullmatch(normalized_prompt(e.messages[-1]["content"])) for e in numbered)


def test_a_comparison_word_is_swapped_for_every_other_word_of_its_meaning_and_never_for_the_opposite():
    """`--synonyms` lets `greatest` meet the frames that `largest` and `biggest` are trained in: CF1, trained
    without it, answered 18 of the 120 held-out `What is the greatest of {a}, {b}, {c}?` prompts right, most
    with the least of the three. A swap into the opposite meaning would train a wrong answer."""
    rng = random.Random(0)
    meaning = {w: i for i, group in enumerate(COMPARISON_SYNONYMS) for w in group}
    for template in LARGER[0] + SMALLER[0]:
        words = [w for w in re.findall(r"[a-z]+", template.lower()) if w in meaning]
        if not words:
            continue
        group = COMPARISON_SYNONYMS[meaning[words[0]]]
        swapped = {swap_comparison_word(template, rng) for _ in range(60)}
        new_words = {w for text in swapped for w in re.findall(r"[a-z]+", text.lower()) if w in meaning}
        assert new_words == set(group) - set(words), template


def test_the_trainers_mask_ratios_span_every_slice_of_the_range_in_each_batch():
    import torch

    from scripts.train_tiny_model import stratified_ratios

    ratios = stratified_ratios(32, torch.Generator().manual_seed(0))
    assert sorted((ratios * 32).floor().int().tolist()) == list(range(32))  # one in each 1/32 of [0, 1)
    assert ratios.tolist() != sorted(ratios.tolist())  # in random order, not by row


@pytest.mark.parametrize(("long_share", "long_batches_left"), [(0.0, {0}), (0.5, {4, 5}), (1.0, {9})])
def test_the_trainers_long_share_sets_how_many_batches_get_long_canvases(long_share, long_batches_left):
    """`--long-share`: of each refill of GROUP (10) batches, that share has canvases past SHORT_CANVAS; one batch
    of the refill is drawn, the other nine are counted."""
    from engine.tokenizer import ChatTokenizer
    from scripts.train_tiny_model import SHORT_CANVAS, Batcher

    tok = ChatTokenizer.from_pretrained(EMBEDDED_MODEL_DIR)
    batcher = Batcher(tok, random.Random(0), seed=0, batch=4, long_share=long_share)
    batcher.draw()
    long = [all(len(response) > SHORT_CANVAS for _, response, _ in batch) for batch in batcher.queue]
    assert len(long) == 9 and sum(long) in long_batches_left


@pytest.mark.parametrize("long_canvas", [128, 160])
def test_the_trainers_long_canvas_sets_the_longest_canvas_a_long_row_draws(long_canvas):
    """`--long-canvas`: long rows' canvases (answer, end of turn and padding) run from past SHORT_CANVAS up to
    it, and reach it."""
    from engine.tokenizer import ChatTokenizer
    from scripts.train_tiny_model import SHORT_CANVAS, Batcher

    tok = ChatTokenizer.from_pretrained(EMBEDDED_MODEL_DIR)
    batcher = Batcher(tok, random.Random(0), seed=0, batch=4, long_canvas=long_canvas)
    canvases = [len(batcher._row(long=True)[1]) for _ in range(1000)]
    assert min(canvases) > SHORT_CANVAS and max(canvases) == long_canvas


# A family's rows told apart by their answers, and its share of short rows: 3.25 (help too) and 1 of the weights' 20.75.
FACTOR_FAMILIES = [
    ("out_of_range", lambda answer: answer == HELP_ANSWER, (0.1, 0.25)),
    ("count", lambda answer: re.fullmatch(r"\d( \d)+", answer) is not None, (0.02, 0.1)),  # only count lists numbers
]


@pytest.mark.parametrize(("family", "is_family", "short_share"), FACTOR_FAMILIES)
@pytest.mark.parametrize(
    ("knob", "factor", "more_in_short_rows", "more_in_long_rows"),
    [("long_factors", 1.0, False, False), ("long_factors", 20.0, False, True), ("factors", 20.0, True, True)],
)
def test_the_trainers_family_factors_weigh_a_family_in_the_batches_they_name(
    family, is_family, short_share, knob, factor, more_in_short_rows, more_in_long_rows
):
    """`--long-out-of-range`, `--long-count` (`long_factors`): the family is drawn more often in long-canvas rows,
    and as before in short ones; `--family-factor` (`factors`): more often in both."""
    from engine.tokenizer import ChatTokenizer
    from scripts.train_tiny_model import Batcher

    tok = ChatTokenizer.from_pretrained(EMBEDDED_MODEL_DIR)
    batcher = Batcher(tok, random.Random(0), seed=0, batch=4, **{knob: {family: factor}})

    def share(long: bool) -> float:
        rows = [batcher._row(long) for _ in range(600)]
        return sum(is_family(tok.decode(response[: n_real - 1])) for _, response, n_real in rows) / len(rows)

    short, long = share(False), share(True)
    assert (short > 2 * short_share[1]) == more_in_short_rows
    assert (long > 2 * short_share[1]) == more_in_long_rows
    if not more_in_short_rows:
        assert short_share[0] < short < short_share[1]


def test_the_trainers_family_factor_flag_names_a_family_it_knows():
    from scripts.train_tiny_model import family_factor

    assert family_factor("sentence=3") == ("sentence", 3.0)
    with pytest.raises(argparse.ArgumentTypeError, match="unknown family 'sentences'"):
        family_factor("sentences=3")


def test_the_trainers_synonyms_flag_swaps_comparison_words_in_the_prompts_it_draws():
    """`--synonyms`: `highest` is in no template, so only a swap puts it in a training prompt."""
    from engine.tokenizer import ChatTokenizer
    from scripts.train_tiny_model import Batcher

    tok = ChatTokenizer.from_pretrained(EMBEDDED_MODEL_DIR)
    compare = [e for e in training_pool()["compare"] if "largest" in e.messages[-1]["content"]][:200]
    for synonyms, swapped in ((0.0, False), (1.0, True)):
        batcher = Batcher(tok, random.Random(0), seed=0, batch=4, synonyms=synonyms)
        prompts = [batcher._varied(e)[-1]["content"] for e in compare]
        assert any("highest" in p for p in prompts) == swapped


def test_the_trainers_step_skips_the_pads_and_takes_the_same_step_as_on_the_padded_batch():
    """`train_step(skip_pads=True)`, the trainer's: the same loss and the same gradients as the padded batch."""
    import torch

    from engine.loading import load_model
    from engine.tokenizer import ChatTokenizer
    from scripts.train_tiny_model import Batcher, optimizer, train_step

    tok = ChatTokenizer.from_pretrained(EMBEDDED_MODEL_DIR)
    batch = Batcher(tok, random.Random(0), seed=0, batch=8, long_share=1.0).draw()
    assert batch[1] is not None and not batch[1].all()  # rows of several lengths: pads to skip
    steps = {}
    for skip_pads in (False, True):
        model = load_model(EMBEDDED_MODEL_DIR, "cpu").requires_grad_(True).train()
        opt = optimizer(model, fused=False)
        opt.param_groups[0]["lr"] = opt.param_groups[1]["lr"] = 0.0  # keep the weights: compare the gradients
        loss = train_step(model, model, opt, batch, skip_pads=skip_pads)
        steps[skip_pads] = loss, {name: p.grad for name, p in model.named_parameters()}
    (padded_loss, padded_grads), (loss, grads) = steps[False], steps[True]
    assert loss == pytest.approx(padded_loss, abs=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, padded_grads[name], atol=1e-6, rtol=1e-4, msg=name)


def test_the_trainers_weight_decay_shrinks_the_matrices_only_by_the_rate_it_is_given():
    """`optimizer(weight_decay=w)` (`--weight-decay`): a step with zero gradients multiplies every matrix by
    1 - lr * w and leaves the vectors (norm scales) as they were."""
    import torch

    from engine.loading import load_model
    from scripts.train_tiny_model import optimizer

    model = load_model(EMBEDDED_MODEL_DIR, "cpu").requires_grad_(True)
    assert any(p.dim() < 2 for p in model.parameters())  # the model has norm scales: the check below covers them
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    opt = optimizer(model, fused=False, weight_decay=0.3)
    for group in opt.param_groups:
        group["lr"] = 0.5
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for name, p in model.named_parameters():
        shrink = 1 - 0.5 * 0.3 if p.dim() == 2 else 1.0
        torch.testing.assert_close(p.detach(), before[name] * shrink, msg=name)


def test_the_weight_average_follows_the_trained_weights_with_a_ramped_decay_and_replaces_only_the_parameters():
    """`WeightAverage` (`--average`): after each step avg <- d * avg + (1 - d) * weights, d = min(decay, (1 + t) /
    (10 + t)); its state dict is the model's with the averaged parameters in place of the trained ones."""
    import torch

    from engine.loading import load_model
    from scripts.train_tiny_model import WeightAverage

    model = load_model(EMBEDDED_MODEL_DIR, "cpu")
    weight = dict(model.named_parameters())["model.transformer.wte.weight"]
    start = weight.detach().clone()
    average = WeightAverage(model, decay=0.2)  # the ramp for the first step, 0.2 from the second on
    expected = start.clone()
    for t, shift in enumerate((1.0, 3.0, -2.0), start=1):
        with torch.no_grad():
            weight.add_(shift)
        average.update()
        decay = min(0.2, (1 + t) / (10 + t))
        expected = decay * expected + (1 - decay) * weight.detach()
    state = average.state_dict(model)
    torch.testing.assert_close(state["model.transformer.wte.weight"], expected)
    assert not torch.equal(state["model.transformer.wte.weight"], weight.detach())
    assert state.keys() == model.state_dict().keys()


def test_visible_padding_rows_unmask_everything_from_a_point_past_the_answer_and_keep_the_rest():
    import torch

    from scripts.train_tiny_model import with_visible_padding

    generator = torch.Generator().manual_seed(0)
    rows, width = 40, 80
    ends = [20 + (row % 7) * 5 for row in range(rows)]  # the first column after each row's end of turn
    random_masks = torch.rand(rows, width, generator=generator) < 0.7
    for row, end in enumerate(ends):
        random_masks[row, : end - 1] = True  # the answer all masked, as the sampler's first steps see it
    chosen = list(range(0, rows, 2))
    masked = with_visible_padding(random_masks.clone(), ends, torch.tensor(chosen), generator)
    tails = []
    for row, end in enumerate(ends):
        if row not in chosen:
            assert torch.equal(masked[row], random_masks[row])
            continue
        cut = width - int(masked[row].flip(0).cumsum(0).eq(0).sum())  # where the visible tail begins
        assert cut >= end - 1 and not masked[row, cut:].any()  # never before the end-of-turn token
        assert torch.equal(masked[row, :cut], random_masks[row, :cut])
        tails.append(width - cut)
    # Long visible tails of varied lengths: under the random masks alone a tail is under one column on average.
    assert len(set(tails)) > 5 and sum(tails) / len(tails) > 10


def test_block_state_rows_show_a_visible_answer_start_one_partly_masked_block_and_an_untrained_masked_tail():
    import torch

    from scripts.train_tiny_model import BLOCK_STATE_LENGTHS, as_block_states

    generator = torch.Generator().manual_seed(0)
    rows, width = 40, 80
    starts = [10 + (row % 5) * 12 for row in range(rows)]  # where each row's answer begins
    random_masks = torch.rand(rows, width, generator=generator) < 0.5
    for row, start in enumerate(starts):
        random_masks[row, :start] = False  # the prompt's columns are never masked
    chosen = list(range(0, rows, 2))
    states, trained = as_block_states(random_masks.clone(), starts, torch.tensor(chosen), generator)

    def block_state(row: int, first: int, block: int) -> bool:
        before, inside, after = states[row, :first], states[row, first : first + block], states[row, first + block :]
        return not before.any() and torch.equal(inside, random_masks[row, first : first + block]) and after.all()

    shapes = set()
    for row, start in enumerate(starts):
        if row not in chosen:
            assert torch.equal(states[row], random_masks[row]) and torch.equal(trained[row], states[row])
            continue
        found = [(first - start, block) for block in BLOCK_STATE_LENGTHS for first in range(start, width, block)
                 if block_state(row, first, block)]  # fmt: skip
        assert found, row  # some block, aligned to the answer's start, with everything before visible
        (offset, block), *_ = found
        in_block = torch.zeros(width, dtype=torch.bool)
        in_block[start + offset : start + offset + block] = True
        assert torch.equal(trained[row], states[row] & in_block)  # the loss counts the block, not the tail
        shapes.update(found)
    assert len({block for _, block in shapes}) > 1 and len({offset for offset, _ in shapes}) > 1  # drawn, not fixed


def test_heldout_list_is_deterministic():
    assert [e.key for e in heldout_examples(50)] == [e.key for e in heldout_examples(50)]
