"""dllm-serve's engine: the models in plain torch (LLaDA, Dream, LLaDA2), the diffusion samplers, the batching
scheduler. No HTTP here."""

from engine.engine import DiffusionEngine
from engine.errors import EngineOverloaded, EngineShutdown, InvalidParameter
from engine.params import SamplingParams
from engine.sampler import GenerationResult, StepEvent
from engine.scheduler import SchedulerConfig
from engine.stats import EngineStats

__all__ = [
    "DiffusionEngine",
    "EngineOverloaded",
    "EngineShutdown",
    "EngineStats",
    "GenerationResult",
    "InvalidParameter",
    "SamplingParams",
    "SchedulerConfig",
    "StepEvent",
]
