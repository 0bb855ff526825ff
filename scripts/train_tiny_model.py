"""Train the embedded default model (models/tiny-llada-chat) from scratch on 2 CPU cores.

Objective: LLaDA's SFT recipe. The prompt stays clean; the response is the answer, `<|eot_id|>`, then
`<|endoftext|>` padding up to a canvas length drawn per row; every response token is replaced by the mask
id with probability t ~ U(eps, 1) (one t per row), and the loss is cross-entropy on masked positions only.
Weighting (the calibration run's choice, see models/tiny-llada-chat/README.md): no 1/t factor, weight 1.0
on answer and end-of-turn, 0.5 on the EOS padding, normalised by the total weight of the batch.

The budget is either wall clock (`--minutes`: the learning-rate schedule runs on elapsed time, so a slower
CPU gets fewer steps but a complete schedule) or a step count (`--steps`: the same model whatever else runs
on the machine, which is what a shared machine needs). `--init DIR` continues from that directory's
weights and tokenizer (e.g. a shorter second run at a lower `--lr`). `--checkpoint-every N` also keeps
the weights of every N-th step as step-N.safetensors next to model.safetensors. The forward is compiled
(inductor) unless `--eager`: the same maths, a faster step, so more steps in the same minutes. `--average D`
ships an exponential moving average of the weights (decay D) and keeps the last step's as
last-step.safetensors. The shipped weights' stage 1 trained on the corpus without its stage-2 rows:
`TINY_CHAT_CORPUS_STAGE=1` in the environment selects it (scripts/tiny_chat_corpus.py). A run ends by scoring
400 held-out phrasings at gen 32 (one block, as the probe) and at the default request (gen 128 in the declared
blocks of 8, what the server decodes a request that sets nothing with); the long canvas is where runs differ most.

Usage: [TINY_CHAT_CORPUS_STAGE=1] python scripts/train_tiny_model.py [--minutes 29 | --steps 6000]
       [--out models/tiny-llada-chat] [--seed 0] [--init DIR] [--lr 2.1e-3] [--batch 32] [--block-states 0.25]
       [--long-share 0.2] [--long-canvas 128] [--visible-padding 0] [--synonyms 0] [--long-out-of-range 1]
       [--long-count 1] [--family-factor FAMILY=1 ...] [--weight-decay 0.1] [--average 0] [--checkpoint-every 500]
       [--eager]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path

# OpenMP threads that spin while waiting made steps 10-50x slower whenever another process shared the two
# cores; passive waiting costs little on an idle machine. Must be set before torch starts its thread pool.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

if __package__ in (None, ""):  # run as a script: make `scripts` and `engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import DiffusionEngine, SamplingParams
from engine.config import LLaDAConfig
from engine.model import LLaDAModelLM, LogitIndex, RealTokens
from engine.tokenizer import ChatTokenizer
from scripts.build_tiny_tokenizer import EOS, MASK, build_tokenizer, save_tokenizer, special_ids
from scripts.eval_tiny_model import run as run_heldout
from scripts.tiny_chat_corpus import (
    FAMILY_WEIGHTS,
    Example,
    heldout_examples,
    training_pool,
    training_system_prompts,
    vary_phrasing,
)

ARCH = dict(d_model=128, n_heads=4, n_kv_heads=4, n_layers=4, mlp_hidden_size=384)
# 32 rows a step: in the same 29 minutes here (4 December, compiled step) batch 64 ran 5,047 steps and got 66.2%
# of the held-out phrasings right, batch 32 7,963 steps and 78.0%, batch 16 14,938 steps and 58.5%
# (docs/embedded-model-runs.md): more, noisier updates pay off down to 32.
BATCH = 32
# Peak learning rate 2.1e-3: 3e-3 was set when a step had 64 rows; with 32, scaled by sqrt(1/2), the same
# 12,600 steps got 98.8% of the held-out phrasings right against 84.8-88.5% for three seeds at 3e-3.
LR, LR_FLOOR, WARMUP_STEPS = 2.1e-3, 0.05, 100
# Decoupled weight decay on matrices. 0.01 let the model memorise each phrasing separately (train loss 0.002,
# held-out arithmetic 53%); stronger decay favours one shared rule per operation.
# 0.3 lifted stage 1 on two seeds (89.2% -> 99.0%, 95.8% -> 99.5%; the card, 6 December, night); not the default
# yet because no continuation of those runs meets every target.
WEIGHT_DECAY = 0.1
EPS = 1e-3  # minimum mask ratio, as in LLaDA
# The longest trained canvas is where a run is weakest: CZ6, trained up to 128, invents out-of-range answers to 3-4
# of 240 prompts at canvases 32-120, 10 at 128 and 26 at 160. `--long-canvas 160` puts the default request's 128
# inside the range: it helped in stage 2, and in stage 1 (one draw) cost a held-out phrasing
# (docs/embedded-model-runs.md, 7 December); the shipped weights used 128 in stages 1 and 2, 160 in stage 3.
SHORT_CANVAS, LONG_CANVAS = 40, 128
LONG_SHARE = 0.2  # share of batches whose rows all get long canvases (41..LONG_CANVAS)
# Share of rows whose end-of-text padding is visible from a random point past the answer on (see
# `with_visible_padding`). 0 draws none (runs up to CF1).
VISIBLE_PADDING_SHARE = 0.0
# Chance that a varied training prompt has a comparison word swapped for a synonym (`vary_phrasing`'s
# `synonyms`). 0 swaps none (runs up to CF1).
SYNONYM_SHARE = 0.0
# Factor on the out-of-range family's weight in long-canvas batches only (`--long-out-of-range`): the default
# 128-token canvas is where made-up answers came from, and only a fifth of the batches train canvases that long.
# With 6 a continuation gave the help answer to 90.5% of the held-out out-of-range prompts there against 77.4%
# (CZ6 and CY1, docs/embedded-model-runs.md). 1 leaves the draw unchanged (runs up to CF1).
LONG_OUT_OF_RANGE = 1.0
# The same for the count family (`--long-count`), made for W1's two held-out count phrasings missed at the
# 128-token canvas. A rerun of W1's stage 1 no longer missed them, and 3 on it gained little (every raw prompt
# right, 99.8% against 99.2% at the default request: C3 and X3r, docs/embedded-model-runs.md). 1 leaves the
# draw unchanged.
LONG_COUNT = 1.0
GROUP = 10  # batches drawn (and length-sorted) together
SYSTEM_PROMPT_SHARE = 0.5  # rows with a system prompt: most chat front-ends send one
# Rows after an earlier exchange (the answer is to the last user turn), and single-turn rows as a raw prompt
# with no chat template (what /v1/completions sends). At 0.15 each a run answered 84% of raw prompts and 70% of
# chat-client conversations; at 0.25, 90% and 88% (runs N and O, docs/embedded-model-runs.md).
EARLIER_TURN_SHARE = 0.25
RAW_SHARE = 0.25
USER_X = {"role": "user", "content": "x"}
EOS_PAD_WEIGHT = 0.5
# The block length the model declares (generation_config.json), which a request that sets none is decoded with.
# One block of 128 positions answered the newcomer prompts wrong where blocks of 32 answered them right; in
# blocks of 32 the sampler still commits the end-of-text padding first (it is surest of it), and a committed
# run of padding can pull the end of turn into the answer (`Hello` -> `11`). Blocks of 8 leave the padding to
# the blocks after the answer: CF1 invented 1 of 40 out-of-range answers at the default request instead of
# 4, with half the forward passes (docs/embedded-model-runs.md, benchmarks/declared_block.py).
DECODE_BLOCK_LENGTH = 8
BLOCK_STATE_LENGTHS = (8, 16, 32)  # the blocks of `as_block_states` (--block-states)
# Share of rows masked as a decoding block's state: without them answers came out garbled at canvases and
# blocks of 24-48 (runs L and M in docs/embedded-model-runs.md).
BLOCK_STATE_SHARE = 0.25
PROGRESS_EVERY_S, EVAL_EVERY_S = 30, 360
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def write_checkpoint(model: LLaDAModelLM, out: Path, name: str = "model.safetensors") -> None:
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / name), metadata={"format": "pt"})


class WeightAverage:
    """An exponential moving average of the model's parameters along training (Polyak averaging): the final
    weights are the average of the last ~1/(1 - decay) steps' instead of the last step's, which smooths out
    where the last noisy updates happened to leave them. The decay ramps up as (1 + t) / (10 + t) over the first
    steps, so the average does not hold on to the first steps' weights."""

    def __init__(self, model: LLaDAModelLM, decay: float):
        self.decay = decay
        self.steps = 0
        self.params = list(model.parameters())
        self.average = [p.detach().clone() for p in self.params]

    def update(self) -> None:
        self.steps += 1
        decay = min(self.decay, (1 + self.steps) / (10 + self.steps))
        with torch.no_grad():
            torch._foreach_lerp_(self.average, [p.detach() for p in self.params], 1 - decay)

    def state_dict(self, model: LLaDAModelLM) -> dict[str, torch.Tensor]:
        """The model's state dict with the averaged parameters in place of the trained ones."""
        averaged = {name: a for (name, _), a in zip(model.named_parameters(), self.average)}
        return {**model.state_dict(), **averaged}


def as_block_states(
    masked: torch.Tensor, answer_starts: list[int], rows: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked, trained): `masked` with each of `rows` turned into a state of semi-autoregressive decoding, a
    block of 8, 16 or 32 positions somewhere in the answer keeping its random masks, everything before it
    visible and everything after it masked; and the masked positions the loss counts, which in those rows are
    the block's only. Independent masking almost never shows these states (a visible answer start before a
    long masked tail), which the sampler meets at every block but the last when blocks are shorter than the
    canvas. The sampler commits nothing past the block, so the tail is hidden input, not a target: counted, its
    end-of-text padding is most of such a row's loss (run I in the model card, which counted it, lost 15 points)."""
    width = masked.shape[1]
    columns = torch.arange(width)
    trained = masked.clone()
    for row in rows.tolist():
        block = BLOCK_STATE_LENGTHS[int(torch.randint(len(BLOCK_STATE_LENGTHS), (1,), generator=generator))]
        start = answer_starts[row]
        n_blocks = -(-(width - start) // block)
        first = start + block * int(torch.randint(n_blocks, (1,), generator=generator))
        in_block = (columns >= first) & (columns < first + block)
        trained[row] = masked[row] & in_block
        masked[row] = trained[row] | (columns >= first + block)
    return masked, trained


def with_visible_padding(
    masked: torch.Tensor, answer_ends: list[int], rows: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """`masked` with each of `rows` unmasked from a random column on, no earlier than its end of turn: the
    state the sampler is in once it has committed the padding at the canvas's end, which it is most sure of,
    before the answer. Independent masking almost never shows a long visible padding with the answer still
    masked, and a small model that never saw it lets the committed padding pull the end of turn forward: a
    20-token answer gives way to a 7-token one (`Who are you?` answered `I am fine, thank you!` at canvas 32)."""
    width = masked.shape[1]
    for row in rows.tolist():
        first = answer_ends[row] - 1  # the end-of-turn token's column
        cut = first + int(torch.randint(width - first, (1,), generator=generator))
        masked[row, cut:] = False
    return masked


def stratified_ratios(rows: int, generator: torch.Generator) -> torch.Tensor:
    """One mask ratio per row, one drawn in each of `rows` equal slices of [0, 1), in random order: each is
    still uniform on [0, 1), but a batch always spans easy and hard rows alike, so the gradient's variance is
    lower than with independent draws and its expectation the same."""
    strata = torch.randperm(rows, generator=generator)
    return (strata + torch.rand(rows, generator=generator)) / rows


class Batcher:
    """Draws masked batches from the training pool, each conversation varied as it is drawn.

    Half of the rows get a system prompt and some an earlier exchange before their prompt, so that the task
    answers do not depend on either. Rows are left-padded (hidden by the attention mask, and RoPE only sees
    relative offsets, so a padded row computes what it would alone). Canvas lengths are drawn per row; a
    batch is either all-short or all-long canvases so that padding stays small, while every prompt still
    meets every canvas length.
    """

    def __init__(
        self,
        tok: ChatTokenizer,
        rng: random.Random,
        seed: int,
        batch: int = BATCH,
        block_states: float = BLOCK_STATE_SHARE,
        long_share: float = LONG_SHARE,
        visible_padding: float = VISIBLE_PADDING_SHARE,
        synonyms: float = SYNONYM_SHARE,
        factors: dict[str, float] | None = None,
        long_factors: dict[str, float] | None = None,
        long_canvas: int = LONG_CANVAS,
    ):
        self.tok, self.rng, self.batch, self.block_states = tok, rng, batch, block_states
        self.long_share, self.visible_padding, self.synonyms = long_share, visible_padding, synonyms
        self.long_canvas = long_canvas
        self.gen = torch.Generator().manual_seed(seed)
        self.families = list(FAMILY_WEIGHTS)
        # Factors on the families' weights, family -> factor: `factors` in every batch (`--family-factor`),
        # `long_factors` on top of them in long-canvas batches only (`--long-out-of-range`, `--long-count`).
        factors, long_factors = factors or {}, long_factors or {}
        self.weights = [w * factors.get(f, 1.0) for f, w in FAMILY_WEIGHTS.items()]
        self.long_weights = [w * long_factors.get(f, 1.0) for f, w in zip(self.families, self.weights)]
        self.queue: list[list] = []
        self.pool = training_pool()
        self.answers: dict[str, list[int]] = {}
        self.earlier = [e for f, items in self.pool.items() if f != "name" for e in items]
        self.raw: dict[str, list[int]] = {}
        self.systems = [{"role": "system", "content": s} for s in training_system_prompts()]
        self.segments: dict[tuple[str, str], list[int]] = {}
        # A chat renders as BOS, one segment per message (its header, content and end of turn: the
        # template's special tokens separate them, so a message encodes the same wherever it stands),
        # then the assistant header. Encoding each message once makes varying conversations cheap.
        one, two = tok.encode_chat([USER_X]), tok.encode_chat([USER_X, USER_X])
        self.bos, self.header = one[:1], one[1 + len(two) - len(one) :]
        sample = [self.systems[0], *self.pool["name"][0].messages]
        assert self.encode(sample) == tok.encode_chat(sample), "the chat template no longer splits per message"

    def _segment(self, message: dict) -> list[int]:
        key = (message["role"], message["content"])
        if key not in self.segments:
            one = self.tok.encode_chat([message])
            self.segments[key] = one[1 : len(one) - len(self.header)]
        return self.segments[key]

    def encode(self, messages: list[dict]) -> list[int]:
        return self.bos + [i for m in messages for i in self._segment(m)] + self.header

    def _answer(self, example: Example) -> str:
        """One right answer: open requests have several equally likely ones, drawn per row."""
        return self.rng.choice(example.right_answers)

    def _varied(self, example: Example) -> list[dict]:
        """The example's messages with each user turn's surface varied (small talk has its own variants)."""
        if example.family == "small_talk":
            return example.messages
        return [
            {"role": "user", "content": vary_phrasing(m["content"], self.rng, self.synonyms)}
            if m["role"] == "user"
            else m
            for m in example.messages
        ]

    def _prompt(self, example: Example) -> list[int]:
        messages = self._varied(example)
        if len(messages) == 1 and self.rng.random() < RAW_SHARE:
            text = messages[0]["content"]
            if text not in self.raw:
                self.raw[text] = self.tok.encode_prompt(text)
            return self.raw[text]
        if example.family != "name" and self.rng.random() < EARLIER_TURN_SHARE:
            # The assistant turn is an answer the model itself gives: what a chat client sends back.
            earlier = self.rng.choice(self.earlier)
            messages = [*earlier.messages, {"role": "assistant", "content": self._answer(earlier)}, *messages]
        if self.rng.random() < SYSTEM_PROMPT_SHARE:
            messages = [self.rng.choice(self.systems), *messages]
        return self.encode(messages)

    def _row(self, long: bool):
        family = self.rng.choices(self.families, weights=self.long_weights if long else self.weights)[0]
        example = self.rng.choice(self.pool[family])
        text = self._answer(example)
        if text not in self.answers:
            self.answers[text] = self.tok.encode_text(text)
        prompt, answer = self._prompt(example), self.answers[text]
        low = max(len(answer) + 1, SHORT_CANVAS + 1) if long else len(answer) + 1
        canvas = self.rng.randint(low, self.long_canvas if long else max(low, SHORT_CANVAS))
        response = answer + [self.tok.eot_id] + [self.tok.eos_id] * (canvas - len(answer) - 1)
        return prompt, response, len(answer) + 1

    def draw(self):
        """One batch from a queue refilled GROUP batches at a time: the rows of a refill are sorted by length
        before being cut into batches, so a batch's rows have similar lengths (prompt lengths range from 20
        to 56 tokens: without this, half of a short batch's compute would go to padding)."""
        if not self.queue:
            n_long = round(GROUP * self.long_share)
            for long, n_batches in ((False, GROUP - n_long), (True, n_long)):
                drawn = (self._row(long) for _ in range(self.batch * n_batches))
                rows = sorted(drawn, key=lambda r: len(r[0]) + len(r[1]))
                self.queue += [rows[i : i + self.batch] for i in range(0, len(rows), self.batch)]
            self.rng.shuffle(self.queue)
        rows = self.queue.pop()
        width = max(len(p) + len(r) for p, r, _ in rows)
        ids = torch.full((len(rows), width), self.tok.eos_id, dtype=torch.long)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        in_response = torch.zeros((len(rows), width), dtype=torch.bool)
        weight = torch.zeros((len(rows), width))
        answer_starts, answer_ends = [], []
        for i, (prompt, response, n_real) in enumerate(rows):
            seq = prompt + response
            start = width - len(seq)
            ids[i, start:] = torch.tensor(seq)
            attn[i, start:] = 1
            r0 = start + len(prompt)
            answer_starts.append(r0)
            answer_ends.append(r0 + n_real)
            in_response[i, r0:] = True
            weight[i, r0:] = EOS_PAD_WEIGHT
            weight[i, r0 : r0 + n_real] = 1.0
        p_mask = (1 - EPS) * stratified_ratios(len(rows), self.gen).unsqueeze(1) + EPS
        masked = in_response & (torch.rand((len(rows), width), generator=self.gen) < p_mask)
        if self.visible_padding:  # checked first: a share of 0 draws nothing, so earlier runs stay reproducible
            chosen = (torch.rand(len(rows), generator=self.gen) < self.visible_padding).nonzero().squeeze(1)
            masked = with_visible_padding(masked, answer_ends, chosen, self.gen)
        trained = masked
        if self.block_states:
            chosen = (torch.rand(len(rows), generator=self.gen) < self.block_states).nonzero().squeeze(1)
            masked, trained = as_block_states(masked, answer_starts, chosen, self.gen)
        noisy = ids.masked_fill(masked, self.tok.mask_id)
        index = LogitIndex.from_mask(trained)
        return noisy, (attn if (attn == 0).any() else None), index, ids[trained], weight[trained]


def quick_eval(model, tok, examples, params: SamplingParams) -> tuple[float, float]:
    """Exact match and share ending in EOS/EOT, decoded by the engine's own sampler (temperature 0)."""
    engine = DiffusionEngine(model, tok, torch.device("cpu"), model_name="training checkpoint")
    model.eval()
    results = run_heldout(engine, examples, params, batch=32)
    model.train()
    hits = sum(e.is_right(r.text) for e, r in zip(examples, results))
    stops = sum(r.finish_reason == "stop" for r in results)
    return hits / len(examples), stops / len(examples)


def one_block(gen_length: int, steps: int) -> SamplingParams:
    """The probe's decoding: the whole canvas as one block, fast enough to run during training."""
    return SamplingParams(gen_length=gen_length, num_denoising_steps=steps)


def model_config(hf_tok) -> LLaDAConfig:
    """The trained model's config, with the block length it declares (written to generation_config.json, not
    config.json), so that an engine on the model in memory decodes a request as the server will."""
    ids = special_ids(hf_tok)
    vocab_rows = -(-hf_tok.get_vocab_size() // 64) * 64  # embedding rows padded to a multiple of 64
    return LLaDAConfig(
        **ARCH,
        vocab_size=vocab_rows,
        max_sequence_length=512,
        mask_token_id=ids[MASK],
        eos_token_id=ids[EOS],
        pad_token_id=ids[EOS],
        block_length=DECODE_BLOCK_LENGTH,
    )


def init_weights(model: LLaDAModelLM) -> None:
    """GPT-2 style: N(0, 0.02), residual output projections scaled down by sqrt(2 * layers)."""
    depth_scale = math.sqrt(2 * model.config.n_layers)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            residual_out = ".blocks." in name and name.endswith(("attn_out.weight", "ff_out.weight"))
            torch.nn.init.normal_(p, std=0.02 / depth_scale if residual_out else 0.02)


def compiled_for_training(model: LLaDAModelLM):
    """The model's forward compiled by inductor for every batch width (one dynamic graph per attention-mask
    case). Fusing the norms, rotary products and activations makes a step 1.25x faster at batch 32 here
    (benchmarks/train_step.py); the compile (1-2 minutes cold, 20 s with the on-disk cache) is inside the budget.
    The rotary table is built first and long enough for any row: a graph traced while it is missing or short
    builds it as a side effect and recompiles at the next call."""
    model.rotary.get(model.config.max_sequence_length, next(model.parameters()).device)
    return torch.compile(model, dynamic=True)


def optimizer(model: LLaDAModelLM, fused: bool = True, weight_decay: float = WEIGHT_DECAY) -> torch.optim.AdamW:
    """AdamW with weight decay (`--weight-decay`) on the matrices only. Fused: the same update in fused kernels
    instead of a chain of foreach ops; the optimiser step 18.6 -> 4.9 ms of a ~140 ms step here
    (benchmarks/train_step.py)."""
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.98), fused=fused)


def train_step(forward, model: LLaDAModelLM, opt: torch.optim.Optimizer, batch, skip_pads: bool = True) -> float:
    """One optimiser step on a `Batcher.draw()` batch (`forward`: the model or its compiled form); its loss.
    `skip_pads`: run the per-token work on the batch's real positions only (`RealTokens`), the same maths as
    on the padded batch (a sixth of a batch's positions are padding) in fewer operations."""
    noisy, attn, index, targets, weight = batch
    real = RealTokens.from_mask(attn) if skip_pads and attn is not None else None
    logits = forward(noisy, attn, logit_index=index, real_tokens=real)
    ce = F.cross_entropy(logits.float(), targets, reduction="none")
    loss = (ce * weight).sum() / weight.sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def family_factor(text: str) -> tuple[str, float]:
    """`--family-factor sentence=3` -> ("sentence", 3.0); an unknown family is an error, not a no-op."""
    family, _, factor = text.partition("=")
    if family not in FAMILY_WEIGHTS:
        raise argparse.ArgumentTypeError(f"unknown family {family!r}: one of {', '.join(FAMILY_WEIGHTS)}")
    return family, float(factor)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=29.0, help="wall-clock training budget")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "models" / "tiny-llada-chat")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help="step budget (instead of --minutes)")
    ap.add_argument("--init", type=Path, default=None, help="continue from this model directory")
    ap.add_argument("--lr", type=float, default=LR, help="peak learning rate")
    ap.add_argument("--checkpoint-every", type=int, default=0, help="also keep step-N.safetensors every N steps")
    ap.add_argument("--eval-every-s", type=float, default=EVAL_EVERY_S, help="probe evaluation period (0: never)")
    ap.add_argument("--batch", type=int, default=BATCH, help="rows per step")
    ap.add_argument("--eager", action="store_true", help="do not compile the training forward (slower, same maths)")
    ap.add_argument(
        "--block-states", type=float, default=BLOCK_STATE_SHARE, help="share of rows masked as a decoding block's state"
    )
    ap.add_argument("--long-share", type=float, default=LONG_SHARE, help="share of batches with canvases past 40")
    ap.add_argument(
        "--visible-padding",
        type=float,
        default=VISIBLE_PADDING_SHARE,
        help="share of rows whose padding is visible from a random point past the answer",
    )
    ap.add_argument(
        "--synonyms", type=float, default=SYNONYM_SHARE, help="chance a varied prompt swaps a comparison word"
    )
    ap.add_argument(
        "--long-out-of-range",
        type=float,
        default=LONG_OUT_OF_RANGE,
        help="factor on the out-of-range family's weight in long-canvas batches",
    )
    ap.add_argument(
        "--long-count", type=float, default=LONG_COUNT, help="factor on the count family weight in long-canvas batches"
    )
    ap.add_argument(
        "--family-factor",
        type=family_factor,
        action="append",
        default=[],
        metavar="FAMILY=F",
        help="factor on a family's weight in every batch (repeatable)",
    )
    ap.add_argument("--long-canvas", type=int, default=LONG_CANVAS, help="longest canvas a long-canvas row draws")
    ap.add_argument("--weight-decay", type=float, default=WEIGHT_DECAY, help="decoupled weight decay on the matrices")
    ap.add_argument(
        "--average",
        type=float,
        default=0.0,
        help="keep an exponential moving average of the weights with this decay and ship it (0: the last step's)",
    )
    args = ap.parse_args()

    torch.set_num_threads(2)
    # Tiny gradients underflow to denormals early on; without this some steps took 20x longer on this CPU.
    torch.set_flush_denormal(True)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    # Tokenizer first: the config needs its special ids.
    if args.init is not None:  # the weights only make sense with their own tokenizer
        from tokenizers import Tokenizer

        for name in TOKENIZER_FILES:
            if args.init.resolve() != out.resolve():
                shutil.copy(args.init / name, out / name)
        hf_tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    else:
        hf_tok = build_tokenizer()
        save_tokenizer(hf_tok, out)
    config = model_config(hf_tok)
    (out / "config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    generation_file = out / "generation_config.json"  # where a checkpoint declares its block length
    generation = json.loads(generation_file.read_text())
    generation_file.write_text(json.dumps({**generation, "block_length": config.block_length}, indent=2) + "\n")
    tok = ChatTokenizer.from_pretrained(out, config)

    model = LLaDAModelLM(config)
    init_weights(model)
    if args.init is not None:
        model.load_state_dict(load_file(str(args.init / "model.safetensors")))
    model.train()
    forward = model if args.eager else compiled_for_training(model)
    opt = optimizer(model, weight_decay=args.weight_decay)
    average = WeightAverage(model, args.average) if args.average else None
    batcher = Batcher(
        tok,
        rng,
        args.seed,
        batch=args.batch,
        block_states=args.block_states,
        long_share=args.long_share,
        visible_padding=args.visible_padding,
        synonyms=args.synonyms,
        factors=dict(args.family_factor),
        long_factors={"out_of_range": args.long_out_of_range, "count": args.long_count},
        long_canvas=args.long_canvas,
    )
    probe = heldout_examples(120, phrasing="heldout")
    vocab = f"vocab {hf_tok.get_vocab_size()} (rows {config.vocab_size})"
    budget_text = f"{args.steps} steps" if args.steps else f"{args.minutes} min"
    print(f"params {model.num_parameters():,}  {vocab}  budget {budget_text}", flush=True)

    budget = args.minutes * 60
    start = time.time()
    last_print = last_eval = start
    step, running = 0, None
    while True:
        elapsed = time.time() - start
        progress = step / args.steps if args.steps else elapsed / budget
        if progress >= 1:
            break
        cosine = LR_FLOOR + (1 - LR_FLOOR) * 0.5 * (1 + math.cos(math.pi * progress))
        lr = args.lr * min(1.0, (step + 1) / WARMUP_STEPS) * cosine
        for group in opt.param_groups:
            group["lr"] = lr
        batch = batcher.draw()
        if batch[3].numel() == 0:  # no target: no position was masked, nothing to learn
            continue
        loss = train_step(forward, model, opt, batch)
        if average is not None:
            average.update()
        step += 1
        running = loss if running is None else 0.98 * running + 0.02 * loss
        now = time.time()
        if now - last_print >= PROGRESS_EVERY_S:
            rate = step / (now - start)
            print(
                f"{(now - start) / 60:5.1f} min  step {step:5d}  loss {running:.4f}  lr {lr:.2e}  {rate:.2f} steps/s",
                flush=True,
            )
            last_print = now
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            write_checkpoint(model, out, f"step-{step}.safetensors")
            write_checkpoint(model, out)
            print(f"  checkpoint step-{step} at {(now - start) / 60:.1f} min", flush=True)
        if args.eval_every_s and now - last_eval >= args.eval_every_s:
            acc, stop = quick_eval(model, tok, probe, one_block(32, 32))
            print(
                f"  probe eval (120 held-out phrasings, gen 32, 32 steps): right {acc:.1%}  stop {stop:.1%}", flush=True
            )
            write_checkpoint(model, out)
            last_eval = time.time()

    model.eval()
    if average is not None:  # the last step's weights stay beside the average for comparison
        write_checkpoint(model, out, "last-step.safetensors")
        model.load_state_dict(average.state_dict(model))
    write_checkpoint(model, out)
    minutes = (time.time() - start) / 60
    final = heldout_examples(400, phrasing="heldout")
    for steps in (32, 16):
        acc, stop = quick_eval(model, tok, final, one_block(32, steps))
        print(
            f"final eval (400 held-out phrasings, gen 32, {steps} steps): right {acc:.1%}  stop {stop:.1%}", flush=True
        )
    # The canvas a request that sets no max_tokens gets, where most misses of a run show and gen 32 hides them.
    served = SamplingParams.for_model(config.sampler_defaults, temperature=0.0)
    acc, stop = quick_eval(model, tok, final, served)
    print(
        f"final eval (400 held-out phrasings, the default request: gen {served.gen_length}, blocks of "
        f"{served.block_length}, {served.num_denoising_steps} steps): right {acc:.1%}  stop {stop:.1%}",
        flush=True,
    )
    print(f"done: {step} steps in {minutes:.1f} min -> {out}", flush=True)


if __name__ == "__main__":
    main()
