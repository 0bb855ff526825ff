"""Import boundaries (docs/design.md, "Layout"): `engine` never imports the HTTP side; `schemas` never
imports torch, a web framework or more of the engine than its torch-free definitions (the sampler knobs,
the prompt, the errors); the app (`api`) is portable ASGI: it knows neither BentoML nor
uvicorn nor the host adapter (`server`), at module level or inside a function; importing `service.py` or
`server` (what `bentoml build` does) loads no torch, and service.py stays thin."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
import yaml

from tests.fixture_paths import REPO_ROOT

API_MODULES = [p.stem for p in sorted((REPO_ROOT / "api").glob("*.py")) if p.stem != "__init__"]
SERVER_MODULES = [p.stem for p in sorted((REPO_ROOT / "server").glob("*.py")) if p.stem != "__init__"]
# What adapts to the host: only service.py and server/ may import these.
HOST_MODULES = {"bentoml", "_bentoml_sdk", "_bentoml_impl", "uvicorn", "server", "service"}
# The engine modules that load no torch: what the HTTP side may import.
TORCH_FREE_ENGINE = {"engine", "engine.errors", "engine.params", "engine.prompt"}
SCHEMAS = (
    "import schemas.chat, schemas.completions, schemas.errors, schemas.fields, schemas.knobs, schemas.openapi, "
    "schemas.request_id, schemas.responses, schemas.sampling"
)
API = "import " + ", ".join(f"api.{name}" for name in API_MODULES)
SERVER = "import " + ", ".join(f"server.{name}" for name in SERVER_MODULES)


def full_modules_after(statement: str) -> set[str]:
    probe = f"import sys; {statement}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def modules_after(statement: str) -> set[str]:
    return {name.split(".")[0] for name in full_modules_after(statement)}


def engine_modules_after(statement: str) -> set[str]:
    return {name for name in full_modules_after(statement) if name.split(".")[0] == "engine"}


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


def test_http_layer_imports_no_torch_engine_or_host():
    assert {"app", "errors", "middleware", "settings", "streaming"} <= set(API_MODULES)
    loaded = modules_after(API)
    assert "fastapi" in loaded
    assert not loaded & {"torch", "transformers", *HOST_MODULES}
    assert engine_modules_after(API) <= TORCH_FREE_ENGINE


def test_host_adapter_imports_no_torch():
    assert {"connections", "drain", "engine_setup", "logs", "middleware", "native", "settings"} <= set(SERVER_MODULES)
    loaded = modules_after(SERVER)
    assert {"bentoml", "api"} <= loaded
    assert not loaded & {"torch", "transformers"}
    assert engine_modules_after(SERVER) <= TORCH_FREE_ENGINE


def imported_modules(path) -> set[str]:
    """The top-level names of every module a file imports, anywhere in it (inside functions too), also
    through importlib.import_module or __import__ with a literal name."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names.add(node.args[0].value)
    return {name.split(".")[0] for name in names}


@pytest.mark.parametrize("package", ["api", "schemas", "engine"])
def test_the_portable_packages_never_import_the_host(package):
    offenders = {
        str(path.relative_to(REPO_ROOT)): sorted(imported_modules(path) & HOST_MODULES)
        for path in sorted((REPO_ROOT / package).rglob("*.py"))
    }
    assert offenders and not {path: names for path, names in offenders.items() if names}


def test_the_import_rule_sees_imports_inside_functions(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text(
        "def later():\n    from uvicorn import config\n"
        "    import importlib\n    return importlib.import_module('bentoml._internal')\n"
    )
    assert imported_modules(source) >= {"uvicorn", "bentoml"}


def test_every_package_is_installed_and_packed_into_the_bento():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    packages = {p.parent.name for p in REPO_ROOT.glob("*/__init__.py")} - {"tests", "scripts", "benchmarks"}
    assert {"api", "engine", "schemas", "server"} <= packages
    include = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    bento_include = yaml.safe_load((REPO_ROOT / "bentofile.yaml").read_text())["include"]
    for package in packages:
        assert f"{package}*" in include["include"], package
        assert f"{package}/**/*.py" in bento_include, package


def test_importing_the_service_loads_no_torch():
    loaded = modules_after("import service")
    assert "bentoml" in loaded and "fastapi" in loaded
    assert not loaded & {"torch", "transformers"}
    assert engine_modules_after("import service") <= TORCH_FREE_ENGINE


def test_the_service_module_stays_thin():
    """service.py is the Bento class and what BentoML needs; the app lives in `api`, its host adapter in `server`."""
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


def test_the_app_never_reads_the_environment():
    """`create_app(settings)` is how the app is configured: the host reads the environment once, at startup."""
    readers = {
        f"{path.relative_to(REPO_ROOT)}:{node.lineno}"
        for path in sorted((REPO_ROOT / "api").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"))
        or (isinstance(node, ast.alias) and node.name in ("environ", "getenv"))
    }
    assert not readers
