"""LocalLeap: the engine's vectorized rule against a plain loop of the paper's rule."""

import random

import torch

from engine import SamplingParams
from engine.sampler import local_leap_mask


def local_leap_loop(confidence, positions, anchor, neighbor, radius):
    """arXiv:2510.07081, written as plainly as possible: anchors, then their confident neighbours."""
    anchors = [p for c, p in zip(confidence, positions) if c >= anchor]
    selected = []
    for c, p in zip(confidence, positions):
        is_anchor = c >= anchor
        near = any(abs(p - a) <= radius for a in anchors)
        selected.append(is_anchor or (near and c >= neighbor))
    return selected


def test_vectorized_rule_agrees_with_the_loop_on_random_confidences():
    rng = random.Random(1234)
    for _ in range(3000):
        block = rng.randint(1, 64)
        count = rng.randint(1, block)
        positions = sorted(rng.sample(range(block), count))
        confidence = [rng.random() ** rng.choice([0.3, 1, 3]) for _ in positions]
        anchor, neighbor = sorted([rng.random(), rng.random()], reverse=True)
        radius = rng.randint(1, 16)
        got = local_leap_mask(torch.tensor(confidence), torch.tensor(positions), anchor, neighbor, radius).tolist()
        assert got == local_leap_loop(confidence, positions, anchor, neighbor, radius)


def test_one_token_per_step_plus_local_leap_is_the_paper_rule(fixture_engine, monkeypatch):
    """With S = block_length the quota is one token (the most confident) and LocalLeap adds the rest."""
    params = SamplingParams(
        gen_length=16,
        num_denoising_steps=16,
        use_local_leap=True,
        local_leap_anchor_threshold=0.3,
        local_leap_neighbor_threshold=0.1,
        local_leap_radius=2,
        early_exit=False,
    )
    request = fixture_engine.new_request(messages=[{"role": "user", "content": "Tell me a story."}], params=params)
    steps = 0
    while not request.finished:
        offsets = request.candidate_offsets()
        seen = {}

        def spy(confidence, positions, *args, _seen=seen):
            _seen["c"], _seen["p"] = confidence.tolist(), positions.tolist()
            return local_leap_mask(confidence, positions, *args)

        monkeypatch.setattr("engine.sampler.local_leap_mask", spy)
        (event,) = fixture_engine.step([request])
        committed = sorted(pos for pos, _ in event.committed)
        expected = local_leap_loop(seen["c"], seen["p"], 0.3, 0.1, 2)
        best = max(range(len(seen["c"])), key=lambda i: (seen["c"][i], -i))
        expected[best] = True
        assert committed == [int(o) for o, keep in zip(offsets, expected) if keep]
        steps += 1
    assert steps < 16  # the thresholds are low enough that LocalLeap committed several tokens at once


def test_local_leap_never_commits_outside_the_current_block(fixture_engine):
    params = SamplingParams(
        gen_length=32,
        block_length=8,
        num_denoising_steps=32,
        use_local_leap=True,
        local_leap_anchor_threshold=0.0,
        local_leap_neighbor_threshold=0.0,
        local_leap_radius=16,
        early_exit=False,
    )
    events = list(fixture_engine.stream(messages=[{"role": "user", "content": "Hello"}], params=params))
    assert len(events) == 4  # every candidate is an anchor: each block fills in one step
    for event in events:
        assert {pos // 8 for pos, _ in event.committed} == {event.block}


def test_thresholds_and_radius_are_inclusive():
    # Exact float32 values: an anchor at exactly κ, a neighbour at exactly τ and exactly W positions away.
    confidence = torch.tensor([1.0, 0.5, 0.25, 0.5])
    positions = torch.tensor([0, 2, 5, 9])
    mask = local_leap_mask(confidence, positions, anchor=1.0, neighbor=0.5, radius=2)
    assert mask.tolist() == [True, True, False, False]  # 5 is too unsure, 9 too far from the anchor at 0
    assert mask.tolist() == local_leap_loop(confidence.tolist(), positions.tolist(), 1.0, 0.5, 2)


def test_local_leap_at_kappa_and_tau_1_commits_the_certain_positions(fixture_engine):
    """κ = τ = 1 is a valid setting: LocalLeap then commits exactly the candidates the model is certain of
    (probability 1.0 in float32, as a logit of 50 over zeros gives), beyond the one-token quota."""
    params = SamplingParams(
        gen_length=8,
        num_denoising_steps=8,  # quota: one token per step
        use_local_leap=True,
        local_leap_anchor_threshold=1.0,
        local_leap_neighbor_threshold=1.0,
        local_leap_radius=1,
    )
    request = fixture_engine.new_request(prompt_token_ids=[5, 6, 7], params=params)
    certain, unsure = [50.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]
    logits = torch.tensor([unsure, unsure, certain, certain, unsure, unsure, certain, unsure])
    assert bool((torch.softmax(logits, -1).max(-1).values == 1.0).sum() == 3)  # the premise: exactly 1.0, thrice
    proposal = request.propose(logits, torch.arange(8)).tolist()
    assert proposal == [-1, -1, 0, 0, -1, -1, 0, -1]
