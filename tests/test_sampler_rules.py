"""The sampler's selection rules pinned by hand: which candidates a step commits, among equal confidences too,
and what `commit` does with a proposal. Logits are built so that the confidences (and their exact ties) are
known without running the code under test; the last test checks the same rule on a real model's steps."""

from __future__ import annotations

import pytest
import torch

import engine.sampler
from engine import SamplingParams
from engine.sampler import DenoisingRequest

HIGH, LOW, TOP = [3.0, 0.0, 0.0], [0.0, 0.0, 0.0], [5.0, 0.0, 0.0]  # top-1 probabilities 0.91, 1/3, 0.99


def request_for(**params) -> DenoisingRequest:
    params = SamplingParams(block_schedule="uniform", confidence_metric="top1_prob", **params)
    return DenoisingRequest(
        [1, 2, 3], params, mask_id=99, stop_ids=frozenset({98}), decode=lambda ids: "", device=torch.device("cpu")
    )


def committed_positions(request: DenoisingRequest, rows: list[list[float]]) -> list[int]:
    proposal = request.propose(torch.tensor(rows), torch.arange(len(rows)))
    return [position for position, token in enumerate(proposal.tolist()) if token >= 0]


def test_a_one_token_quota_takes_the_leftmost_of_equal_confidences():
    request = request_for(gen_length=4, num_denoising_steps=4)  # quotas 1, 1, 1, 1
    assert committed_positions(request, [LOW, HIGH, HIGH, LOW]) == [1]
    assert committed_positions(request, [LOW, HIGH, HIGH, TOP]) == [3]  # confidence first, position second


def test_a_larger_quota_takes_the_most_confident_then_the_leftmost_of_equals():
    # 24 candidates, 16 of them tied at HIGH (positions not divisible by 3), one TOP at the far right. The quota
    # of 6 takes TOP, then the five leftmost HIGH: 1, 2, 4, 5, 7. Ties must be broken by position, not by the
    # sort's internals: torch's unstable CPU sort reorders ties from 17 elements up.
    rows = [LOW if position % 3 == 0 else HIGH for position in range(23)] + [TOP]
    request = request_for(gen_length=24, num_denoising_steps=4)  # quotas 6, 6, 6, 6
    assert committed_positions(request, rows) == [1, 2, 4, 5, 7, 23]


def test_commit_applies_token_id_0_and_skips_only_minus_1():
    request = request_for(gen_length=4, num_denoising_steps=4, early_exit=False)
    event = request.commit([0, 1, 2, 3], [0, -1, 7, -1])
    assert event.committed == [(0, 0), (2, 7)]  # token id 0 is a token like any other
    assert (request.generated, request.masked) == ([0, 99, 7, 99], [False, True, False, True])
    assert event.masked_remaining == 2 and not event.finished


@pytest.mark.parametrize("prompt", ["What is 2 plus 3?", "Spell banana.", "Count from 3 to 6."])
def test_every_step_of_a_real_model_commits_what_the_rule_says(embedded_engine, monkeypatch, prompt):
    """On the embedded model, whose confidences often tie exactly (saturated probabilities): each step commits
    the quota's most confident candidates, leftmost first among equals, by a plain-Python ranking of the
    confidences the sampler computed."""
    seen: list[list[float]] = []
    real_confidence_of = engine.sampler.confidence_of

    def recording(logits, prediction, metric):
        confidence = real_confidence_of(logits, prediction, metric)
        seen.append(confidence.tolist())
        return confidence

    monkeypatch.setattr(engine.sampler, "confidence_of", recording)
    params = SamplingParams(gen_length=32, block_length=16, num_denoising_steps=8, early_exit=False)
    request = embedded_engine.new_request(messages=[{"role": "user", "content": prompt}], params=params)
    quotas = [4, 4, 4, 4] * 2  # 16 tokens in 4 steps per block, by hand
    for quota in quotas:
        offsets = request.candidate_offsets()
        (event,) = embedded_engine.step([request])
        confidence = seen[-1]
        ranked = sorted(range(len(offsets)), key=lambda i: (-confidence[i], i))  # ties: the smaller position
        assert sorted(position for position, _ in event.committed) == sorted(offsets[i] for i in ranked[:quota])
    assert request.finished
