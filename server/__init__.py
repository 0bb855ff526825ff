"""The host adapter: what serves the portable app (`api`, an ASGI app) with BentoML and uvicorn.

service.py is the BentoML service itself; everything here is what it needs beside the app:
- `settings.py`: every DLLM_* setting of the HTTP side, read from the environment once at startup and
  checked together; the app's share (`ApiSettings`) is handed to `create_app`.
- `connections.py`: below the app, in uvicorn's HTTP protocol: idle, head and stalled-reader timeouts,
  the connection cap (uvicorn's internals, swapped in before its config loads).
- `middleware.py`: around the whole host app (BentoML's routes too): `RequestGuard` (503 while draining,
  JSON-only bodies, the body deadline) and `ResponseStartTimeout` in place of BentoML's timeout middleware.
- `drain.py`: SIGTERM drains running requests before uvicorn's own shutdown.
- `engine_setup.py`, `logs.py`: the engine from the environment (checked before any worker starts, then
  loaded) and the logging setup around BentoML's.
- `native.py`, `index_page.py`: BentoML's own API (`/generate`, `/generate_stream`) and its explorer (`/bentoml`).

The dependency goes one way: server imports api, schemas and (inside functions) engine; nothing under
api/, schemas/ or engine/ imports server, bentoml or uvicorn (tests/test_service_layout.py). Like
service.py, nothing here imports torch at module level: `bentoml build` imports the service.
"""
