"""Strict Pydantic models of the OpenAI-compatible surface (ADR 005, docs/adr/005-openai-compatible-api.md)
and the pure functions that build responses, stream chunks and errors. No torch, no web framework, and of
the engine only its torch-free definitions (the sampler knobs of `engine.params`, `engine.prompt`)."""
