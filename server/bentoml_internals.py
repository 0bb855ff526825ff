"""Replacing a class inside BentoML's internal modules, checked first.

Two of BentoML 1.4's behaviours can only be changed where BentoML looks its classes up when it builds the app
(after the service module is imported): its response timeout (server/middleware.py) and its request-metrics
labels (server/metrics_labels.py). Such a class is an internal: if a release moves it or changes how it is
constructed, the service must fail to import with a message, not run silently with BentoML's own version.
"""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType


def bentoml_class(
    module: str, name: str, arguments: list[str], replacement: str, owner: str
) -> tuple[ModuleType, type]:
    """(the module, the class) that `replacement` takes the place of: `module`'s `name`, whose first
    parameters must be `arguments`. Raises RuntimeError, naming `owner` (the file to check), otherwise."""
    check = f"check {owner} against the installed BentoML version"
    try:
        found = importlib.import_module(module)
    except ImportError as error:
        raise RuntimeError(
            f"BentoML's module {module} moved ({error}): {replacement} cannot replace its {name}; {check}"
        ) from None
    current = getattr(found, name, None)
    if current is None or list(inspect.signature(current).parameters)[: len(arguments)] != arguments:
        raise RuntimeError(
            f"BentoML's {name} is gone or takes other arguments than ({', '.join(arguments)}): {replacement} cannot "
            f"replace it; {check}"
        )
    return found, current
