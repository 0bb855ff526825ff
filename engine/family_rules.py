"""The rules between a request's knobs and the loaded model family that a knob's spec cannot say alone.

A knob that applies to some families only says so in its spec (`families` in engine/params.py), and
`SamplingParams.check_family` refuses it elsewhere. What is left here are rules on a knob's *value* or on a
pair of knobs: block diffusion (LLaDA2) has its own sampler (engine/block_sampler.py), with an exact KV cache
that is always on, the official uniform schedule and top-1-probability confidence, so it refuses the LLaDA /
Dream cache modes, schedules, metrics and LocalLeap; only there may a threshold and a step count be combined
(the steps set each forward's minimum quota). Nothing that does not apply is silently ignored.
"""

from __future__ import annotations

from engine.errors import InvalidParameter
from engine.params import SamplingParams

BLOCK_DIFFUSION_FAMILIES = frozenset({"llada2"})
# The knobs block diffusion refuses any setting of (but their default): what a form for it leaves out.
BLOCK_DIFFUSION_FIXED = ("kv_cache", "block_schedule", "confidence_metric", "use_local_leap")


def check_family_rules(params: SamplingParams, family: str) -> None:
    if family in BLOCK_DIFFUSION_FAMILIES:
        _check_block_diffusion(params)
    elif params.confidence_threshold is not None and params.num_denoising_steps is not None:
        # Fast-dLLM's threshold decoding has no step count: a block takes the forwards it needs, each committing
        # at least one token (see SamplingParams.steps_per_block).
        raise InvalidParameter(
            "num_denoising_steps",
            "does not apply with confidence_threshold: the threshold decides how many tokens each forward "
            "commits (at least one), and a block takes the forwards it needs; leave it unset",
        )


def _check_block_diffusion(params: SamplingParams) -> None:
    if params.kv_cache != "none":  # before the spec's generic refusal: a better reason
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
