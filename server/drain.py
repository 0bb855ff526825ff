"""A graceful drain on SIGTERM: stop taking requests, let running ones finish, then let the server exit.

uvicorn's own shutdown (what BentoML's worker runs) stops accepting at once, so connections arriving
during the drain queue unanswered in the listening socket's backlog, and it waits without limit for every
open request, so one stalled upload keeps the process alive forever. `Drain` runs first instead:

1. On SIGTERM (or SIGINT), `begin`: readiness turns false (the service's `__is_ready__` reads `draining`),
   new requests get a 503 `shutting_down` with `Retry-After` (server/middleware.py, `RequestGuard`), and
   requests still receiving their body are cut with the same 503: they have not started.
2. Running requests finish, for up to `grace_s`.
3. If some are still running then, `on_grace_expired` is called (the service stops the engine: streams end
   with an error event and `[DONE]`, non-stream requests get a 503); whatever still runs a few seconds
   later (a client that stopped reading) is cancelled.
4. The signal is handed to uvicorn's own handler, whose shutdown now finds nothing left to wait for. A
   watchdog ends the process if that shutdown itself hangs.
The whole exit is bounded whatever the engine is doing (a forward of minutes, a stuck hook): a watchdog armed
at the signal itself ends the process at `exit_bound_s` (the grace period, the wind-down, the handover).
A second SIGINT (Ctrl+C twice) skips the rest of the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

logger = logging.getLogger(f"dllm_serve.{__name__}")

# After the grace period and stopping the engine: how long requests get to send their last event.
WIND_DOWN_S = 3.0
# After handing over to uvicorn: how long its shutdown (closing connections, the shutdown hooks) may take
# before the process is ended anyway.
HANDOVER_TIMEOUT_S = 15.0


class Drain:
    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        # The longest a SIGTERM may take to end the process: the drain's steps, each bounded, and the handover.
        self.exit_bound_s = grace_s + 2 * WIND_DOWN_S + HANDOVER_TIMEOUT_S
        self.draining = False
        self._begun: asyncio.Event | None = None  # created on the serving loop (see `begun`)
        self._running: set[asyncio.Task] = set()
        self._idle: asyncio.Event | None = None
        self._skip_grace: asyncio.Event | None = None

    # --- read by the request path -----------------------------------------------------------------

    @property
    def begun(self) -> asyncio.Event:
        """Set once the drain has begun; for requests that wait on it (a body still arriving)."""
        if self._begun is None:
            self._begun = asyncio.Event()
            if self.draining:
                self._begun.set()
        return self._begun

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """Count the current request as running until the block ends."""
        task = asyncio.current_task()
        assert task is not None
        self._running.add(task)
        try:
            yield
        finally:
            self._running.discard(task)
            if not self._running and self._idle is not None:
                self._idle.set()

    @property
    def running(self) -> int:
        return len(self._running)

    # --- the drain itself -------------------------------------------------------------------------

    def begin(self) -> None:
        self.draining = True
        self.begun.set()

    async def run(self, on_grace_expired: Callable[[], Any] | None = None) -> None:
        """Steps 1-3 of the module docstring; returns when no request is left running."""
        self.begin()
        self._idle = asyncio.Event()
        self._skip_grace = self._skip_grace or asyncio.Event()
        if self._running:
            logger.info("draining: waiting up to %gs for %d running request(s)", self.grace_s, len(self._running))
            if not await self._until_idle(self.grace_s):
                logger.warning("draining: %d request(s) still running after the grace period", len(self._running))
                if on_grace_expired is not None:
                    on_grace_expired()
                if not await self._until_idle(WIND_DOWN_S):
                    for task in list(self._running):
                        task.cancel()
                    await self._until_idle(WIND_DOWN_S)
        logger.info("drained")

    async def _until_idle(self, timeout: float) -> bool:
        """Wait until no request runs (True), for at most `timeout` or until the grace is skipped (False)."""
        assert self._idle is not None and self._skip_grace is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._running and not self._skip_grace.is_set() and (remaining := deadline - loop.time()) > 0:
            self._idle.clear()  # set by `track` when the last running request ends
            idle = asyncio.ensure_future(self._idle.wait())
            skip = asyncio.ensure_future(self._skip_grace.wait())
            try:
                await asyncio.wait({idle, skip}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                idle.cancel()
                skip.cancel()
        return not self._running

    # --- signals ----------------------------------------------------------------------------------

    def intercept_signals(
        self, loop: asyncio.AbstractEventLoop, on_grace_expired: Callable[[], Any] | None = None
    ) -> bool:
        """Route SIGTERM and SIGINT through the drain before the handlers installed now (uvicorn's); logged.

        Must be called on the main thread, where Python runs signal handlers; returns False (and changes
        nothing) elsewhere, e.g. under a test client that runs the app on a thread of its own.
        """
        if threading.current_thread() is not threading.main_thread():
            return False
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

        def hand_over(sig: int, frame: FrameType | None) -> None:
            _start_watchdog(HANDOVER_TIMEOUT_S, "shutdown did not finish within %gs of the drain; exiting")
            handler = previous[sig]
            if callable(handler):
                handler(sig, frame)
            elif handler == signal.SIG_DFL:
                signal.signal(sig, signal.SIG_DFL)
                os.kill(os.getpid(), sig)

        def on_signal(sig: int, frame: FrameType | None) -> None:
            if not self.draining:
                logger.info("received %s: draining (grace period %gs)", signal.Signals(sig).name, self.grace_s)
                self.draining = True  # at once: the readiness probe may run before the loop wakes up
                # Armed before anything that could wait on the engine (which may be inside a long forward).
                _start_watchdog(self.exit_bound_s, "the process did not exit within %gs of the signal; exiting")

                async def drain_then_hand_over() -> None:
                    try:
                        await self.run(on_grace_expired)
                    finally:
                        hand_over(sig, frame)

                loop.call_soon_threadsafe(lambda: loop.create_task(drain_then_hand_over()))
            elif sig == signal.SIGINT:
                logger.info("second SIGINT: ending the drain now")
                loop.call_soon_threadsafe(self._skip)

        for sig in previous:
            signal.signal(sig, on_signal)
        logger.info("SIGTERM drains: running requests get up to %gs (DLLM_SHUTDOWN_GRACE_S)", self.grace_s)
        return True

    def _skip(self) -> None:
        self._skip_grace = self._skip_grace or asyncio.Event()
        self._skip_grace.set()


def _start_watchdog(seconds: float, message: str) -> None:
    """End the process (status 1) after `seconds`, with `message` (% the seconds) in the log, from a thread of
    its own: it fires even while the event loop is blocked."""

    def end_process() -> None:
        logger.error(message, seconds)
        logging.shutdown()
        os._exit(1)

    timer = threading.Timer(seconds, end_process)
    timer.daemon = True
    timer.start()
