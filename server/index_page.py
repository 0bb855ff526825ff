"""What BentoML's own index page (`/`) shows about this service: its description, also before the service is
built into a Bento."""

from __future__ import annotations

import bentoml

from schemas.openapi import PAGE_LINKS

SERVICE_DESCRIPTION = f"""
**dllm-serve** serves a diffusion language model (LLaDA, Dream, DiffuCoder) behind an OpenAI-compatible API.

{PAGE_LINKS}

- `POST /v1/chat/completions` and `POST /v1/completions`: OpenAI's Chat Completions and (legacy) Completions,
  whole or streamed; point any OpenAI client at `http://<this host>/v1`. Every field, its diffusion meaning and
  what is refused: the [API reference](/docs).
- `GET /v1/models`: the loaded model.
- `POST /generate` and `POST /generate_stream` (below): the same engine through BentoML's own API, for
  `bentoml.SyncHTTPClient` / `AsyncHTTPClient` and this page's "Try it out".
- `/readyz`, `/livez`, `/metrics`: readiness, liveness, Prometheus metrics.
""".strip()


class DescribedService(bentoml.Service):
    """BentoML's index page (`/`) shows the service's `doc`, which until the service is built into a Bento is
    a generic README ("This is a Machine Learning Service created with BentoML"): show the description."""

    @property
    def doc(self) -> str:
        return self.bento.doc if self.bento is not None and self.bento.doc else self.description or ""
