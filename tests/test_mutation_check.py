"""The mutation check (scripts/mutation_check.py, docs/testing.md) cannot rot: every mutant still applies to the
code and names tests that exist, and a run end to end kills a real mutant and reports a surviving one, without
touching the working tree. The full run is too slow for every CI run; this is its smoke test."""

from __future__ import annotations

import ast

import pytest

from scripts.mutants import MUTANTS, Mutant
from scripts.mutation_check import check, stale, summary
from tests.fixture_paths import REPO_ROOT


def test_every_mutant_applies_to_the_current_code():
    assert stale(MUTANTS) == []  # each `before` is found exactly once in its file


def test_mutant_ids_are_unique_and_every_equivalent_one_says_why():
    ids = [m.id for m in MUTANTS]
    assert len(ids) == len(set(ids))
    assert all(m.breaks and m.tests for m in MUTANTS)
    assert all(m.equivalent is None or len(m.equivalent) > 40 for m in MUTANTS)


def test_mutated_code_still_parses():
    # A mutant that is a syntax error is killed by any test: it would measure nothing.
    for mutant in MUTANTS:
        if mutant.path.endswith(".py"):
            source = (REPO_ROOT / mutant.path).read_text()
            ast.parse(source.replace(mutant.before, mutant.after, 1), filename=f"{mutant.path} ({mutant.id})")


@pytest.mark.parametrize("test", sorted({t for m in MUTANTS for t in m.tests}))
def test_every_named_test_exists(test):
    path, _, name = test.partition("::")
    assert (REPO_ROOT / path).is_file(), path
    if name:
        assert f"def {name}(" in (REPO_ROOT / path).read_text(), test


@pytest.mark.slow  # three pytest runs in a copy of the repository
def test_a_run_kills_a_real_mutant_reports_a_survivor_and_leaves_the_tree_alone():
    real = next(m for m in MUTANTS if m.id == "text-stop-last-occurrence")
    harmless = Mutant(
        "smoke-comment-only",
        "engine/text.py",
        'REPLACEMENT_CHAR = "\\ufffd"',
        'REPLACEMENT_CHAR = "\\ufffd"  # changed by the smoke test',
        "nothing: a comment",
        ("tests/test_text.py",),
    )
    original = (REPO_ROOT / real.path).read_text()
    outcomes = check([real, harmless], timeout_s=300)
    assert (REPO_ROOT / real.path).read_text() == original
    assert [(o.mutant, o.status) for o in outcomes] == [(real.id, "killed"), (harmless.id, "survived")]
    assert outcomes[0].killed_by.startswith("tests/test_text.py::")
    assert [o.as_expected for o in outcomes] == [True, False]  # a non-equivalent survivor fails the run
    assert "killed 1 of 2 mutants" in summary([real, harmless], outcomes)
