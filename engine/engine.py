"""`DiffusionEngine`: the Python API (docs/design.md, "Engine contract").

One execution model: every request, from the sync API (`stream`, `generate`) or the async one
(`astream`, `agenerate`), is denoised on the engine's one scheduler thread, so the model only ever runs
there and requests from both share forwards. The sync calls block their own thread until the events
arrive; the async ones await them on their event loop.

Every entry point takes the prompt as one `Prompt` (engine/prompt.py) or builds it from exactly one of the
keywords `messages=`, `prompt_token_ids=` or `prompt=` (raw text), once; the rest of the engine sees only
the `Prompt`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import operator
import threading
import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from contextlib import aclosing
from pathlib import Path

import torch

from engine.batch import denoise_step
from engine.block_sampler import BlockDiffusionRequest
from engine.compiled import static_shapes_of
from engine.config import SamplerDefaults
from engine.dream_cache import DreamCachedRequest
from engine.errors import InvalidParameter
from engine.family_rules import check_family_rules
from engine.loading import DiffusionLM, default_device, dtype_from_name, load_model, resolve_model_dir
from engine.memory import (
    default_kv_cache_budget,
    default_max_prompt_tokens,
    default_step_token_budget,
    mebibytes,
)
from engine.params import SamplingParams
from engine.preparation import PreparationStage
from engine.prompt import Prompt
from engine.quantization import loaded_quantization, model_weight_bytes
from engine.sampler import DenoisingRequest, GenerationResult, StepEvent
from engine.scheduler import Scheduler, SchedulerConfig
from engine.stats import EngineStats
from engine.tokenizer import ChatTokenizer
from engine.warm_up import WarmUpPlan, run_warm_up

logger = logging.getLogger(__name__)


def _token_id(value) -> int:
    """An int, numpy integer or 0-d integer tensor as an int; bools and floats are refused (TypeError)."""
    if isinstance(value, bool):
        raise TypeError("a bool is not a token id")
    return operator.index(value)


# Tokenizing a message costs about as much as this many characters of text beyond its content (a call into
# the tokenizer per message for a trimming template, the template's own text): what the lanes count it as.
MESSAGE_TOKENIZING_CHARS = 64


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
        if config.max_prompt_tokens is None:
            config = dataclasses.replace(config, max_prompt_tokens=default_max_prompt_tokens(device))
        if config.step_token_budget is None:
            config = dataclasses.replace(config, step_token_budget=default_step_token_budget(device))
        self.scheduler_config = config
        self.stats = EngineStats()  # every request, sync or async: they all go through the scheduler
        self.stats.set_kv_cache_budget(config.kv_cache_budget_bytes)
        self.stats.set_model(model_weight_bytes(model), loaded_quantization(model))
        self.warming_up = False  # readiness is false while warm_up runs
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

        The family (LLaDA / LLaDA-1.5, Dream / DiffuCoder, or LLaDA2.x) is read from its config.json; no code
        from the checkpoint is run.

        dtype: None → bfloat16 on CUDA, float32 on CPU (bfloat16 on both when quantized); a torch dtype or its
            name ("bfloat16", "float16", "float32").
        scheduler_config: how the scheduler batches requests; None → `SchedulerConfig.from_env()`.
        compile: the compiled static-shape forward (engine/compiled.py: steps padded into shape buckets, inductor
            on CPU, CUDA graphs on CUDA); None → DLLM_COMPILE=1 (off by default: not faster on the CPUs measured,
            docs/benchmarks.md). Refused with quantized weights. Call `warm_up` to compile before traffic.
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
        """The loaded model's family: "llada", "dream" or "llada2"."""
        return self.model.config.family

    @property
    def sampler_defaults(self) -> SamplerDefaults:
        """The loaded family's own sampler settings; `SamplingParams.for_model(engine.sampler_defaults, ...)`
        builds a request's parameters with them (what the HTTP API does)."""
        return self.model.config.sampler_defaults

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids: chat messages through the model's chat template, raw text through the
        tokenizer alone (special-token text in it stays plain text, as in messages), token ids as they are
        once checked against the model."""
        if prompt.kind == "token_ids":
            return self._checked_token_ids(prompt.value)
        if prompt.kind == "text":
            ids = self.tokenizer.encode_prompt(prompt.value)
            if not ids:
                raise InvalidParameter("prompt", "must not be empty")
            return ids
        return self.tokenizer.encode_chat(prompt.messages)

    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt served: the operator's limit (DLLM_MAX_PROMPT_TOKENS), or the device's default."""
        limit = self.scheduler_config.max_prompt_tokens
        assert limit is not None  # resolved in __init__
        return limit

    @property
    def max_prompt_messages(self) -> int | None:
        """More chat messages than this can never fit, whatever their content (the bound of
        `check_prompt_size` for empty messages, beside the smallest canvas). None: the template adds nothing
        countable per message."""
        overhead = self.tokenizer.message_overhead
        per_token = self.tokenizer.max_chars_per_token
        per_message = overhead.special_tokens + (overhead.chars / per_token if per_token is not None else 0)
        if per_message <= 0:
            return None
        return int(min(self.max_sequence_length - 1, self.max_prompt_tokens) / per_message)

    def check_prompt_size(self, prompt: Prompt, params: SamplingParams | None = None) -> int:
        """Refuse, without tokenizing, a prompt too long for any tokenization of it to fit; return an estimate
        of the work tokenizing it takes, in characters (what the preparation stage sorts its lanes by).

        Fit means both the model's context beside the canvas and the server's maximum prompt length. A token
        stands for at most `tokenizer.max_chars_per_token` characters, and the chat template adds at least
        `tokenizer.message_overhead` per message (special tokens, each one token, and text tokenized with the
        content), so the prompt has at least that many tokens (engine/tokenizer.py says why the bounds hold).
        The bound errs one way only: it never refuses a prompt that fits, and a prompt under it may still be
        refused once tokenized. It costs a few string lengths, so it runs before the tokenizer: a body of
        thousands of empty messages is refused at once instead of after seconds of tokenizing.
        """
        canvas = (params or SamplingParams()).gen_length
        context_room = self.max_sequence_length - canvas
        if context_room < 1:
            raise InvalidParameter(
                "gen_length",
                f"the canvas ({canvas} tokens) leaves no room for the prompt in the model's maximum sequence "
                f"length ({self.max_sequence_length})",
            )
        room = min(context_room, self.max_prompt_tokens)  # tokens left for the prompt
        if prompt.kind == "token_ids":
            length = len(prompt.value)
            if length > room:
                raise self._prompt_too_long(prompt, length, canvas)
            return length
        messages = 0
        if prompt.kind == "text":  # raw text: every character reaches the tokenizer
            length = len(prompt.value)
        else:
            messages = len(prompt.value)
            length = sum(self.tokenizer.content_chars(message["content"]) for message in prompt.value)
        overhead = self.tokenizer.message_overhead
        special_tokens = messages * overhead.special_tokens
        text_chars = length + messages * overhead.chars
        per_token = self.tokenizer.max_chars_per_token
        at_least = special_tokens + (-(-text_chars // per_token) if per_token is not None else 0)
        if at_least > room:
            limit = (
                f"the model's maximum sequence length ({self.max_sequence_length} tokens) leaves {context_room} "
                f"beside the canvas ({canvas})"
                if room == context_room
                else f"the server takes prompts of at most {room} tokens (DLLM_MAX_PROMPT_TOKENS)"
            )
            raise InvalidParameter(
                prompt.field,
                f"the prompt ({length} characters{f' in {messages} messages' if messages else ''}) is at least "
                f"{at_least} tokens with this model's tokenizer and chat template, more than any prompt that fits: "
                f"{limit}",
            )
        return text_chars + messages * MESSAGE_TOKENIZING_CHARS

    def _prompt_too_long(self, prompt: Prompt, prompt_tokens: int, canvas: int) -> InvalidParameter:
        if prompt_tokens > self.max_prompt_tokens:
            return InvalidParameter(
                prompt.field,
                f"the prompt ({prompt_tokens} tokens) is longer than this server takes ({self.max_prompt_tokens} "
                "tokens, DLLM_MAX_PROMPT_TOKENS)",
            )
        return _too_long(prompt_tokens, canvas, self.max_sequence_length)

    def _checked_token_ids(self, values) -> list[int]:
        # Checked here, not left to the embedding: an out-of-range id would fail the shared forward, and
        # with it every request batched with this one (on CUDA, a device-side assert).
        rows = self.model.config.vocab_size
        try:
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
        prompt: Prompt | str | None = None,
        params: SamplingParams | None = None,
        *,
        messages: list[dict] | None = None,
        prompt_token_ids: Sequence[int] | None = None,
        prompt_chars: int | None = None,
    ) -> DenoisingRequest | BlockDiffusionRequest:
        """Tokenize and validate one request; the result can be stepped alone or in a batch.

        The prompt is a `Prompt`, raw text, or the `messages=` / `prompt_token_ids=` keyword. Sampler fields
        the request left unset take the model family's defaults here, so the result (and the HTTP response's
        `diffusion` object) reports what actually ran. `prompt_chars`: the prompt's length as
        `check_prompt_size` measured it already (the async API measures before it queues the request here);
        None measures it now.
        """
        prompt = Prompt.of(prompt, messages=messages, prompt_token_ids=prompt_token_ids)
        defaults = self.sampler_defaults
        params = params or SamplingParams.for_model(defaults)
        check_family_rules(params, self.family)
        params = params.with_model_defaults(defaults.block_schedule, defaults.confidence_metric)
        params.check_family(self.family)
        if prompt_chars is None:
            self.check_prompt_size(prompt, params)
        ids = self.prompt_ids(prompt)
        if len(ids) > self.max_prompt_tokens:
            raise self._prompt_too_long(prompt, len(ids), params.gen_length)
        if self.family == "llada2":
            return self._new_block_request(ids, params)
        total = len(ids) + params.gen_length
        if total > self.max_sequence_length:
            raise _too_long(len(ids), params.gen_length, self.max_sequence_length)
        cache_bytes = self.model.kv_bytes(total) if params.kv_cache != "none" else 0
        self._check_kv_budget(
            cache_bytes,
            "kv_cache",
            f"KV cache ({total} positions: prompt plus canvas)",
            'use a shorter canvas or kv_cache "none"',
        )
        # Dream's shifted logits change which positions a cached block's forwards decide (engine/dream_cache.py).
        request_class = DreamCachedRequest if self.family == "dream" and params.kv_cache != "none" else DenoisingRequest
        return request_class(
            ids, params, kv_cache_bytes=cache_bytes, timestep_eps=defaults.timestep_eps, **self._sampler_needs()
        )

    def _new_block_request(self, ids: list[int], params: SamplingParams) -> BlockDiffusionRequest:
        """A block-diffusion (LLaDA2) request. Its canvas is rounded up to whole blocks aligned to position 0,
        so the model's length limit and the cache's size are counted on that."""
        block = params.block_length
        canvas = -(-(len(ids) + params.gen_length) // block) * block
        if canvas > self.max_sequence_length:
            raise InvalidParameter(
                "block_length" if block > params.gen_length else "gen_length",  # the one to make smaller
                f"the prompt ({len(ids)} tokens) plus the canvas ({params.gen_length} tokens), rounded up to whole "
                f"blocks of {block}, is {canvas} tokens, more than the model's maximum sequence length "
                f"({self.max_sequence_length})",
            )
        cache_bytes = self.model.kv_bytes(canvas)
        self._check_kv_budget(
            cache_bytes, "gen_length", f"block KV cache ({canvas} positions)", "use a shorter prompt or canvas"
        )
        return BlockDiffusionRequest(ids, params, kv_cache_bytes=cache_bytes, **self._sampler_needs())

    def _sampler_needs(self) -> dict:
        """What a request's sampler takes from the model and its tokenizer, whichever kind of request it is."""
        return {
            "mask_id": self.tokenizer.mask_id,
            "stop_ids": self.tokenizer.stop_ids,
            "decode": self.tokenizer.decode,
            "device": self.device,
        }

    def _check_kv_budget(self, cache_bytes: int, field: str, cache: str, advice: str) -> None:
        """Refuse a request whose cache could never be admitted: it would wait for memory forever."""
        budget = self.scheduler_config.kv_cache_budget_bytes
        if cache_bytes > budget:
            raise InvalidParameter(
                field,
                f"this request's {cache} needs {mebibytes(cache_bytes)}, more than the server's whole KV-cache "
                f"budget ({mebibytes(budget)}, DLLM_KV_CACHE_BUDGET_MB); {advice}",
            )

    def step(self, requests: list[DenoisingRequest]) -> list[StepEvent | Exception]:
        """One shared forward for `requests` and each one's sampler step (see engine.batch)."""
        events = denoise_step(self.model, requests, self.device, self.model.config.pad_token_id)
        static = static_shapes_of(self.model)
        if static is not None:
            self.stats.set_compile(len(static.shapes), static.recompiles)
        return events

    @property
    def compiled(self) -> bool:
        """Whether steps run the compiled static-shape forward."""
        return static_shapes_of(self.model) is not None

    @property
    def ready(self) -> bool:
        """False while `warm_up` runs (the service's readiness probe reads it)."""
        return not self.warming_up

    def warm_up(self, plan: WarmUpPlan | None = None) -> float:
        """Run one step of each configured shape bucket (engine/warm_up.py), so that a compiled forward has its
        graphs before the first request; returns (and logs, and exposes as dllm_warm_up_seconds) the seconds it
        took. Call it before serving. Eager, it only exercises the path. Compiled, it also reserves the KV pool
        at its serving size (the graphs are specialised on it), and every graph compiled later counts as a recompile."""
        plan = plan or WarmUpPlan.from_env()
        self.warming_up = True
        started = time.perf_counter()
        try:
            _on_a_thread_of_its_own(run_warm_up, self, plan)
        finally:
            self.warming_up = False
        seconds = time.perf_counter() - started
        static = static_shapes_of(self.model)
        if static is not None:
            static.warmed_up = True
            self.stats.set_compile(len(static.shapes), static.recompiles)
        self.stats.set_warm_up(seconds)
        logger.info(
            "warm-up: %s in %.1fs (%s forward, %d shapes)",
            plan,
            seconds,
            "compiled" if static is not None else "eager",
            0 if static is None else len(static.shapes),
        )
        return seconds

    # --- the sync API: blocks the calling thread; denoising runs on the scheduler thread, batched ------

    def stream(
        self,
        prompt: Prompt | str | None = None,
        params: SamplingParams | None = None,
        *,
        messages: list[dict] | None = None,
        prompt_token_ids: Sequence[int] | None = None,
    ) -> Iterator[StepEvent]:
        """Yield one StepEvent per forward pass of this request, sharing forwards with concurrent requests.

        Raises, before any event: InvalidParameter / ValueError (bad input), EngineOverloaded (waiting
        queue full), EngineShutdown. Later: the exception the request's step raised. Closing the
        iterator early frees the request's batch slot at the next step.
        """
        prompt = Prompt.of(prompt, messages=messages, prompt_token_ids=prompt_token_ids)
        request = self.new_request(prompt, params)  # tokenized on the caller's thread
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
        prompt: Prompt | str | None = None,
        params: SamplingParams | None = None,
        *,
        messages: list[dict] | None = None,
        prompt_token_ids: Sequence[int] | None = None,
    ) -> GenerationResult:
        """The request's result (same errors as `stream`). Only the last event is delivered: the calling
        thread is woken once, not at every step, which a lone request would pay for in latency."""
        prompt = Prompt.of(prompt, messages=messages, prompt_token_ids=prompt_token_ids)
        request = self.new_request(prompt, params)
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
        prompt: Prompt | str | None = None,
        params: SamplingParams | None = None,
        *,
        messages: list[dict] | None = None,
        prompt_token_ids: Sequence[int] | None = None,
    ) -> AsyncGenerator[StepEvent, None]:
        """Yield one StepEvent per forward pass of this request, sharing forwards with concurrent requests.

        Raises, before any event: InvalidParameter / ValueError (bad input), EngineOverloaded (waiting
        queue full), EngineShutdown. Later: the exception the request's step raised. Leaving the loop
        early, `aclose()` or cancelling the task frees the request's batch slot at the next step.
        """
        # Tokenizing takes time that grows with the prompt, so it runs in the preparation stage (off the event
        # loop, bounded: engine/preparation.py). What its length alone refuses is refused here first, at the
        # cost of a few string lengths, and only here (`prompt_chars`). Validation errors still surface before
        # any event.
        loop = asyncio.get_running_loop()
        prompt = Prompt.of(prompt, messages=messages, prompt_token_ids=prompt_token_ids)
        chars = self.check_prompt_size(prompt, params)
        scheduler = self._running_scheduler()
        request = await self._preparation.run(
            chars, scheduler.load(), lambda: self.new_request(prompt, params, prompt_chars=chars)
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
        prompt: Prompt | str | None = None,
        params: SamplingParams | None = None,
        *,
        messages: list[dict] | None = None,
        prompt_token_ids: Sequence[int] | None = None,
    ) -> GenerationResult:
        """`generate` for the event loop: the result of `astream`'s last event (same errors)."""
        prompt = Prompt.of(prompt, messages=messages, prompt_token_ids=prompt_token_ids)
        async with aclosing(self.astream(prompt, params)) as events:
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


def _on_a_thread_of_its_own(function, *args) -> None:
    """Call `function(*args)` on a new thread and wait for it, raising what it raised.

    libgomp keeps a team of OpenMP workers for every thread that has run a parallel region, until that thread
    ends. Warm-up run on the caller's (main) thread would leave one behind, and with more OpenMP threads than
    one, libgomp then manages more threads than there are cores and makes the scheduler thread's workers
    sleep after every region: each step 3.4x slower at 2 threads (benchmarks/second_thread.py,
    docs/scheduler.md). A thread that ends takes its team with it."""
    raised: list[BaseException] = []

    def body() -> None:
        try:
            function(*args)
        except BaseException as error:  # handed to the caller below
            raised.append(error)

    thread = threading.Thread(target=body, name="dllm-warm-up")
    thread.start()
    thread.join()
    if raised:
        raise raised[0]
