"""Which sampler knobs apply to which model family: the rules SamplingParams cannot check without the model.

SamplingParams (engine/params.py) checks each knob's range and how knobs combine; whether a knob means anything
depends on the loaded model. Block diffusion (LLaDA2) has its own sampler (engine/block_sampler.py): an exact KV
cache that is always on, the uniform schedule, top-1-probability confidence, and LLaDA2.1's editing knobs. The
LLaDA / Dream samplers have none of the latter, and LLaDA2 none of their cache modes, schedules, metrics or
LocalLeap. A knob that does not apply is refused (InvalidParameter naming it), never silently ignored.
"""

from __future__ import annotations

from engine.errors import InvalidParameter
from engine.params import SamplingParams

BLOCK_DIFFUSION_FAMILIES = frozenset({"llada2"})
BLOCK_DIFFUSION_ONLY = ("editing_threshold", "max_post_steps", "min_tokens_per_step")


def check_family_rules(params: SamplingParams, family: str) -> None:
    if family in BLOCK_DIFFUSION_FAMILIES:
        _check_block_diffusion(params)
        return
    for name in BLOCK_DIFFUSION_ONLY:
        if getattr(params, name) is not None:
            raise InvalidParameter(
                name, f"applies to block-diffusion models (LLaDA2.1's token editing) only, not to {family} models"
            )
    if params.confidence_threshold is not None and params.num_denoising_steps is not None:
        # Fast-dLLM's threshold decoding has no step count: a block takes the forwards it needs, each committing
        # at least one token (see SamplingParams.steps_per_block).
        raise InvalidParameter(
            "num_denoising_steps",
            "does not apply with confidence_threshold: the threshold decides how many tokens each forward "
            "commits (at least one), and a block takes the forwards it needs; leave it unset",
        )


def _check_block_diffusion(params: SamplingParams) -> None:
    if params.kv_cache != "none":
        raise InvalidParameter(
            "kv_cache",
            "does not apply to block-diffusion models: their KV cache is exact and always on; leave it unset",
        )
    if params.block_schedule not in (None, "uniform"):
        raise InvalidParameter(
            "block_schedule", "must be uniform (or unset) on block-diffusion models: their schedule is the official one"
        )
    if params.confidence_metric not in (None, "top1_prob"):
        raise InvalidParameter(
            "confidence_metric",
            "must be top1_prob (or unset) on block-diffusion models: their samplers rank by the top-1 probability",
        )
    if params.use_local_leap:
        raise InvalidParameter(
            "use_local_leap", "does not apply to block-diffusion models (LLaDA2's samplers have their own commit rule)"
        )
