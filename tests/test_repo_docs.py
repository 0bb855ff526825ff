"""The repository is self-contained: what the code and docs cite is in it, and the docs' links resolve."""

from __future__ import annotations

import re

import pytest

from schemas.errors import ADR_DOC
from tests.fixture_paths import REPO_ROOT

SOURCE_DIRS = ["api", "engine", "schemas", "server", "tests", "docs", "benchmarks", "scripts", "models", ".ci"]
TEXT_SUFFIXES = {".py", ".md", ".txt", ".yaml", ".yml", ".toml", ".sh", ".json", ""}
# Spelled in pieces so that this file does not match itself.
OUTSIDE_REFERENCES = ["DESIGN " + "§", "../" + "shared", "/work/" + "shared"]


def text_files():
    files = [p for p in REPO_ROOT.iterdir() if p.is_file()]
    for name in SOURCE_DIRS:
        files += [p for p in (REPO_ROOT / name).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return [p for p in files if p.suffix in TEXT_SUFFIXES and p.stat().st_size < 2_000_000]


def test_nothing_points_outside_the_repository():
    offenders = [
        f"{path.relative_to(REPO_ROOT)}: {needle}"
        for path in text_files()
        for needle in OUTSIDE_REFERENCES
        if needle in path.read_text(errors="replace")
    ]
    assert not offenders


def test_the_adr_that_errors_cite_is_in_the_repository():
    text = (REPO_ROOT / ADR_DOC).read_text()
    assert text.startswith("# ADR 005")


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


EMBEDDED_MODEL_CARD = REPO_ROOT / "models" / "tiny-llada-chat" / "README.md"
MARKDOWN = sorted([REPO_ROOT / "README.md", EMBEDDED_MODEL_CARD, *(REPO_ROOT / "docs").rglob("*.md")])


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", resolved.read_text(), flags=re.MULTILINE)
            if anchor not in {slug(h) for h in headings}:
                broken.append(target)
    assert not broken, broken


# A path into the repository's code, as docs and docstrings cite it: `server/drain.py`, `api/static/playground.js`.
CODE_PATH = re.compile(
    r"(?<![\w/.-])((?:api|server|engine|schemas|scripts|benchmarks|tests)/[\w/]+\.(?:py|md|html|js|css))"
)


def test_the_code_paths_the_docs_and_docstrings_cite_exist():
    """After a module moves (issue 24 moved the host adapter to server/), no page or docstring may still send a
    reader to where it was."""
    citing = [REPO_ROOT / "README.md", REPO_ROOT / "service.py", *(REPO_ROOT / "docs").rglob("*.md")]
    citing += [
        p
        for name in ("api", "server", "engine", "schemas", "scripts", "benchmarks")
        for p in (REPO_ROOT / name).rglob("*.py")
    ]
    missing = sorted(
        f"{path.relative_to(REPO_ROOT)}: {cited}"
        for path in citing
        for cited in set(CODE_PATH.findall(path.read_text()))
        if not (REPO_ROOT / cited).exists()
    )
    assert len(citing) > 50 and not missing, missing
