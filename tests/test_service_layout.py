"""Import boundaries (docs/design.md, "Layout"): `engine` never imports the HTTP side; `schemas` never
imports torch, a web framework or more of the engine than its torch-free definitions (the sampler knobs,
the prompt, the errors); the HTTP layer (`api`) does not depend on BentoML; importing `service.py` (what
`bentoml build` does) loads no torch, and service.py stays thin."""

from __future__ import annotations

import subprocess
import sys

from tests.fixture_paths import REPO_ROOT

# The engine modules that load no torch: what the HTTP side may import.
TORCH_FREE_ENGINE = {"engine", "engine.errors", "engine.params", "engine.prompt"}


def full_modules_after(statement: str) -> set[str]:
    probe = f"import sys; {statement}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def modules_after(statement: str) -> set[str]:
    return {name.split(".")[0] for name in full_modules_after(statement)}


def engine_modules_after(statement: str) -> set[str]:
    return {name for name in full_modules_after(statement) if name.split(".")[0] == "engine"}


SCHEMAS = (
    "import schemas.chat, schemas.completions, schemas.errors, schemas.fields, schemas.knobs, schemas.openapi, "
    "schemas.request_id, schemas.responses, schemas.sampling"
)
API = (
    "import api.app, api.connections, api.docs, api.drain, api.engine_setup, api.errors, api.logs, "
    "api.middleware, api.native, api.settings, api.streaming"
)


def test_schemas_import_no_torch_engine_or_framework():
    loaded = modules_after(SCHEMAS)
    assert not loaded & {"torch", "fastapi", "starlette", "bentoml", "transformers"}
    assert engine_modules_after(SCHEMAS) <= TORCH_FREE_ENGINE


def test_importing_schemas_loads_no_torch():
    # The check of issue 24, as written there.
    subprocess.run(
        [sys.executable, "-c", "import schemas, sys; assert 'torch' not in sys.modules"], cwd=REPO_ROOT, check=True
    )


def test_the_knobs_and_the_prompt_load_no_torch():
    loaded = full_modules_after("import engine.params, engine.prompt; from engine import SamplingParams, Prompt")
    assert "torch" not in {name.split(".")[0] for name in loaded}
    assert {name for name in loaded if name.split(".")[0] == "engine"} == TORCH_FREE_ENGINE


def test_engine_imports_nothing_of_the_http_side():
    loaded = modules_after("from engine import DiffusionEngine")
    assert "torch" in loaded
    assert not loaded & {"schemas", "api", "service", "fastapi", "bentoml"}


def test_http_layer_imports_no_torch_engine_or_bentoml():
    loaded = modules_after(API)
    assert "fastapi" in loaded
    assert not loaded & {"torch", "transformers", "bentoml"}
    assert engine_modules_after(API) <= TORCH_FREE_ENGINE


def test_importing_the_service_loads_no_torch():
    loaded = modules_after("import service")
    assert "bentoml" in loaded and "fastapi" in loaded
    assert not loaded & {"torch", "transformers"}
    assert engine_modules_after("import service") <= TORCH_FREE_ENGINE


def test_the_service_module_stays_thin():
    """service.py is the Bento class and what BentoML needs; the HTTP layer's concerns live in `api`."""
    assert len((REPO_ROOT / "service.py").read_text().splitlines()) <= 150


def test_the_schema_takes_its_bounds_from_the_engine():
    # The constants are defined once, in engine.params; the schema (and so /docs) shows them.
    import engine.params as engine_params
    import schemas.chat as chat

    properties = chat.ChatCompletionRequest.model_json_schema()["properties"]

    def bound(name: str, key: str):
        return next(member[key] for member in properties[name]["anyOf"] if key in member)

    assert bound("num_denoising_steps", "maximum") == engine_params.MAX_STEPS
    assert bound("local_leap_radius", "maximum") == engine_params.MAX_LOCAL_LEAP_RADIUS
    assert bound("temperature", "maximum") == engine_params.MAX_TEMPERATURE
    assert (bound("seed", "minimum"), bound("seed", "maximum")) == (engine_params.SEED_MIN, engine_params.SEED_MAX)
    assert f"up to {engine_params.MAX_STOP_STRINGS} strings" in properties["stop"]["description"]
    assert f"min({engine_params.DEFAULT_STEPS}, gen_length)" in properties["num_denoising_steps"]["description"]
    assert f"default {engine_params.DEFAULT_GEN_LENGTH}" in properties["max_tokens"]["description"]
    fields = chat.ChatCompletionRequest.model_fields
    for name, default in engine_params.LOCAL_LEAP_DEFAULTS.items():
        assert f"default {default}" in fields[name].description, name
