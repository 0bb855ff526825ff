"""Block schedules: exact LLaDA uniform schedule, the worked examples of docs/design.md ("Sampler"), and invariants."""

import pytest

from engine.schedules import block_quotas


def llada_reference_schedule(n, steps):
    # LLaDA generate.py get_num_transfer_tokens: base = n // steps, remainder to the first steps.
    base, remainder = n // steps, n % steps
    quotas = [base] * steps
    for i in range(remainder):
        quotas[i] += 1
    return quotas


def test_uniform_equals_llada_for_every_block_up_to_256():
    for n in range(1, 257):
        for steps in range(1, n + 1):
            assert block_quotas("uniform", n, steps) == llada_reference_schedule(n, steps)


@pytest.mark.parametrize("schedule", ["uniform", "front_loaded", "cosine"])
def test_every_step_commits_at_least_one_and_all_are_committed(schedule):
    for n in range(1, 129):
        for steps in range(1, n + 1):
            quotas = block_quotas(schedule, n, steps)
            assert len(quotas) == steps
            assert sum(quotas) == n
            assert min(quotas) >= 1


def test_worked_examples_of_the_design():
    assert block_quotas("front_loaded", 32, 8) == [7, 6, 5, 4, 4, 3, 2, 1]
    assert block_quotas("cosine", 32, 8) == [1, 2, 3, 4, 5, 5, 6, 6]


def test_a_tied_leftover_token_goes_to_the_earlier_step():
    # front_loaded, 4 tokens in 2 steps: one each, and the 2 spare ones shared 3/4 : 1/4 = 1.5 : 0.5. The floors
    # take 1, the leftover token has two equal remainders (0.5, 0.5) and goes to step 0: [1 + 2, 1 + 0].
    assert block_quotas("front_loaded", 4, 2) == [3, 1]


@pytest.mark.parametrize(("schedule", "direction"), [("front_loaded", -1), ("cosine", 1), ("uniform", -1)])
def test_shapes_are_monotone(schedule, direction):
    for n in (16, 32, 64, 100, 256):
        for steps in (2, 4, 8, 16):
            quotas = block_quotas(schedule, n, steps)
            pairs = list(zip(quotas, quotas[1:]))
            assert all((b - a) * direction >= 0 for a, b in pairs), (n, steps, quotas)


def test_front_loaded_commits_more_early_and_cosine_more_late():
    assert block_quotas("front_loaded", 64, 8)[0] > block_quotas("uniform", 64, 8)[0]
    assert block_quotas("cosine", 64, 8)[-1] > block_quotas("uniform", 64, 8)[-1]


def test_impossible_blocks_are_errors():
    with pytest.raises(ValueError, match="cannot be denoised in 9 steps"):
        block_quotas("uniform", 8, 9)
    with pytest.raises(ValueError, match="unknown block schedule"):
        block_quotas("linear", 8, 2)
