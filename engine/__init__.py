"""dllm-serve's engine: native LLaDA model, diffusion sampler, batching scheduler. No HTTP here."""

from engine.engine import DiffusionEngine
from engine.params import InvalidParameter, SamplingParams
from engine.sampler import GenerationResult, StepEvent

__all__ = ["DiffusionEngine", "GenerationResult", "InvalidParameter", "SamplingParams", "StepEvent"]
