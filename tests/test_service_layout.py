"""Import boundaries (docs/design.md, "Layout"): `engine` never imports the HTTP side; `schemas` never
imports torch, the engine or a web framework; the HTTP layer (`api`) does not depend on BentoML; importing
`service.py` (what `bentoml build` does) loads no torch, and service.py stays thin."""

from __future__ import annotations

import subprocess
import sys

from tests.fixture_paths import REPO_ROOT


def modules_after(statement: str) -> set[str]:
    probe = f"import sys; {statement}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    return {name.split(".")[0] for name in out.stdout.split()}


def test_schemas_import_no_torch_engine_or_framework():
    loaded = modules_after(
        "import schemas.chat, schemas.completions, schemas.errors, schemas.fields, schemas.openapi, "
        "schemas.request_id, schemas.responses, schemas.sampling"
    )
    assert not loaded & {"torch", "engine", "fastapi", "starlette", "bentoml", "transformers"}


def test_engine_imports_nothing_of_the_http_side():
    loaded = modules_after("import engine")
    assert "torch" in loaded
    assert not loaded & {"schemas", "api", "service", "fastapi", "bentoml"}


def test_http_layer_imports_no_torch_engine_or_bentoml():
    loaded = modules_after(
        "import api.app, api.connections, api.docs, api.drain, api.engine_setup, api.errors, api.logs, "
        "api.middleware, api.native, api.settings, api.streaming"
    )
    assert "fastapi" in loaded
    assert not loaded & {"torch", "engine", "transformers", "bentoml"}


def test_importing_the_service_loads_no_torch():
    loaded = modules_after("import service")
    assert "bentoml" in loaded and "fastapi" in loaded
    assert not loaded & {"torch", "engine", "transformers"}


def test_the_service_module_stays_thin():
    """service.py is the Bento class and what BentoML needs; the HTTP layer's concerns live in `api`."""
    assert len((REPO_ROOT / "service.py").read_text().splitlines()) <= 150


def test_schema_constants_mirror_the_engine():
    import engine.params as engine_params
    import schemas.chat as chat

    for name in (
        "DEFAULT_GEN_LENGTH",
        "DEFAULT_STEPS",
        "MAX_STEPS",
        "MAX_STOP_STRINGS",
        "MAX_LOCAL_LEAP_RADIUS",
        "SEED_MIN",
        "SEED_MAX",
    ):
        assert getattr(chat, name) == getattr(engine_params, name), name
    fields = chat.ChatCompletionRequest.model_fields
    assert next(m.le for m in fields["temperature"].metadata if hasattr(m, "le")) == engine_params.MAX_TEMPERATURE
    for name, default in engine_params.LOCAL_LEAP_DEFAULTS.items():
        assert f"default {default}" in fields[name].description, name
