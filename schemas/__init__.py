"""Strict Pydantic models of the OpenAI-compatible surface (ADR 005, docs/adr/005-openai-compatible-api.md)
and the pure functions that build responses, stream chunks and errors. No torch, no engine, no web
framework here."""
