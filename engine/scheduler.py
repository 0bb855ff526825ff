"""Step-level batching: one thread owns the model and advances every active request together.

(docs/design.md, "Batching".) Each iteration of the scheduler thread
1. admits waiting requests (FIFO) into free slots, up to `max_batch_size` active requests;
2. drops requests whose consumer went away (cancelled), freeing their slots;
3. picks the step's batch (`next_batch`, engine/batching_policy.py): normally every active request, so
   they share ONE forward;
4. runs `engine.step(batch)` (one left-padded forward, then each request's own sampler step);
5. hands each request its `StepEvent` (or the exception its step raised) to its consumer;
6. retires finished, failed and cancelled requests.

A request therefore joins at the next step after it arrives and leaves as soon as it is done: nobody waits
for a batch to drain (the diffusion analogue of continuous batching). Requests with different prompts,
canvas sizes and sampling settings share a forward; the sampler keeps every per-request decision separate.

Threads: consumers only call `submit()` and `RequestHandle.cancel()`, which take a lock for a few list
operations; the model runs on the scheduler thread alone, for the async API (`astream`) and the sync one
(`stream`, `generate`) alike. Events travel back to a coroutine through `loop.call_soon_threadsafe` into
one asyncio.Queue per request (one wake-up per loop per step), and to a waiting thread through a
thread-safe queue.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from math import inf
from typing import Protocol

from engine.batching_policy import ForwardCost, next_batch
from engine.env_settings import ascii_float, ascii_int, settings_from_env
from engine.errors import EngineOverloaded, EngineShutdown
from engine.sampler import DenoisingRequest, StepEvent
from engine.stats import EngineStats

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerConfig:
    """How the scheduler batches. Defaults in docs/design.md ("HTTP fine print"); env vars in `from_env`.

    max_batch_size: active requests at most (they share each forward).
    max_waiting: accepted requests beyond those, queued for a slot; one more raises EngineOverloaded.
    max_wait_ms: when the scheduler is idle and a request arrives, wait up to this long for more to
        arrive (until max_batch_size are waiting) before the first forward, so a burst starts together.
        0 starts at once; a request arriving later simply joins at the next step.
    kv_cache_budget_bytes: the KV-cache memory that running requests may hold together; a request whose
        cache does not fit waits (first come, first served). None: the engine picks one for its device
        (`engine.memory.default_kv_cache_budget`).
    max_preparing: async requests being tokenized or queued for it (engine/preparation.py) at most; one
        more raises EngineOverloaded. They also count against `capacity`. None: `capacity`.
    max_prompt_tokens: the longest prompt served, in tokens, whatever the model's context allows: a step's
        time grows with the square of its length, and a prompt this host cannot serve in reasonable time is
        refused (400) rather than left to hold the engine for minutes. None: the engine picks one for its
        device (`engine.memory.default_max_prompt_tokens`).
    step_token_budget: the most positions (rows × padded width) a shared forward computes: requests share a
        forward only within it, and one wider request runs alone. None: the engine picks one for its device.
    """

    max_batch_size: int = 8
    max_waiting: int = 256
    max_wait_ms: float = 0.0
    kv_cache_budget_bytes: int | None = None
    max_preparing: int | None = None
    max_prompt_tokens: int | None = None
    step_token_budget: int | None = None

    OPTIONAL = ("max_preparing", "max_prompt_tokens", "step_token_budget")

    def __post_init__(self) -> None:
        for name, minimum in (
            ("max_batch_size", 1),
            ("max_waiting", 0),
            ("max_preparing", 1),
            ("max_prompt_tokens", 1),
            ("step_token_budget", 1),
        ):
            value = getattr(self, name)
            if name in self.OPTIONAL and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"SchedulerConfig.{name} must be an integer ≥ {minimum}, got {value!r}")
        budget = self.kv_cache_budget_bytes
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ValueError(f"SchedulerConfig.kv_cache_budget_bytes must be a positive integer, got {budget!r}")
        wait = self.max_wait_ms
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait < float("inf"):
            raise ValueError(f"SchedulerConfig.max_wait_ms must be a finite number ≥ 0, got {wait!r}")

    ENV_VARS = {
        "max_batch_size": "DLLM_MAX_BATCH_SIZE",
        "max_waiting": "DLLM_MAX_WAITING",
        "max_wait_ms": "DLLM_MAX_WAIT_MS",
        "kv_cache_budget_bytes": "DLLM_KV_CACHE_BUDGET_MB",
        "max_preparing": "DLLM_MAX_PREPARING",
        "max_prompt_tokens": "DLLM_MAX_PROMPT_TOKENS",
        "step_token_budget": "DLLM_STEP_TOKEN_BUDGET",
    }

    @property
    def capacity(self) -> int:
        """Requests the engine holds at once (running, waiting, and being prepared); one more is refused."""
        return self.max_batch_size + self.max_waiting

    @property
    def preparing_limit(self) -> int:
        return self.capacity if self.max_preparing is None else min(self.max_preparing, self.capacity)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SchedulerConfig:
        """Defaults overridden by DLLM_MAX_BATCH_SIZE, DLLM_MAX_WAITING, DLLM_MAX_WAIT_MS,
        DLLM_KV_CACHE_BUDGET_MB (MiB), DLLM_MAX_PREPARING, DLLM_MAX_PROMPT_TOKENS and DLLM_STEP_TOKEN_BUDGET.
        Numbers are ASCII digits only."""
        parsers = {"max_wait_ms": ascii_float, "kv_cache_budget_bytes": _mebibytes}
        return settings_from_env(cls, parsers, environ)


def _mebibytes(raw: str) -> int:
    return ascii_int(raw) * 2**20


class StepsRequests(Protocol):
    def step(self, requests: list[DenoisingRequest]) -> list[StepEvent | Exception]: ...


_Item = StepEvent | BaseException


class RequestHandle:
    """One submitted request as both threads see it: the consumer reads its events, the scheduler steps it.

    The consumer is a coroutine on `loop` (the async API) or, with `loop` None, a thread that blocks
    until the next event (the sync API). Either way it gets StepEvents, then the exception that ended
    the request, if one did. A consumer that wants only the result (`every_event` False) gets the last
    event alone: it is woken once per request instead of once per step.
    """

    def __init__(
        self,
        request: DenoisingRequest,
        loop: asyncio.AbstractEventLoop | None,
        scheduler: Scheduler,
        order: int,
        every_event: bool = True,
    ):
        self.request = request
        self.loop = loop
        self.every_event = every_event
        self._events: asyncio.Queue[_Item] | queue.SimpleQueue[_Item] = (
            asyncio.Queue() if loop is not None else queue.SimpleQueue()
        )
        self.submitted_at = time.monotonic()
        self.order = order  # submission order: FIFO admission and a deterministic tie-break
        self.start_tag = 0.0  # when its next step is due, in the scheduler's virtual time (set at admission)
        self.cancelled = False  # set by the consumer; the scheduler acts on it at its next iteration
        self.done = False  # set by the scheduler once the last item is on its way
        self._scheduler = scheduler

    @property
    def step_width(self) -> int:
        """Positions its next forward computes: the whole row (prompt + canvas), or with a KV cache after a
        block's first step, only the block (dual) or the block and what follows it (prefix)."""
        start, end = self.request.forward_span()
        return end - start

    @property
    def kv_cache_bytes(self) -> int:
        return self.request.kv_cache_bytes

    @property
    def runs_alone(self) -> bool:
        return self.request.params.force_single_batch

    def cancel(self) -> None:
        """Called when the consumer goes away. Frees the slot at the scheduler's next iteration."""
        if not self.done and not self.cancelled:
            self.cancelled = True
            self._scheduler.wake()

    async def next_event(self) -> StepEvent:
        """The next event, for a consumer on `loop`; raises the exception that ended the request."""
        assert isinstance(self._events, asyncio.Queue)
        return _event_or_raise(await self._events.get())

    def wait_event(self) -> StepEvent:
        """The next event, for a consumer thread (blocks); raises the exception that ended the request."""
        assert isinstance(self._events, queue.SimpleQueue)
        return _event_or_raise(self._events.get())

    def put(self, item: _Item) -> None:
        """Called on the consumer's loop (async) or on the scheduler thread (a consumer thread)."""
        self._events.put_nowait(item)


def _event_or_raise(item: _Item) -> StepEvent:
    if isinstance(item, BaseException):
        raise item
    return item


# Schedulers whose thread may still run. At interpreter exit they are stopped before finalisation starts:
# a daemon thread still inside torch or a condition wait while the runtime tears down can abort the process.
_live_schedulers: weakref.WeakSet[Scheduler] = weakref.WeakSet()


@atexit.register
def _stop_live_schedulers() -> None:
    for scheduler in list(_live_schedulers):
        scheduler.shutdown(timeout=5.0)


def _put_all(items: list[tuple[RequestHandle, _Item]]) -> None:
    for handle, item in items:
        handle.put(item)


class Scheduler:
    def __init__(self, engine: StepsRequests, config: SchedulerConfig, stats: EngineStats):
        self.engine = engine
        self.config = config
        self.stats = stats
        self._cond = threading.Condition()
        # Guarded by _cond: what submit() needs to see.
        self._waiting: deque[RequestHandle] = deque()
        self._running = 0
        self._kv_cache_reserved = 0  # bytes of KV cache the active requests may hold
        self._stopping = False
        self._drain = False
        # Owned by the scheduler thread.
        self._active: list[RequestHandle] = []
        self._iteration = 0
        # Start-time fair queuing (engine/batching_policy.py, `next_batch`): the start tag of the forward that
        # ran last, where a request admitted now starts.
        self._virtual_time = 0.0
        self._order = itertools.count()
        self.forward_cost = ForwardCost()
        self._thread = threading.Thread(target=self._run, name="dllm-scheduler", daemon=True)

    # --- called from any thread ---------------------------------------------------------------------

    def start(self) -> None:
        _live_schedulers.add(self)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(
        self, request: DenoisingRequest, loop: asyncio.AbstractEventLoop | None = None, every_event: bool = True
    ) -> RequestHandle:
        """Queue a validated request; its events go to a coroutine on `loop`, or (None) to a waiting thread,
        all of them or (every_event False) only the last.

        Raises EngineOverloaded when the queue is full, EngineShutdown once the scheduler is stopping.
        """
        with self._cond:
            if self._stopping or not self._thread.is_alive():
                raise EngineShutdown("the engine is shutting down and accepts no new requests")
            waiting, capacity = len(self._waiting), self.config.capacity
            if self._running + waiting >= capacity:
                self.stats.request_overloaded()
                raise EngineOverloaded(self._running, waiting, self.config.max_batch_size, self.config.max_waiting)
            handle = RequestHandle(request, loop, self, next(self._order), every_event)
            self._waiting.append(handle)
            self.stats.request_accepted()
            self._publish_sizes()
            self._cond.notify()
        return handle

    def load(self) -> tuple[int, int]:
        """(running, waiting): the requests accepted and not finished."""
        with self._cond:
            return self._running, len(self._waiting)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def shutdown(self, drain: bool = False, timeout: float | None = None) -> None:
        """Stop the thread, waiting for it up to `timeout` (None: until it ends). drain=True first finishes the
        pending requests; drain=False fails each with EngineShutdown now, even one inside a forward that runs
        on for minutes: its consumer is told at once, and the forward's result is dropped when it ends. New
        submissions are refused either way."""
        with self._cond:
            self._stopping = True
            self._drain = drain
            self._cond.notify()
            failed = [] if drain else [h for h in self._active + list(self._waiting) if not h.done and not h.cancelled]
            for handle in failed:
                handle.done = True  # the scheduler thread delivers nothing more to it
        ending = EngineShutdown("the engine was shut down before this request finished")
        self._deliver([(handle, ending) for handle in failed])
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # --- the scheduler thread -----------------------------------------------------------------------

    def _run(self) -> None:
        ending: BaseException = EngineShutdown("the engine was shut down before this request finished")
        try:
            while self._admit():
                self._drop_cancelled()
                if self._active:
                    budget = self.config.step_token_budget or inf
                    self._step(next_batch(self._active, self.forward_cost.overhead_tokens, budget))
        except BaseException as crash:  # noqa: BLE001 - a scheduler bug must not leave consumers hanging
            logger.exception("the scheduler thread crashed; failing every pending request")
            ending = crash
        finally:
            with self._cond:
                self._stopping = True
                pending = self._active + list(self._waiting)
                self._waiting.clear()
                self._leave(list(self._active))
            self._deliver([(h, ending) for h in pending if not h.cancelled and not h.done])
            for handle in pending:
                if handle.cancelled:
                    self._retire_cancelled(handle)
                handle.done = True

    def _admit(self) -> bool:
        """Block until there is work, move waiting requests into free slots. False: time to stop."""
        with self._cond:
            while not (self._active or self._waiting or self._stopping):
                self._cond.wait()
            if self._stopping and not (self._drain and (self._active or self._waiting)):
                return False
            if not self._active and self.config.max_wait_ms > 0:
                self._gather_burst()
            changed = False
            if any(h.cancelled for h in self._waiting):  # a cancelled waiter frees its queue place now
                for handle in [h for h in self._waiting if h.cancelled]:
                    self._waiting.remove(handle)
                    self._retire_cancelled(handle)
                changed = True
            while (
                self._waiting and len(self._active) < self.config.max_batch_size and self._cache_fits(self._waiting[0])
            ):
                handle = self._waiting.popleft()
                handle.start_tag = self._virtual_time  # due now: as if it had been stepping all along
                self._active.append(handle)
                self._kv_cache_reserved += handle.kv_cache_bytes
                changed = True
            if changed:  # otherwise the sizes are those published last
                self._running = len(self._active)
                self._publish_sizes()
            return True

    def _cache_fits(self, handle: RequestHandle) -> bool:
        """Whether the next waiting request's KV cache fits beside the running ones'. It waits otherwise, and
        so do those behind it (first come, first served: a large request is never overtaken indefinitely).
        With nothing running it always fits: the engine refuses requests larger than the whole budget."""
        budget = self.config.kv_cache_budget_bytes
        return budget is None or not self._active or self._kv_cache_reserved + handle.kv_cache_bytes <= budget

    def _gather_burst(self) -> None:
        # Idle scheduler, first request in: give the rest of a burst `max_wait_ms` to arrive.
        deadline = time.monotonic() + self.config.max_wait_ms / 1000
        while len(self._waiting) < self.config.max_batch_size and not self._stopping:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._cond.wait(remaining)

    def _drop_cancelled(self) -> None:
        if any(h.cancelled for h in self._active):
            with self._cond:
                cancelled = [h for h in self._active if h.cancelled]
                self._leave(cancelled)
                for handle in cancelled:
                    self._retire_cancelled(handle)

    def _step(self, batch: list[RequestHandle]) -> None:
        self._iteration += 1
        self._virtual_time = min(h.start_tag for h in batch)
        width = max(h.step_width for h in batch)  # before the step moves the requests on
        started = time.perf_counter()
        try:
            results: list[StepEvent | Exception] = self.engine.step([h.request for h in batch])
        except Exception as error:  # noqa: BLE001 - a failed forward fails its batch, not the scheduler
            logger.exception("a forward pass failed; failing the %d request(s) of its batch", len(batch))
            results = [error] * len(batch)
        else:
            seconds = time.perf_counter() - started
            for handle in batch:
                handle.start_tag += seconds  # each member's share of the engine: the whole forward's time
            self.forward_cost.observe(len(batch) * width, seconds)
            committed = sum(len(r.committed) for r in results if isinstance(r, StepEvent))
            self.stats.forward_done(len(batch), committed)
            for result in results:
                if isinstance(result, Exception):
                    logger.error("a request failed in its sampler step", exc_info=result)

        outbox: list[tuple[RequestHandle, _Item]] = []
        retired: list[RequestHandle] = []
        with self._cond:  # against `shutdown`, which may have failed some of these during the forward
            for handle, result in zip(batch, results, strict=True):
                if handle.cancelled or handle.done:
                    continue  # dropped (and counted as cancelled) at the next iteration, or already failed
                last = isinstance(result, Exception) or result.finished
                if last or handle.every_event:
                    outbox.append((handle, result))
                if last:
                    handle.done = True
                    retired.append(handle)
                    if isinstance(result, StepEvent):
                        self.stats.request_completed(time.monotonic() - handle.submitted_at)
            if retired:
                self._leave(retired)
        self._deliver(outbox)

    def _leave(self, handles: list[RequestHandle]) -> None:
        """Take active requests out (finished, failed, cancelled): free their slots and their KV caches.
        Called with _cond held."""
        for handle in handles:
            self._active.remove(handle)
            self._kv_cache_reserved -= handle.kv_cache_bytes
            handle.request.release()
        self._running = len(self._active)
        self._publish_sizes()

    def _retire_cancelled(self, handle: RequestHandle) -> None:
        handle.done = True
        self.stats.request_cancelled()

    def _publish_sizes(self) -> None:
        self.stats.set_queue_sizes(
            running=self._running, waiting=len(self._waiting), kv_cache_bytes=self._kv_cache_reserved
        )

    def _deliver(self, outbox: list[tuple[RequestHandle, _Item]]) -> None:
        """One call_soon_threadsafe per event loop per step, however many requests it serves; a consumer
        thread's queue is filled directly (it is thread-safe)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestHandle, _Item]]] = {}
        for handle, item in outbox:
            if handle.loop is None:
                handle.put(item)
            else:
                by_loop.setdefault(handle.loop, []).append((handle, item))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the loop is closed: its consumers are gone
                for handle, _ in items:
                    handle.cancelled = True
