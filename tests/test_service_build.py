"""`bentoml build` packs a Bento with the service, its host adapter, its HTTP layer (playground included), engine,
schemas and embedded model, offline."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.fixture_paths import REPO_ROOT


@pytest.mark.slow  # `bentoml build` in a subprocess
def test_bentoml_build_packs_the_service_offline(tmp_path):
    env = {**os.environ, "BENTOML_HOME": str(tmp_path / "home"), "BENTOML_DO_NOT_TRACK": "true"}
    build = subprocess.run(
        [sys.executable, "-m", "bentoml", "build", "--output", "tag", str(REPO_ROOT)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (bento,) = [p for p in (tmp_path / "home" / "bentos" / "dllm-serve").iterdir() if p.is_dir()]
    src = bento / "src"

    assert (src / "service.py").is_file()
    for package in ("api", "engine", "schemas", "server"):
        assert (src / package / "__init__.py").is_file(), package
    for asset in ("playground.html", "playground.js", "playground.css"):
        assert (src / "api" / "static" / asset).is_file(), asset
    embedded = src / "models" / "tiny-llada-chat"
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        assert (embedded / name).is_file(), name
    assert not list(src.rglob("__pycache__")) and not (src / "tests").exists()

    manifest = yaml.safe_load((bento / "bento.yaml").read_text())
    assert manifest["service"] == "service:DiffusionLLMService"
    config = manifest["services"][0]["config"]
    assert config["workers"] == 1 and config["resources"] == {"gpu": 1}

    requirements = (bento / "env" / "python" / "requirements.txt").read_text()
    for package in ("torch", "transformers", "bentoml", "fastapi", "pydantic", "safetensors"):
        assert package in requirements, package
    dockerfile = (bento / "env" / "docker" / "Dockerfile").read_text()
    assert "FROM python:3.11" in dockerfile
