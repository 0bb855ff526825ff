"""`DiffusionEngine`: the offline Python API (DESIGN §3)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from engine.loading import default_device, load_model, resolve_model_dir
from engine.batch import denoise_step
from engine.model import LLaDAModelLM
from engine.params import InvalidParameter, SamplingParams
from engine.sampler import DenoisingRequest, GenerationResult, StepEvent
from engine.tokenizer import ChatTokenizer

CHAT_ROLES = ("system", "user", "assistant")


class DiffusionEngine:
    def __init__(self, model: LLaDAModelLM, tokenizer: ChatTokenizer, device: torch.device, model_name: str):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.model_name = model_name

    @classmethod
    def from_pretrained(
        cls,
        path_or_hub_id: str | Path | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
    ) -> DiffusionEngine:
        """Load a LLaDA-format checkpoint: a local directory, a hub id, or (None) the embedded model.

        dtype: None → bfloat16 on CUDA, float32 on CPU; a torch dtype or its name ("bfloat16", "float32").
        """
        model_dir = resolve_model_dir(path_or_hub_id)
        device = torch.device(device or default_device())
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        model = load_model(model_dir, device, dtype)
        tokenizer = ChatTokenizer.from_pretrained(model_dir, model.config)
        name = str(path_or_hub_id) if path_or_hub_id is not None and not Path(path_or_hub_id).is_dir() else model_dir.name
        return cls(model, tokenizer, device, model_name=name)

    @property
    def max_sequence_length(self) -> int:
        return self.model.config.max_sequence_length

    def prompt_ids(self, messages: list[dict] | None = None, prompt_token_ids: list[int] | None = None) -> list[int]:
        if (messages is None) == (prompt_token_ids is None):
            raise ValueError("pass exactly one of messages= or prompt_token_ids=")
        if prompt_token_ids is not None:
            ids = list(prompt_token_ids)
            if not ids:
                raise InvalidParameter("prompt_token_ids", "must not be empty")
            if any(i == self.tokenizer.mask_id for i in ids):
                raise InvalidParameter("prompt_token_ids", "must not contain the mask token id")
            return ids
        if not messages:
            raise InvalidParameter("messages", "must contain at least one message")
        for message in messages:
            if message.get("role") not in CHAT_ROLES or not isinstance(message.get("content"), str):
                raise InvalidParameter("messages", f"each message needs a role in {CHAT_ROLES} and string content")
        return self.tokenizer.encode_chat(messages)

    def new_request(
        self,
        messages: list[dict] | None = None,
        prompt_token_ids: list[int] | None = None,
        params: SamplingParams | None = None,
    ) -> DenoisingRequest:
        """Tokenize and validate one request; the result can be stepped alone or in a batch."""
        params = params or SamplingParams()
        ids = self.prompt_ids(messages, prompt_token_ids)
        total = len(ids) + params.gen_length
        if total > self.max_sequence_length:
            raise InvalidParameter(
                "gen_length",
                f"the prompt ({len(ids)} tokens) plus the canvas ({params.gen_length} tokens) is {total} tokens, "
                f"more than the model's maximum sequence length ({self.max_sequence_length})",
            )
        return DenoisingRequest(
            ids,
            params,
            mask_id=self.tokenizer.mask_id,
            stop_ids=self.tokenizer.stop_ids,
            decode=self.tokenizer.decode,
            device=self.device,
        )

    def step(self, requests: list[DenoisingRequest]) -> list[StepEvent | Exception]:
        """One shared forward for `requests` and each one's sampler step (see engine.batch)."""
        return denoise_step(self.model, requests, self.device, self.model.config.pad_token_id)

    def stream(
        self,
        messages: list[dict] | None = None,
        prompt_token_ids: list[int] | None = None,
        params: SamplingParams | None = None,
    ) -> Iterator[StepEvent]:
        """Denoise one request on the calling thread, yielding one event per forward pass."""
        request = self.new_request(messages, prompt_token_ids, params)
        while not request.finished:
            (event,) = self.step([request])
            if isinstance(event, Exception):
                raise event
            yield event

    def generate(
        self,
        messages: list[dict] | None = None,
        prompt_token_ids: list[int] | None = None,
        params: SamplingParams | None = None,
    ) -> GenerationResult:
        for event in self.stream(messages, prompt_token_ids, params):
            if event.finished:
                return event.result
        raise RuntimeError("the sampler stopped without finishing")  # unreachable: every canvas fills up
