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


MARKDOWN = sorted([REPO_ROOT / "README.md", *(REPO_ROOT / "docs").rglob("*.md")])


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
