"""scripts/setup.sh skips pip when .venv was already installed for this pyproject.toml and these extras (its
stamp), so that a second `bash scripts/serve.sh` starts at once; anything else still installs.

Each case runs the real script in a copy of the two files it reads, with a .venv whose `python` is this
interpreter (dllm-serve is installed in it) and whose `activate`, the first step of an install, only says so.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

import pytest

from tests.fixture_paths import REPO_ROOT

INSTALLING = "an install would start here"


@pytest.fixture
def checkout(tmp_path):
    (tmp_path / "scripts").mkdir()
    for name in ("pyproject.toml", "scripts/setup.sh"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # this venv's, not its base
    (venv_bin / "python").chmod(0o755)
    (venv_bin / "activate").write_text(f'echo "{INSTALLING}" >&2; exit 3\n')
    return tmp_path


def install_hash(checkout) -> str:
    return hashlib.sha256(
        (checkout / "pyproject.toml").read_bytes() + (checkout / "scripts/setup.sh").read_bytes()
    ).hexdigest()


def setup(checkout, *extras: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "scripts/setup.sh", *extras], cwd=checkout, capture_output=True, text=True, timeout=60, env=os.environ
    )


def stamp(checkout, hash_: str, extras: str) -> None:
    (checkout / ".venv" / ".dllm-setup-stamp").write_text(f"{hash_}\n{extras}\n")


def test_a_matching_stamp_skips_pip(checkout):
    stamp(checkout, install_hash(checkout), "bench,clients,test")
    for extras in ((), ("test,bench",), ("clients",)):
        run = setup(checkout, *extras)
        assert run.returncode == 0 and "pip skipped" in run.stderr, run.stderr


@pytest.mark.parametrize(
    "case", ["no stamp", "other pyproject", "more extras", "pyproject edited since"], ids=lambda c: c.replace(" ", "-")
)
def test_anything_else_installs(checkout, case):
    if case != "no stamp":
        stamp(checkout, "0" * 64 if case == "other pyproject" else install_hash(checkout), "test,bench")
    if case == "pyproject edited since":
        with (checkout / "pyproject.toml").open("a") as f:
            f.write("\n# a new dependency\n")
    run = setup(checkout, "test,bench,quant" if case == "more extras" else "test,bench")
    assert run.returncode == 3 and INSTALLING in run.stderr, run.stderr
