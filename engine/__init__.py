<<<<<<< HEAD
"""dllm-serve's engine: native LLaDA, Dream and LLaDA2 models, diffusion samplers, batching scheduler. No HTTP here."""
=======
"""dllm-serve's engine: the models in plain torch (LLaDA, Dream), the diffusion sampler, the batching
scheduler. No HTTP here."""
>>>>>>> host

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
