"""`DiffusionEngine`: the Python API (docs/design.md, "Engine contract").

One execution model: every request, from the sync API (`stream`, `generate`) or the async one
(`astream`, `agenerate`), is denoised on the engine's one scheduler thread, so the model only ever runs
there and requests from both share forwards. The sync calls block their own thread until the events
arrive; the async ones await them on their event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import operator
import threading
from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing
from pathlib import Path

import torch

from engine.batch import denoise_step
from engine.errors import InvalidParameter
from engine.loading import DiffusionLM, default_device, dtype_from_name, load_model, resolve_model_dir
from engine.memory import default_kv_cache_budget, mebibytes
from engine.params import SamplingParams
from engine.preparation import PreparationStage
from engine.quantization import loaded_quantization, model_weight_bytes
from engine.sampler import DenoisingRequest, GenerationResult, StepEvent
from engine.scheduler import Scheduler, SchedulerConfig
from engine.stats import EngineStats
from engine.tokenizer import ChatTokenizer

CHAT_ROLES = ("system", "user", "assistant")


def _exactly_one_prompt(messages, prompt_token_ids, prompt) -> None:
    if sum(x is not None for x in (messages, prompt_token_ids, prompt)) != 1:
        raise ValueError("pass exactly one of messages=, prompt_token_ids= or prompt=")


def _token_id(value) -> int:
    """An int, numpy integer or 0-d integer tensor as an int; bools and floats are refused (TypeError)."""
    if isinstance(value, bool):
        raise TypeError("a bool is not a token id")
    return operator.index(value)


def _too_long(prompt_tokens: int, canvas: int, max_sequence_length: int) -> InvalidParameter:
    return InvalidParameter(
        "gen_length",
        f"the prompt ({prompt_tokens} tokens) plus the canvas ({canvas} tokens) is {prompt_tokens + canvas} "
        f"tokens, more than the model's maximum sequence length ({max_sequence_length})",
    )


class DiffusionEngine:
    def __init__(
        self,
        model: DiffusionLM,
        tokenizer: ChatTokenizer,
        device: torch.device,
        model_name: str,
        scheduler_config: SchedulerConfig | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.model_name = model_name
        # None → defaults overridden by DLLM_MAX_BATCH_SIZE / DLLM_MAX_WAITING / DLLM_MAX_WAIT_MS /
        # DLLM_KV_CACHE_BUDGET_MB; a budget left unset is the device's default, measured now that the model is loaded.
        config = scheduler_config or SchedulerConfig.from_env()
        if config.kv_cache_budget_bytes is None:
            config = dataclasses.replace(config, kv_cache_budget_bytes=default_kv_cache_budget(device))
        self.scheduler_config = config
        self.stats = EngineStats()  # every request, sync or async: they all go through the scheduler
        self.stats.set_kv_cache_budget(config.kv_cache_budget_bytes)
        self.stats.set_model(model_weight_bytes(model), loaded_quantization(model))
        self._scheduler: Scheduler | None = None  # started by the first request
        self._scheduler_lock = threading.Lock()
        # Tokenizes async requests off the event loop, bounded (see `astream` and engine/preparation.py).
        self._preparation = PreparationStage(config, self.stats)

    @classmethod
    def from_pretrained(
        cls,
        path_or_hub_id: str | Path | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        scheduler_config: SchedulerConfig | None = None,
        compile: bool | None = None,
        quantize: str | None = None,
    ) -> DiffusionEngine:
        """Load a checkpoint: a local directory, a hub id, or (None) the embedded model.

        The family (LLaDA / LLaDA-1.5, or Dream / DiffuCoder) is read from its config.json; no code from the
        checkpoint is run.

        dtype: None → bfloat16 on CUDA, float32 on CPU (bfloat16 on both when quantized); a torch dtype or its
            name ("bfloat16", "float16", "float32").
        scheduler_config: how the scheduler batches requests; None → `SchedulerConfig.from_env()`.
        compile: `torch.compile` the model forward (dynamic shapes); None → DLLM_COMPILE=1 (off by default).
        quantize: weight-only quantization of the transformer blocks' linear layers, "none", "int8", "int4" or
            "fp8" (engine/quantization.py); None → DLLM_QUANTIZE (none by default).
        """
        scheduler_config = scheduler_config or SchedulerConfig.from_env()  # bad env vars fail before loading
        model_dir = resolve_model_dir(path_or_hub_id)
        device = torch.device(device or default_device())
        if isinstance(dtype, str):
            dtype = dtype_from_name(dtype)
        model = load_model(model_dir, device, dtype, compile=compile, quantize=quantize)
        tokenizer = ChatTokenizer.from_pretrained(model_dir, model.config)
        is_hub_id = path_or_hub_id is not None and not Path(path_or_hub_id).is_dir()
        name = str(path_or_hub_id) if is_hub_id else model_dir.name
        return cls(model, tokenizer, device, model_name=name, scheduler_config=scheduler_config)

    @property
    def max_sequence_length(self) -> int:
        return self.model.config.max_sequence_length

    @property
    def quantization(self) -> str:
        """The loaded weights' quantization: "none", "int8", "int4" or "fp8"."""
        return loaded_quantization(self.model)

    @property
    def family(self) -> str:
        """The loaded model's family: "llada" or "dream"."""
        return self.model.config.family

    def prompt_ids(
        self,
        messages: list[dict] | None = None,
        prompt_token_ids: list[int] | None = None,
        *,
        prompt: str | None = None,
    ) -> list[int]:
        """The prompt's token ids, from exactly one of: chat `messages` (the model's chat template), token ids,
        or raw `prompt` text (no template; special-token text in it stays plain text, as in messages)."""
        _exactly_one_prompt(messages, prompt_token_ids, prompt)
        if prompt_token_ids is not None:
            return self._checked_token_ids(prompt_token_ids)
        if prompt is not None:
            self._check_prompt_text(prompt)
            ids = self.tokenizer.encode_prompt(prompt)
            if not ids:
                raise InvalidParameter("prompt", "must not be empty")
            return ids
        self._check_messages(messages)
        return self.tokenizer.encode_chat(messages)

    @staticmethod
    def _check_prompt_text(prompt) -> None:
        if not isinstance(prompt, str):
            raise InvalidParameter("prompt", "must be a string")

    def _check_messages(self, messages: list[dict] | None) -> None:
        if not messages:
            raise InvalidParameter("messages", "must contain at least one message")
        for message in messages:
            if (
                not isinstance(message, dict)
                or message.get("role") not in CHAT_ROLES
                or not isinstance(message.get("content"), str)
            ):
                raise InvalidParameter("messages", f"each message needs a role in {CHAT_ROLES} and string content")

    def check_prompt_size(
        self,
        messages: list[dict] | None = None,
        prompt_token_ids: list[int] | None = None,
        params: SamplingParams | None = None,
        *,
        prompt: str | None = None,
    ) -> int:
        """Refuse, without tokenizing, a prompt too long for any tokenization of it to fit; return its length.

        The length is in characters (messages, as the tokenizer will see them) or token ids. A token stands
        for at most `tokenizer.max_chars_per_token` characters, so a prompt longer than that many times the
        tokens left beside the canvas can only tokenize to too many (engine/tokenizer.py says why the bound
        holds). The bound errs one way only: it never refuses a prompt that fits, and a prompt under it may
        still be refused once tokenized. It costs a few string lengths, so it runs before the tokenizer.
        """
        _exactly_one_prompt(messages, prompt_token_ids, prompt)
        canvas = (params or SamplingParams()).gen_length
        room = self.max_sequence_length - canvas  # tokens left for the prompt
        if room < 1:
            raise InvalidParameter(
                "gen_length",
                f"the canvas ({canvas} tokens) leaves no room for the prompt in the model's maximum sequence "
                f"length ({self.max_sequence_length})",
            )
        if prompt_token_ids is not None:
            if isinstance(prompt_token_ids, (str, bytes)) or not hasattr(prompt_token_ids, "__len__"):
                raise InvalidParameter("prompt_token_ids", "must be a list of integer token ids")
            length = len(prompt_token_ids)
            if length > room:
                raise _too_long(length, canvas, self.max_sequence_length)
            return length
        if prompt is not None:  # raw text: every character reaches the tokenizer
            self._check_prompt_text(prompt)
            field, length = "prompt", len(prompt)
        else:
            self._check_messages(messages)
            field = "messages"
            length = sum(self.tokenizer.content_chars(message["content"]) for message in messages)
        per_token = self.tokenizer.max_chars_per_token
        if per_token is not None and length > room * per_token:
            raise InvalidParameter(
                field,
                f"the prompt is {length} characters long, more than any prompt that fits can be: the model's "
                f"maximum sequence length ({self.max_sequence_length} tokens) leaves {room} tokens beside the "
                f"canvas ({canvas}), at most {room * per_token} characters with this tokenizer",
            )
        return length

    def _checked_token_ids(self, values) -> list[int]:
        # Checked here, not left to the embedding: an out-of-range id would fail the shared forward, and
        # with it every request batched with this one (on CUDA, a device-side assert).
        rows = self.model.config.vocab_size
        try:
            if isinstance(values, (str, bytes)):
                raise TypeError
            ids = [_token_id(i) for i in values]
        except TypeError:
            raise InvalidParameter("prompt_token_ids", "must be a list of integer token ids") from None
        if not ids:
            raise InvalidParameter("prompt_token_ids", "must not be empty")
        if not all(0 <= i < rows for i in ids):
            raise InvalidParameter("prompt_token_ids", f"token ids must be between 0 and {rows - 1}")
        if self.tokenizer.mask_id in ids:
            raise InvalidParameter("prompt_token_ids", "must not contain the mask token id")
        return ids

    def new_request(
        self,
        messages: list[dict] | None = None,
        prompt_token_ids: list[int] | None = None,
        params: SamplingParams | None = None,
        *,
        prompt: str | None = None,
    ) -> DenoisingRequest:
        """Tokenize and validate one request; the result can be stepped alone or in a batch.

        Sampler fields the request left unset take the model family's defaults here, so the result (and the
        HTTP response's `diffusion` object) reports what actually ran.
        """
        defaults = self.model.config.sampler_defaults
        params = (params or SamplingParams()).with_model_defaults(defaults.block_schedule, defaults.confidence_metric)
        if params.kv_cache != "none" and self.family != "llada":
            # The cached forward (KVFrame) exists in the LLaDA model only; Dream's forward computes every position.
            raise InvalidParameter(
                "kv_cache", f'is not supported for {self.family} models yet; use "none" (confidence_threshold works)'
            )
        self.check_prompt_size(messages, prompt_token_ids, params, prompt=prompt)
        ids = self.prompt_ids(messages, prompt_token_ids, prompt=prompt)
        total = len(ids) + params.gen_length
        if total > self.max_sequence_length:
            raise _too_long(len(ids), params.gen_length, self.max_sequence_length)
        cache_bytes = self.model.kv_bytes(total) if params.kv_cache != "none" else 0
        budget = self.scheduler_config.kv_cache_budget_bytes
        if cache_bytes > budget:
            raise InvalidParameter(
                "kv_cache",
                f"this request's KV cache ({total} positions: prompt plus canvas) needs {mebibytes(cache_bytes)}, "
                f"more than the server's whole KV-cache budget ({mebibytes(budget)}, DLLM_KV_CACHE_BUDGET_MB); "
                'use a shorter canvas or kv_cache "none"',
            )
        return DenoisingRequest(
            ids,
            params,
            mask_id=self.tokenizer.mask_id,
            stop_ids=self.tokenizer.stop_ids,
            decode=self.tokenizer.decode,
            device=self.device,
            kv_cache_bytes=cache_bytes,
            timestep_eps=defaults.timestep_eps,
        )

    def step(self, requests: list[DenoisingRequest]) -> list[StepEvent | Exception]:
        """One shared forward for `requests` and each one's sampler step (see engine.batch)."""
        return denoise_step(self.model, requests, self.device, self.model.config.pad_token_id)

    # --- the sync API: blocks the calling thread; denoising runs on the scheduler thread, batched ------

    def stream(
        self,
        messages: list[dict] | None = None,
        prompt_token_ids: list[int] | None = None,
        params: SamplingParams | None = None,
        *,
        prompt: str | None = None,
    ) -> Iterator[StepEvent]:
        """Yield one StepEvent per forward pass of this request, sharing forwards with concurrent requests.

        Raises, before any event: InvalidParameter / ValueError (bad input), EngineOverloaded (waiting
        queue full), EngineShutdown. Later: the exception the request's step raised. Closing the
        iterator early frees the request's batch slot at the next step.
        """
        request = self.new_request(
            messages, prompt_token_ids, params, prompt=prompt
        )  # tokenized on the caller's thread
        handle = self._running_scheduler().submit(request)
        try:
            while True:
                event = handle.wait_event()
                yield event
                if event.finished:
                    return
        finally:
            handle.cancel()  # no-op once finished; otherwise the consumer left early

    def generate(
        self,
        messages: list[dict] | None = None,
        prompt_token_ids: list[int] | None = None,
        params: SamplingParams | None = None,
        *,
        prompt: str | None = None,
    ) -> GenerationResult:
        """The request's result (same errors as `stream`). Only the last event is delivered: the calling
        thread is woken once, not at every step, which a lone request would pay for in latency."""
        request = self.new_request(messages, prompt_token_ids, params, prompt=prompt)
        handle = self._running_scheduler().submit(request, every_event=False)
        try:
            event = handle.wait_event()
        finally:
            handle.cancel()  # no-op once finished; otherwise the caller was interrupted
        assert event.finished and event.result is not None
        return event.result

    # --- the async API (the HTTP service): denoising runs on the scheduler thread, batched -----------

    async def astream(
        self,
        messages: list[dict] | None = None,
        prompt_token_ids: list[int] | None = None,
        params: SamplingParams | None = None,
        *,
        prompt: str | None = None,
    ) -> AsyncGenerator[StepEvent, None]:
        """Yield one StepEvent per forward pass of this request, sharing forwards with concurrent requests.

        Raises, before any event: InvalidParameter / ValueError (bad input), EngineOverloaded (waiting
        queue full), EngineShutdown. Later: the exception the request's step raised. Leaving the loop
        early, `aclose()` or cancelling the task frees the request's batch slot at the next step.
        """
        # Tokenizing takes time that grows with the prompt, so it runs in the preparation stage (off the event
        # loop, bounded: engine/preparation.py). What its length alone refuses is refused here first, at the
        # cost of a few string lengths. Validation errors still surface before any event.
        loop = asyncio.get_running_loop()
        prompt_chars = self.check_prompt_size(messages, prompt_token_ids, params, prompt=prompt)
        scheduler = self._running_scheduler()
        request = await self._preparation.run(
            prompt_chars, scheduler.load(), lambda: self.new_request(messages, prompt_token_ids, params, prompt=prompt)
        )
        handle = self._running_scheduler().submit(request, loop)
        try:
            while True:
                event = await handle.next_event()
                yield event
                if event.finished:
                    return
        finally:
            handle.cancel()  # no-op once finished; otherwise the consumer left early

    async def agenerate(
        self,
        messages: list[dict] | None = None,
        prompt_token_ids: list[int] | None = None,
        params: SamplingParams | None = None,
        *,
        prompt: str | None = None,
    ) -> GenerationResult:
        """`generate` for the event loop: the result of `astream`'s last event (same errors)."""
        async with aclosing(self.astream(messages, prompt_token_ids, params, prompt=prompt)) as events:
            async for event in events:
                if event.finished:
                    return event.result
        raise RuntimeError("the sampler stopped without finishing")  # unreachable: every canvas fills up

    def shutdown(self, drain: bool = False, timeout: float | None = None) -> None:
        """Stop the scheduler thread. Pending requests fail with EngineShutdown (drain=False) or are finished
        first (drain=True); none is left hanging. A later request starts a fresh scheduler."""
        with self._scheduler_lock:
            scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.shutdown(drain=drain, timeout=timeout)

    def _running_scheduler(self) -> Scheduler:
        with self._scheduler_lock:
            if self._scheduler is None or not self._scheduler.alive:
                self._scheduler = Scheduler(self, self.scheduler_config, self.stats)
                self._scheduler.start()
            return self._scheduler
