"""The HTTP layer: the OpenAI-compatible FastAPI app that the BentoML service (service.py) mounts.

- `app.py`: the app, its routes and handlers; the one place where the engine and the schemas meet.
- `streaming.py`: the connection while a request runs: reading the body, awaiting the first event,
  watching for disconnects, writing server-sent events.
- `middleware.py`: per-request context (X-Request-ID, the log line, last-resort 500s) and the
  response-start timeout that replaces BentoML's.
- `errors.py`: the engine's exceptions → HTTP errors, and how an `APIError` becomes a response.
- `engine_setup.py`, `logs.py`: for the service, the engine from the environment (checked before any
  worker starts, then loaded) and the logging setup.
- `playground.py`, `playground_settings.py`, `static/`: GET /playground, a page that streams from the
  public API and draws the canvas denoising, and the settings its form is built from.

Like service.py, nothing here imports torch at module level: `bentoml build` imports the service.
"""
