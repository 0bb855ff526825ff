"""The preparation stage: async requests are tokenized and validated here, off the event loop, bounded.

Tokenizing takes time that grows with the prompt (seconds for megabytes of text), so the async API hands
it to threads of its own (the tokenizer releases the GIL) and the event loop keeps serving meanwhile.
Two lanes, one thread each: prompts up to `LONG_PROMPT_CHARS` characters take the short lane, longer ones
the long lane, so a stream of long prompts never delays a short one, whose thread is never busy with
them. Within a lane, requests are prepared in call order.

Bounds, so that preparation cannot become an unbounded queue in front of the bounded scheduler:
- requests being prepared count against the engine's capacity with the running and waiting ones
  (`SchedulerConfig.capacity`): the 429 fires at the same total, whichever stage the requests are in;
- the stage holds at most `SchedulerConfig.preparing_limit` requests, and the long lane at most an eighth
  of them (one at least), so a flood of long prompts is refused before it can fill the engine.
A prompt that cannot fit the model at all never gets here: the engine refuses it by its length first
(`DiffusionEngine.check_prompt_size`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from engine.errors import EngineOverloaded
from engine.scheduler import SchedulerConfig
from engine.stats import EngineStats

T = TypeVar("T")

# A prompt this long tokenizes in tens of milliseconds with a byte-level BPE tokenizer; longer ones can
# take seconds, and go to the long lane.
LONG_PROMPT_CHARS = 32_768
# The long lane's share of the stage's places.
LONG_LANE_SHARE = 8


class PreparationStage:
    def __init__(self, config: SchedulerConfig, stats: EngineStats):
        self.config = config
        self.stats = stats
        self.limit = config.preparing_limit
        self.long_limit = max(1, self.limit // LONG_LANE_SHARE)
        self._short_lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dllm-prepare")
        self._long_lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dllm-prepare-long")
        self._lock = threading.Lock()
        self._preparing = 0
        self._preparing_long = 0

    async def run(self, prompt_chars: int, queued: tuple[int, int], prepare: Callable[[], T]) -> T:
        """`prepare()` on the prompt's lane; raises EngineOverloaded at once when there is no room.

        queued: (running, waiting) in the scheduler now. Cancelling the caller drops the work if it has not
        started; work that has started finishes on its thread and its result is discarded.
        """
        long = prompt_chars > LONG_PROMPT_CHARS
        self._admit(long, queued)
        try:
            future = (self._long_lane if long else self._short_lane).submit(prepare)
        except BaseException:
            self._release(long)
            raise
        # Released when the work ends or is dropped, not when the caller stops waiting: the count is the
        # thread's real backlog.
        future.add_done_callback(lambda _: self._release(long))
        return await asyncio.wrap_future(future)

    def _admit(self, long: bool, queued: tuple[int, int]) -> None:
        running, waiting = queued
        with self._lock:
            full = (
                self._preparing >= self.limit
                or (long and self._preparing_long >= self.long_limit)
                or running + waiting + self._preparing >= self.config.capacity
            )
            if not full:
                self._preparing += 1
                self._preparing_long += long
                self.stats.set_preparing(self._preparing)
                return
            preparing = self._preparing
        self.stats.request_overloaded()
        raise EngineOverloaded(running, waiting, self.config.max_batch_size, self.config.max_waiting, preparing)

    def _release(self, long: bool) -> None:
        with self._lock:
            self._preparing -= 1
            self._preparing_long -= long
            self.stats.set_preparing(self._preparing)
