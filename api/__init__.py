"""The HTTP layer: the OpenAI-compatible FastAPI app, a portable ASGI app; the BentoML service (service.py)
mounts it, with the host adapter (`server`) around it.

- `app.py`: `create_app(settings)`, its routes and handlers; the one place where the engine and the schemas meet.
- `settings.py`: `ApiSettings`, what the app is configured with (the host reads them from the environment).
- `streaming.py`: the connection while a request runs: reading the body, awaiting the first event,
  watching for disconnects, writing server-sent events.
- `middleware.py`: per-request context (X-Request-ID, the log line, last-resort 500s).
- `errors.py`: the engine's exceptions → HTTP errors, and how an `APIError` becomes a response.
- `docs.py`: /docs and /redoc, served from local files.
- `playground.py`, `playground_settings.py`, `static/`: GET /playground, a page that streams from the
  public API and draws the canvas denoising, and the settings its form is built from.

Nothing here imports BentoML, uvicorn or `server` (tests/test_service_layout.py), nor torch at module level:
`bentoml build` imports the service.
"""
