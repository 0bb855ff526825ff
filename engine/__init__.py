"""dllm-serve's engine: the models in plain torch (LLaDA, Dream, LLaDA2), the diffusion samplers, the batching
scheduler. No HTTP here.

The names below are imported on first use (PEP 562), so that `import engine.params` (the sampler knobs,
which the HTTP schemas derive from) and `engine.prompt` load no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {
    "DiffusionEngine": "engine.engine",
    "EngineOverloaded": "engine.errors",
    "EngineShutdown": "engine.errors",
    "InvalidParameter": "engine.errors",
    "EngineStats": "engine.stats",
    "GenerationResult": "engine.sampler",
    "StepEvent": "engine.sampler",
    "Prompt": "engine.prompt",
    "SamplingParams": "engine.params",
    "SchedulerConfig": "engine.scheduler",
}
__all__ = sorted(_HOMES)

if TYPE_CHECKING:  # what type checkers see; at run time `__getattr__` imports each on first use
    from engine.engine import DiffusionEngine as DiffusionEngine
    from engine.errors import EngineOverloaded as EngineOverloaded
    from engine.errors import EngineShutdown as EngineShutdown
    from engine.errors import InvalidParameter as InvalidParameter
    from engine.params import SamplingParams as SamplingParams
    from engine.prompt import Prompt as Prompt
    from engine.sampler import GenerationResult as GenerationResult
    from engine.sampler import StepEvent as StepEvent
    from engine.scheduler import SchedulerConfig as SchedulerConfig
    from engine.stats import EngineStats as EngineStats


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # once: later lookups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
