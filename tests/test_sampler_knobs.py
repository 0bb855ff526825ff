"""Schedules, confidence metrics and stop strings, end to end through the engine."""

import math

import pytest
import torch

from engine import SamplingParams
from engine.sampler import confidence_of

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


# 16 tokens in 4 steps, by hand (docs/design.md, "Sampler"): each step gets 1, and the 12 spare tokens are shared
# by weight with largest-remainder rounding. front_loaded: weights 7, 5, 3, 1 / 16 → 5.25, 3.75, 2.25, 0.75 →
# floors 5, 3, 2, 0 and the 2 leftovers to the .75s. cosine: weights cos(πi/8) − cos(π(i+1)/8) = 0.0761, 0.2168,
# 0.3244, 0.3827 → 0.913, 2.601, 3.893, 4.592 → floors 0, 2, 3, 4 and the 3 leftovers to .913, .893, .601.
QUOTAS_16_IN_4 = {"uniform": [4, 4, 4, 4], "front_loaded": [6, 5, 3, 2], "cosine": [2, 4, 5, 5]}


@pytest.mark.parametrize("schedule", ["uniform", "front_loaded", "cosine"])
@pytest.mark.parametrize("metric", ["top1_prob", "entropy_inverse"])
def test_each_step_commits_its_scheduled_quota(fixture_engine, schedule, metric):
    params = SamplingParams(
        gen_length=32,
        block_length=16,
        num_denoising_steps=8,
        block_schedule=schedule,
        confidence_metric=metric,
        early_exit=False,
    )
    events = list(fixture_engine.stream(messages=MESSAGES, params=params))
    assert [len(e.committed) for e in events] == QUOTAS_16_IN_4[schedule] * 2
    assert [e.block for e in events] == [0] * 4 + [1] * 4


def test_confidence_metrics():
    logits = torch.tensor([[4.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    prediction = logits.argmax(-1)
    top1 = confidence_of(logits, prediction, "top1_prob")
    torch.testing.assert_close(top1, torch.softmax(logits, -1).max(-1).values)
    inverse_entropy = confidence_of(logits, prediction, "entropy_inverse")
    assert inverse_entropy[0] > inverse_entropy[1]
    torch.testing.assert_close(inverse_entropy[1], torch.tensor(1 / 3))  # exp(−ln 3)
    assert bool(((inverse_entropy > 0) & (inverse_entropy <= 1)).all())


def test_margin_is_the_lead_of_the_best_token_over_the_runner_up():
    logits = torch.tensor([[4.0, 0.0, 0.0], [2.0, 2.0, 0.0], [1.0, 1.0, 1.0]])
    margin = confidence_of(logits, logits.argmax(-1), "margin")
    # p1 − p2 by hand: (e⁴ − 1) / (e⁴ + 2); then two equal leaders and a flat row lead by nothing.
    expected = torch.tensor([(math.exp(4) - 1) / (math.exp(4) + 2), 0.0, 0.0])
    torch.testing.assert_close(margin, expected)


def test_metrics_can_rank_differently(fixture_engine):
    outputs = {
        metric: fixture_engine.generate(
            messages=MESSAGES, params=SamplingParams(gen_length=32, confidence_metric=metric, early_exit=False)
        ).step_commits
        for metric in ("top1_prob", "entropy_inverse")
    }
    assert outputs["top1_prob"] != outputs["entropy_inverse"]


POEM = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a short poem about the sea."},
]


def test_stop_string_cuts_and_ends_early(fixture_engine):
    params = dict(gen_length=32, block_length=8, num_denoising_steps=16, early_exit=False)
    full = fixture_engine.generate(messages=POEM, params=SamplingParams(**params))
    assert full.text.startswith("> w wapherThej on")
    stopped = fixture_engine.generate(messages=POEM, params=SamplingParams(**params, stop=("Th", "zzz")))
    assert stopped.text == "> w wapher"
    assert stopped.finish_reason == "stop"
    assert fixture_engine.tokenizer.decode(stopped.token_ids) == stopped.text
    assert stopped.completion_tokens < full.completion_tokens
    assert stopped.num_forward_passes < full.num_forward_passes  # ended once "Th" was final
    events = list(fixture_engine.stream(messages=POEM, params=SamplingParams(**params, stop=("Th",))))
    assert "".join(e.text_delta for e in events) == stopped.text
