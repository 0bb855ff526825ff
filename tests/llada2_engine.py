"""An engine on the llada2-tiny checkpoint, which has no tokenizer (its prompts are token ids).

The engine needs a tokenizer only for the mask id, the stop tokens and decoding. `TokenIdText` decodes each id
to its own short text, so that streamed deltas can be checked token by token; nothing else is stood in for.
"""

from __future__ import annotations

import torch

from engine import DiffusionEngine, SchedulerConfig
from engine.loading import load_model
from tests.fixture_paths import LLADA2_FIXTURE_DIR

EOS, MASK = 508, 511


class TokenIdText:
    """What the engine reads of a tokenizer, for a checkpoint without one: ids as text, "<17><3>…"."""

    mask_id = MASK
    eos_id = EOS
    stop_ids = frozenset({EOS})  # the official generate() stops at eos_id alone
    max_chars_per_token = None

    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)


def llada2_model():
    return load_model(LLADA2_FIXTURE_DIR, "cpu", torch.float32)


def llada2_engine(model=None, scheduler_config: SchedulerConfig | None = None) -> DiffusionEngine:
    config = scheduler_config or SchedulerConfig()
    return DiffusionEngine(model or llada2_model(), TokenIdText(), torch.device("cpu"), "llada2-tiny", config)
