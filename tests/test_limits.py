"""The HTTP schema and the engine agree on every limit: a value at each bound is accepted by both or
refused by both.

Both take the limits from the knobs' one definition (engine.params); this file checks the behaviour, bound by
bound. The HTTP side is the whole path a body takes: schema validation, then `SamplingParams` built from it.
"""

from __future__ import annotations

import json

import pytest

from engine import InvalidParameter, SamplingParams
from engine.params import MAX_LOCAL_LEAP_RADIUS, MAX_STEPS, MAX_STOP_STRINGS, MAX_TEMPERATURE, SEED_MAX, SEED_MIN
from schemas.chat import parse_chat_request
from schemas.errors import APIError

MESSAGES = [{"role": "user", "content": "hi"}]
LEAP = {"use_local_leap": True}


def steps_on_a_big_canvas(steps: int) -> tuple[dict, dict]:
    # A canvas with room for the most steps (a step commits at least one token).
    canvas = MAX_STEPS
    return {"gen_length": canvas, "num_denoising_steps": steps}, {"max_tokens": canvas, "num_denoising_steps": steps}


# (engine fields, HTTP fields or None when they are spelled the same)
BOUNDS = [
    ({"temperature": 0}, None),
    ({"temperature": -0.01}, None),
    ({"temperature": MAX_TEMPERATURE}, None),
    ({"temperature": MAX_TEMPERATURE + 0.01}, None),
    ({"seed": SEED_MIN}, None),
    ({"seed": SEED_MIN - 1}, None),
    ({"seed": SEED_MAX}, None),
    ({"seed": SEED_MAX + 1}, None),
    ({"gen_length": 1}, {"max_tokens": 1}),
    ({"gen_length": 0}, {"max_tokens": 0}),
    ({"gen_length": 0}, {"target_length": 0}),
    ({"gen_length": 0}, {"max_completion_tokens": 0}),
    ({"num_denoising_steps": 1}, None),
    ({"num_denoising_steps": 0}, None),
    steps_on_a_big_canvas(MAX_STEPS),
    steps_on_a_big_canvas(MAX_STEPS + 1),
    ({"block_length": 1, "num_denoising_steps": 128}, None),
    ({"block_length": 0}, None),
    ({**LEAP, "local_leap_anchor_threshold": 0}, None),
    ({**LEAP, "local_leap_anchor_threshold": -0.01}, None),
    ({**LEAP, "local_leap_anchor_threshold": 1}, None),
    ({**LEAP, "local_leap_anchor_threshold": 1.01}, None),
    ({**LEAP, "local_leap_neighbor_threshold": 0}, None),
    ({**LEAP, "local_leap_neighbor_threshold": -0.01}, None),
    ({**LEAP, "local_leap_neighbor_threshold": 1}, None),
    ({**LEAP, "local_leap_neighbor_threshold": 1.01}, None),
    ({**LEAP, "local_leap_radius": 1}, None),
    ({**LEAP, "local_leap_radius": 0}, None),
    ({**LEAP, "local_leap_radius": MAX_LOCAL_LEAP_RADIUS}, None),
    ({**LEAP, "local_leap_radius": MAX_LOCAL_LEAP_RADIUS + 1}, None),
    ({"local_leap_radius": 4}, None),  # only with use_local_leap
    ({"confidence_threshold": 1}, None),
    ({"confidence_threshold": 1e-9}, None),
    ({"confidence_threshold": 0}, None),
    ({"confidence_threshold": 1.01}, None),
    ({"confidence_threshold": 0.9, "num_denoising_steps": 16}, None),  # the threshold sets the step count
    ({"kv_cache": "dual", "block_length": 32}, None),
    ({"kv_cache": "paged"}, None),
    ({"block_schedule": "dream"}, None),
    ({"confidence_metric": "margin"}, None),
    ({"stop": []}, None),
    ({"stop": ["a"] * MAX_STOP_STRINGS}, None),
    ({"stop": ["a"] * (MAX_STOP_STRINGS + 1)}, None),
    ({"stop": "a"}, None),
    ({"stop": ""}, None),
    ({"stop": ["a", ""]}, None),
]


def engine_accepts(fields: dict) -> bool:
    try:
        SamplingParams(**fields)
    except InvalidParameter:
        return False
    return True


def http_accepts(fields: dict) -> bool:
    try:
        chat = parse_chat_request(json.dumps({"messages": MESSAGES, **fields}).encode())
        SamplingParams(**chat.sampling_kwargs())
    except (APIError, InvalidParameter):
        return False
    return True


@pytest.mark.parametrize(("engine_fields", "http_fields"), BOUNDS, ids=[str(e) for e, _ in BOUNDS])
def test_http_and_engine_accept_the_same_values(engine_fields, http_fields):
    assert http_accepts(http_fields or engine_fields) == engine_accepts(engine_fields)
