"""The LLaDA2 benchmark baseline must itself be the official generate(): check it against the recorded runs.

benchmarks/llada2_reference_loop.py is the uncached loop that benchmarks/llada2.py times the engine against; it
is only a fair baseline if it is the official algorithm. Every temperature-0 case of the fixture (both
reference families, and the shipped 2.1 code with its 0/1 mask), plus the temperature > 0 cases that are
deterministic (top_k = 1, top_p = 1e-6) and the two seeded multinomial ones: the returned ids, the final
canvas, the number of forwards, each forward's window and what it committed and edited.
"""

import json
import subprocess
import sys

import pytest
import torch

from benchmarks.llada2_reference_loop import ReferenceResult, reference_generate, transfer_schedule
from engine.loading import load_model
from tests.fixture_paths import LLADA2_FIXTURE_DIR, REPO_ROOT, llada2_cases

CASES = llada2_cases()["cases"]
KWARG_NAMES = {
    "gen_length", "block_length", "steps", "threshold", "temperature", "top_k", "top_p", "eos_early_stop",
    "minimal_topk", "editing_threshold", "max_post_steps", "num_to_transfer", "eos_id", "mask_id",
}  # fmt: skip


@pytest.fixture(scope="module")
def model():
    torch.use_deterministic_algorithms(True)
    try:
        yield load_model(LLADA2_FIXTURE_DIR, "cpu", torch.float32)
    finally:
        torch.use_deterministic_algorithms(False)


def run(model, case: dict) -> ReferenceResult:
    kwargs = case["kwargs"]
    assert set(kwargs) <= KWARG_NAMES, set(kwargs) - KWARG_NAMES  # every recorded argument is understood
    if case["rng"]:
        torch.manual_seed(case["rng"]["torch_manual_seed"])
    attention = "shipped_01" if case["family"] == "llada21" else "block_causal"
    return reference_generate(model, case["prompt_ids"], attention=attention, **kwargs)


def assert_same_run(result: ReferenceResult, case: dict) -> None:
    assert result.output_ids == case["output_ids"]
    assert result.output_includes_prompt == case["output_includes_prompt"]
    assert result.canvas == case["final_x"]
    assert result.num_forwards == case["num_forward_calls"]
    assert [f.window_length for f in result.forwards] == case["forward_window_lens"]
    assert [sorted(f.committed) for f in result.forwards] == [sorted(s["committed"]) for s in case["steps"]]
    assert [sorted(f.edited) for f in result.forwards] == [sorted(s["edited"]) for s in case["steps"]]


def test_the_cases_cover_both_algorithms_and_every_exit():
    greedy = [c for c in CASES if c["kwargs"]["temperature"] == 0]
    assert {c["family"] for c in greedy} == {"llada20", "llada21_blockcausal", "llada21"}
    assert sum(c["output_includes_prompt"] for c in CASES) == 3  # 2.0's in-block EOS return
    assert any(s["edited"] for c in CASES for s in c["steps"])  # 2.1's token editing
    assert any(c["rng"] for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_reproduces_the_official_generate_forward_for_forward(model, case):
    assert_same_run(run(model, case), case)


@pytest.mark.parametrize(
    ("case_id", "change"),
    [("a03_llada20", dict(threshold=None)), ("a18_llada21_blockcausal", dict(editing_threshold=1.0))],
    ids=["2.0-without-threshold", "2.1-without-editing"],
)
def test_the_check_fails_a_loop_that_drops_a_rule(model, case_id, change):
    """The comparison sees a loop that ignores the threshold (it commits the quota alone) or never edits."""
    case = next(c for c in CASES if c["id"] == case_id)
    result = reference_generate(model, case["prompt_ids"], **dict(case["kwargs"], **change))
    with pytest.raises(AssertionError):
        assert_same_run(result, case)


def test_transfer_schedule_spreads_the_remainder_over_the_first_steps():
    assert transfer_schedule(8, 3) == [3, 3, 2]
    assert transfer_schedule(32, 32) == [1] * 32
    assert transfer_schedule(4, 8) == [1] * 4 + [0] * 4


def test_unknown_attention_is_refused(model):
    with pytest.raises(ValueError, match="attention"):
        reference_generate(model, [1, 2], gen_length=4, block_length=4, mask_id=511, eos_id=508, attention="causal")


def test_the_benchmark_runs_and_finds_the_engine_equal_to_the_loop(tmp_path):
    """benchmarks/llada2.py at a tiny size: it asserts in every round that the engine's canvas and forward count
    equal the official loop's, so exit status 0 is that check passing; no timing is looked at."""
    out = tmp_path / "llada2.json"
    command = [sys.executable, "benchmarks/llada2.py", "--models", "fixture", "--gen-length", "32", "--prompts", "5",
               "40", "--repeats", "1", "--batch-rounds", "1", "--concurrency", "2", "--json", str(out)]  # fmt: skip
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "load average" in done.stdout
    report = json.loads(out.read_text())
    rows = report["cache"]
    assert [(r["setting"][:3], r["prompt"]) for r in rows] == [("2.0", 5), ("2.0", 40), ("2.1", 5), ("2.1", 40)]
    for row in rows:
        assert row["engine_positions"] < row["official_positions"]  # the cache computes less for the same tokens
    assert [r["concurrency"] for r in report["batching"]] == [2, 2]
