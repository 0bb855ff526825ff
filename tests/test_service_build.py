"""`bentoml build` packs a Bento with the service, its host adapter, its HTTP layer (playground included), engine,
schemas and embedded model, with no package index reachable; its image makes the Hugging Face cache directory
that docs/deploy.md mounts a volume on."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.fixture_paths import REPO_ROOT

# pip with no index and nothing to find: no configuration file (this machine's names local mirrors), no index.
NO_INDEX = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "UV_OFFLINE": "1"}


@pytest.mark.slow  # `bentoml build` in a subprocess
def test_bentoml_build_packs_the_service_with_no_package_index(tmp_path):
    env = {**os.environ, **NO_INDEX, "BENTOML_HOME": str(tmp_path / "home"), "BENTOML_DO_NOT_TRACK": "true"}
    # The environment does shut pip off: what BentoML would run if uv were missing fails in it.
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(tmp_path / "dl"), "uv"]
    assert subprocess.run(pip, env=env, capture_output=True, timeout=120).returncode != 0
    build = subprocess.run(
        [sys.executable, "-m", "bentoml", "build", "--output", "tag", str(REPO_ROOT)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    assert "installing it with" not in build.stdout + build.stderr  # BentoML's "uv is not installed" pip call
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

    requirements = (bento / "env" / "python" / "requirements.txt").read_text().split()
    names = [line.split("==")[0].lower() for line in requirements]
    for package in ("torch", "transformers", "bentoml", "fastapi", "pydantic", "safetensors"):
        assert package in names, package
    assert len(names) == len(set(names)), requirements  # no package twice (BentoML adds its own bentoml pin)
    dockerfile = (bento / "env" / "docker" / "Dockerfile").read_text()
    assert "FROM python:3.11" in dockerfile

    # The cache directory is made after the user exists and before the image becomes that user.
    lines = dockerfile.splitlines()
    run_setup = next(i for i, line in enumerate(lines) if "./env/docker/script__" in line)
    assert next(i for i, line in enumerate(lines) if "useradd" in line) < run_setup
    assert run_setup < lines.index("USER bentoml")
    (script,) = (bento / "env" / "docker").glob("script__*")
    assert script.read_text() == (REPO_ROOT / "scripts" / "bento_image_setup.sh").read_text()


def test_the_image_setup_makes_the_hugging_face_cache_the_users(tmp_path):
    # The image's `getent` and `chown`, replaced by ones that answer for a home in tmp_path and record the call.
    home, bin_dir, log = tmp_path / "home" / "bentoml", tmp_path / "bin", tmp_path / "chown.log"
    home.mkdir(parents=True)
    bin_dir.mkdir()
    fakes = {
        "getent": f'[ "$1 $2" = "passwd bentoml" ] && echo "bentoml:x:1034:1034::{home}:/bin/sh"',
        "chown": f'echo "$@" >> {log}',
    }
    for name, body in fakes.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    script = REPO_ROOT / "scripts" / "bento_image_setup.sh"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(["sh", str(script)], env=env, check=True, timeout=30)
    assert (home / ".cache" / "huggingface").is_dir()
    assert Path(log).read_text().split() == ["-R", "bentoml:bentoml", str(home / ".cache")]
