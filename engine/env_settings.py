"""Settings dataclasses read from DLLM_* environment variables: the one loop they share.

A settings class names its variables in `ENV_VARS` (field name -> variable) and checks its own ranges in
`__post_init__`; `settings_from_env` parses each variable that is set and checks it alone, so an error names
the variable that caused it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping


def ascii_int(raw: str) -> int:
    """An integer in ASCII digits only (`int` would also read "٣" or "1_000")."""
    if not (raw.isascii() and raw.lstrip("-").isdigit()):
        raise ValueError("must be an integer (ASCII digits)")
    return int(raw)


def ascii_float(raw: str) -> float:
    """A number in ASCII only (`float` would also read other scripts' digits)."""
    try:
        if raw.isascii():
            return float(raw)
    except ValueError:
        pass
    raise ValueError("must be a number (ASCII digits)")


def comma_list(parse: Callable[[str], object]) -> Callable[[str], tuple]:
    """A parser for "a, b, c": each non-empty part read with `parse`."""
    return lambda raw: tuple(parse(part.strip()) for part in raw.split(",") if part.strip())


def settings_from_env(cls, parsers: Mapping[str, Callable[[str], object]], environ: Mapping[str, str] | None):
    """`cls` with the fields whose variable is set in `environ` (default: os.environ), each read with
    `parsers[field]` (default ascii_int); raises ValueError naming the variable of a bad value."""
    environ = os.environ if environ is None else environ
    values: dict = {}
    for name, var in cls.ENV_VARS.items():
        raw = environ.get(var, "").strip()
        if not raw:
            continue
        try:
            values[name] = parsers.get(name, ascii_int)(raw)
            cls(**{name: values[name]})  # the range check, while we still know which variable it was
        except ValueError as error:
            raise ValueError(f"{var}={raw!r}: {error}") from None
    return cls(**values)
