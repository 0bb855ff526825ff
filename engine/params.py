"""Per-request sampling parameters, with the names and defaults of ADR 005 (docs/adr/005-openai-compatible-api.md).

Every rule lives here, so the offline API and the HTTP layer reject the same things with the same words.
A violated rule raises `InvalidParameter` (a ValueError) that names the field, so the HTTP layer can
report it as `error.param`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace
from typing import Literal

from engine.errors import InvalidParameter

BlockSchedule = Literal["uniform", "front_loaded", "cosine", "dream"]
ConfidenceMetric = Literal["top1_prob", "entropy_inverse", "margin"]
KVCacheMode = Literal["none", "prefix", "dual"]

BLOCK_SCHEDULES = ("uniform", "front_loaded", "cosine", "dream")
CONFIDENCE_METRICS = ("top1_prob", "entropy_inverse", "margin")
KV_CACHE_MODES = ("none", "prefix", "dual")
DEFAULT_GEN_LENGTH = 128
DEFAULT_STEPS = 128
MAX_STEPS = 512
MAX_TEMPERATURE = 2.0
MAX_STOP_STRINGS = 4
LOCAL_LEAP_DEFAULTS = {
    "local_leap_anchor_threshold": 0.9,
    "local_leap_neighbor_threshold": 0.75,
    "local_leap_radius": 4,
}
MAX_LOCAL_LEAP_RADIUS = 16
# LLaDA2.1's knobs beside editing_threshold, and their defaults (the official generate()'s).
BLOCK_DIFFUSION_EDIT_KNOBS = {"max_post_steps": 16, "min_tokens_per_step": 1}
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts


def _require_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParameter(name, f"must be an integer, got {value!r}")


def _require_bool(name: str, value) -> None:
    if not isinstance(value, bool):  # "false" is truthy: a string here would silently flip the switch
        raise InvalidParameter(name, f"must be true or false, got {value!r}")


def _require_number(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParameter(name, f"must be a number, got {value!r}")


@dataclass(frozen=True)
class SamplingParams:
    """How one request is denoised. Omitted lengths resolve as the ADR says:

    block_length → gen_length (one bidirectional block); num_denoising_steps → min(128, gen_length);
    block_schedule and confidence_metric → the loaded model family's own (LLaDA: uniform, top1_prob;
    Dream: dream, entropy_inverse), filled in by the engine (`with_model_defaults`); LocalLeap
    thresholds → κ 0.9, τ 0.75, W 4 when `use_local_leap` is on (setting them while it is off is an
    error, never silently ignored); seed → a fresh random one (recorded in `seed`).

    kv_cache ("none" | "prefix" | "dual") and confidence_threshold (None or τ in (0, 1]) are Fast-dLLM's
    approximate KV cache and threshold decoding (docs/sampler.md). With a threshold, each forward commits the
    candidates with confidence ≥ τ plus the most confident one instead of a scheduled quota, so there is no
    step count: `num_denoising_steps` stays None. Only on a block-diffusion model (LLaDA2.0) may both be set:
    the steps' schedule is then each forward's minimum quota (the engine refuses the pair elsewhere).

    editing_threshold, max_post_steps, min_tokens_per_step: LLaDA2.1's sampler (token editing), selected by
    editing_threshold; block-diffusion models only (docs/sampler.md).
    """

    gen_length: int = DEFAULT_GEN_LENGTH
    block_length: int | None = None
    num_denoising_steps: int | None = None
    block_schedule: BlockSchedule | None = None  # None → the model family's default
    confidence_metric: ConfidenceMetric | None = None  # None → the model family's default
    temperature: float = 0.0
    seed: int | None = None
    use_local_leap: bool = False
    local_leap_anchor_threshold: float | None = None
    local_leap_neighbor_threshold: float | None = None
    local_leap_radius: int | None = None
    force_single_batch: bool = False
    early_exit: bool = True
    kv_cache: KVCacheMode = "none"
    confidence_threshold: float | None = None
    stop: tuple[str, ...] | str | None = field(default_factory=tuple)  # stored as a tuple
    # Block diffusion (LLaDA2.1) only; see `_check_block_diffusion_knobs`.
    editing_threshold: float | None = None
    max_post_steps: int | None = None  # None → 16 with editing_threshold
    min_tokens_per_step: int | None = None  # None → 1 with editing_threshold (the official num_to_transfer)

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen dataclass)

        _require_int("gen_length", self.gen_length)
        if self.gen_length < 1:
            raise InvalidParameter("gen_length", f"must be at least 1, got {self.gen_length}")

        if self.block_length is None:
            set_("block_length", self.gen_length)
        _require_int("block_length", self.block_length)
        if not 1 <= self.block_length <= self.gen_length:
            raise InvalidParameter(
                "block_length", f"must be between 1 and gen_length ({self.gen_length}), got {self.block_length}"
            )
        if self.gen_length % self.block_length:
            raise InvalidParameter(
                "block_length",
                f"gen_length ({self.gen_length}) must be a multiple of block_length ({self.block_length})",
            )

        # Threshold decoding and LLaDA2.1 (editing) have no step count unless one is given; with a threshold it is
        # the block-diffusion (LLaDA2.0) minimum quota per forward (engine/family_rules.py refuses it elsewhere).
        if self.num_denoising_steps is not None or (
            self.confidence_threshold is None and self.editing_threshold is None
        ):
            self._resolve_steps(set_)

        if self.block_schedule is not None and self.block_schedule not in BLOCK_SCHEDULES:
            raise InvalidParameter("block_schedule", f"must be one of {', '.join(BLOCK_SCHEDULES)}")
        if self.confidence_metric is not None and self.confidence_metric not in CONFIDENCE_METRICS:
            raise InvalidParameter("confidence_metric", f"must be one of {', '.join(CONFIDENCE_METRICS)}")

        _require_number("temperature", self.temperature)
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise InvalidParameter("temperature", f"must be between 0 and {MAX_TEMPERATURE}, got {self.temperature}")

        if self.seed is None:
            set_("seed", secrets.randbits(63))
        _require_int("seed", self.seed)
        if not SEED_MIN <= self.seed <= SEED_MAX:
            raise InvalidParameter("seed", f"must be between -2**63 and 2**64 - 1, got {self.seed}")

        for name in ("use_local_leap", "force_single_batch", "early_exit"):
            _require_bool(name, getattr(self, name))
        self._resolve_local_leap(set_)

        if self.kv_cache not in KV_CACHE_MODES:
            raise InvalidParameter("kv_cache", f"must be one of {', '.join(KV_CACHE_MODES)}")
        if self.confidence_threshold is not None:
            self._check_threshold()

        self._check_block_diffusion_knobs(set_)

        stop = () if self.stop is None else (self.stop,) if isinstance(self.stop, str) else self.stop
        if (
            not isinstance(stop, (list, tuple))
            or len(stop) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in stop)
        ):
            raise InvalidParameter(
                "stop", f"must be a string or a list of at most {MAX_STOP_STRINGS} non-empty strings"
            )
        set_("stop", tuple(stop))

    # --- block diffusion (LLaDA2.1) knobs: editing_threshold, max_post_steps, min_tokens_per_step ---------------
    # The engine refuses them on families without block diffusion (engine.engine, `_check_family_rules`).

    def _check_block_diffusion_knobs(self, set_) -> None:
        """`editing_threshold` selects LLaDA2.1's sampler (token editing); the other two tune it and need it."""
        if self.editing_threshold is None:
            for name in BLOCK_DIFFUSION_EDIT_KNOBS:
                if getattr(self, name) is not None:
                    raise InvalidParameter(name, "is only allowed together with editing_threshold")
            return
        _require_number("editing_threshold", self.editing_threshold)
        if not 0.0 <= self.editing_threshold <= 1.0:
            raise InvalidParameter(
                "editing_threshold", f"must be between 0 and 1 (1 turns editing off), got {self.editing_threshold}"
            )
        if self.num_denoising_steps is not None:
            raise InvalidParameter(
                "num_denoising_steps",
                "does not apply with editing_threshold: LLaDA2.1's sampler has no step schedule (each forward "
                "commits at least min_tokens_per_step tokens); leave it unset",
            )
        for name, default in BLOCK_DIFFUSION_EDIT_KNOBS.items():
            if getattr(self, name) is None:
                set_(name, default)
        _require_int("max_post_steps", self.max_post_steps)
        if not 0 <= self.max_post_steps <= MAX_STEPS:
            raise InvalidParameter("max_post_steps", f"must be between 0 and {MAX_STEPS}, got {self.max_post_steps}")
        _require_int("min_tokens_per_step", self.min_tokens_per_step)
        if not 1 <= self.min_tokens_per_step <= self.block_length:
            raise InvalidParameter(
                "min_tokens_per_step",
                f"must be between 1 and block_length ({self.block_length}), got {self.min_tokens_per_step}",
            )

    @property
    def uses_editing(self) -> bool:
        """LLaDA2.1's sampler: tokens already written may be overwritten (editing_threshold < 1; 1 never edits)."""
        return self.editing_threshold is not None and self.editing_threshold < 1.0

    # --- end of the block diffusion knobs -----------------------------------------------------------------

    def _check_threshold(self) -> None:
        _require_number("confidence_threshold", self.confidence_threshold)
        if not 0.0 < self.confidence_threshold <= 1.0:
            raise InvalidParameter(
                "confidence_threshold", f"must be greater than 0 and at most 1, got {self.confidence_threshold}"
            )
        # LocalLeap and the block schedule also decide how many tokens a step commits: the threshold replaces both.
        if self.use_local_leap:
            raise InvalidParameter(
                "confidence_threshold",
                "does not combine with use_local_leap: both decide which positions a step commits; use one",
            )
        if self.block_schedule not in (None, "uniform"):
            raise InvalidParameter(
                "block_schedule",
                "has no effect with confidence_threshold (the threshold, not a schedule, decides how many tokens a "
                "step commits); leave it unset",
            )

    def _resolve_steps(self, set_) -> None:
        defaulted = self.num_denoising_steps is None
        if defaulted:
            set_("num_denoising_steps", min(DEFAULT_STEPS, self.gen_length))
        _require_int("num_denoising_steps", self.num_denoising_steps)
        steps = self.num_denoising_steps
        if not 1 <= steps <= MAX_STEPS:
            raise InvalidParameter("num_denoising_steps", f"must be between 1 and {MAX_STEPS}, got {steps}")
        if steps % self.num_blocks:
            origin = f" (not set: the default, min({DEFAULT_STEPS}, gen_length))" if defaulted else ""
            raise InvalidParameter(
                "num_denoising_steps",
                f"must be a multiple of the number of blocks (gen_length / block_length = {self.num_blocks}), "
                f"got {steps}{origin}",
            )
        if self.steps_per_block > self.block_length:
            raise InvalidParameter(
                "num_denoising_steps",
                f"gives {self.steps_per_block} steps per block, more than block_length ({self.block_length}): "
                "every step must commit at least one token",
            )

    def _resolve_local_leap(self, set_) -> None:
        if not self.use_local_leap:
            for name in LOCAL_LEAP_DEFAULTS:
                if getattr(self, name) is not None:
                    raise InvalidParameter(name, "is only allowed together with use_local_leap: true")
            return
        for name, default in LOCAL_LEAP_DEFAULTS.items():
            if getattr(self, name) is None:
                set_(name, default)
        for name in ("local_leap_anchor_threshold", "local_leap_neighbor_threshold"):
            _require_number(name, getattr(self, name))
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise InvalidParameter(name, f"must be between 0 and 1, got {getattr(self, name)}")
        _require_int("local_leap_radius", self.local_leap_radius)
        if not 1 <= self.local_leap_radius <= MAX_LOCAL_LEAP_RADIUS:
            raise InvalidParameter(
                "local_leap_radius", f"must be between 1 and {MAX_LOCAL_LEAP_RADIUS}, got {self.local_leap_radius}"
            )

    def with_model_defaults(self, block_schedule: str, confidence_metric: str) -> SamplingParams:
        """These parameters with the fields left to the model (None) set to the model family's defaults.

        The defaults belong to the model, not to the request: a client that names no schedule gets the
        sampler the model's authors use, whichever model the server loaded.
        """
        if self.block_schedule is not None and self.confidence_metric is not None:
            return self
        if self.confidence_threshold is not None:
            # No schedule applies with a threshold (it decides each step's commits): "uniform" is what such a
            # request has always reported, whatever the family.
            block_schedule = "uniform"
        return replace(
            self,
            block_schedule=self.block_schedule or block_schedule,
            confidence_metric=self.confidence_metric or confidence_metric,
        )

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        if self.num_denoising_steps is None:
            # Threshold decoding: at most one forward per token of the block. Making the last of those commit
            # "everything left" changes nothing, since each earlier forward committed at least one token.
            return self.block_length
        return self.num_denoising_steps // self.num_blocks
