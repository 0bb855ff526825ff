"""Every exception the engine raises on purpose, in one place.

The HTTP layer maps exactly these to statuses (api/errors.py): `InvalidParameter` is the only one that
blames the client (400). Anything else the engine raises is a bug or a failure of the machine, and the
server answers it with a 500 that carries the request id, never a 400.
"""

from __future__ import annotations


class InvalidParameter(ValueError):
    """A request the engine refuses as given: names the field at fault and the rule it breaks.

    A ValueError, so that offline callers can catch the usual exception; the HTTP layer catches this
    class alone and reports `field` as `error.param`.
    """

    def __init__(self, field_name: str, rule: str):
        super().__init__(f"{field_name}: {rule}")
        self.field = field_name
        self.rule = rule


class EngineOverloaded(RuntimeError):
    """The engine holds all the requests it accepts (running, waiting, being prepared): retry later (HTTP 429)."""

    def __init__(self, running: int, waiting: int, max_batch_size: int, max_waiting: int, preparing: int = 0):
        being_prepared = f", {preparing} being prepared" if preparing else ""
        super().__init__(
            f"the engine is at capacity ({running} requests running, {waiting} waiting{being_prepared}; "
            f"max_batch_size={max_batch_size}, max_waiting={max_waiting}); retry later"
        )
        self.running = running
        self.waiting = waiting
        self.preparing = preparing


class EngineShutdown(RuntimeError):
    """The engine was shut down before the request could finish (HTTP 503)."""
