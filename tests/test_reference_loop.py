"""The benchmark baseline must itself be the official sampler: check it against the recorded outputs."""

import pytest

from benchmarks.reference_loop import reference_generate
from engine.loading import load_model
from tests.fixture_paths import FIXTURE_DIR, reference


@pytest.mark.parametrize("case", reference()["generate_cases"][:5], ids=lambda c: f"gen{c['gen_length']}")
def test_reference_loop_reproduces_official_generate(case):
    model = load_model(FIXTURE_DIR, "cpu")
    output, forwards = reference_generate(
        model,
        case["prompt_ids"],
        gen_length=case["gen_length"],
        block_length=case["block_length"],
        steps=case["steps"],
        mask_id=case["mask_id"],
    )
    assert output == case["output_ids"]
    assert forwards == case["nfe"]
