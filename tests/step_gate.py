"""`StepByStep`: hold a real engine's scheduler between steps, for tests that need "this request is still
running" to hold for exactly as long as they say (a full queue, a request queued at shutdown) without timing."""

from __future__ import annotations

import threading

HANG_GUARD_S = 120  # only turns a hang into a failure


class StepByStep:
    """Wraps `engine.step` (the real one runs) so that each step waits for a permit: the test decides when the
    scheduler thread moves on, and can wait for it to arrive at its next step (after its admission pass).

    Install it with `monkeypatch.setattr(engine, "step", StepByStep(engine))`.
    """

    def __init__(self, engine):
        self.real_step = engine.step
        self.permits = threading.Semaphore(0)
        self.batches: list[list] = []
        self._arrived = threading.Condition()
        self.arrivals = 0

    def __call__(self, requests):
        with self._arrived:
            self.arrivals += 1
            self._arrived.notify_all()
        assert self.permits.acquire(timeout=HANG_GUARD_S), "the test never let this step run"
        self.batches.append(list(requests))
        return self.real_step(requests)

    def wait_for_arrival(self, count: int) -> None:
        """Block until the scheduler has arrived at its `count`-th step."""
        with self._arrived:
            assert self._arrived.wait_for(lambda: self.arrivals >= count, HANG_GUARD_S), "the scheduler never came"

    def run_freely(self) -> None:
        self.permits.release(1_000_000)
