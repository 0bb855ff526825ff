"""Block schedules: how many of a block's n masked tokens each of its S steps commits (docs/design.md, "Sampler").

Every schedule sums to n. `uniform` is LLaDA's reference schedule. `front_loaded` and `cosine` spend the
E = n − S spare tokens by a weight per step and round with the largest-remainder rule (ties go to the
earlier step), so the result is exact and platform-independent; they give every step at least one token.
`dream` is Dream's own schedule, reproduced in its float32 arithmetic; its first steps may commit nothing.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import torch

from engine.config import DREAM_TIMESTEP_EPS


def uniform_quotas(n: int, steps: int) -> list[int]:
    base, extra = divmod(n, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


def _front_loaded_shares(spare: int, steps: int) -> list[Fraction]:
    # w_i = (2(S−i)−1)/S²: linearly decreasing, sums to 1. Exact in rationals.
    return [Fraction(spare * (2 * (steps - i) - 1), steps * steps) for i in range(steps)]


def _cosine_shares(spare: int, steps: int) -> list[Fraction]:
    # w_i = cos(πi/2S) − cos(π(i+1)/2S): slow start, fast finish. Rounded to 1e-9 so that float noise
    # cannot flip which step receives a leftover token.
    shares = []
    for i in range(steps):
        w = math.cos(math.pi * i / (2 * steps)) - math.cos(math.pi * (i + 1) / (2 * steps))
        shares.append(Fraction(round(spare * w * 1e9), 10**9))
    return shares


def _largest_remainder(shares: list[Fraction], spare: int) -> list[int]:
    floors = [math.floor(s) for s in shares]
    leftover = spare - sum(floors)
    by_fraction = sorted(range(len(shares)), key=lambda i: (-(shares[i] - floors[i]), i))
    for i in by_fraction[:leftover]:
        floors[i] += 1
    return floors


@lru_cache(maxsize=1024)
def dream_quotas(n: int, steps: int, eps: float = DREAM_TIMESTEP_EPS, first_step: int = 0) -> tuple[int, ...]:
    """Dream's linear-timestep transfer schedule (its `diffusion_generate`, every confidence-ranked `alg`).

    Time runs from t = 1 to t = eps over `steps` steps (`torch.linspace(1, eps, steps + 1)`); going from t
    to s, a fraction 1 − s/t of the positions still masked is committed, truncated to an integer, and the
    last step commits whatever is left. With eps = 1e-3 and steps = n the first step commits nothing.
    It is computed in float32 tensors, as the official code computes it, so the counts agree by
    construction rather than by rounding luck (float64 happens to give the same counts for eps = 1e-3
    and every n ≤ 512, S ≤ n; other eps values and longer blocks were not checked).

    first_step: the schedule from that step on, for `n` masks left there (steps − first_step counts); Fast-dLLM's
    cached Dream block starts at step 1 (engine/dream_cache.py).
    """
    timesteps = torch.linspace(1, eps, steps + 1)
    quotas, remaining = [], n
    for t, s in zip(timesteps[first_step:-2], timesteps[first_step + 1 : -1]):
        quota = int(torch.tensor(float(remaining)) * (1 - s / t))
        quotas.append(quota)
        remaining -= quota
    return (*quotas, remaining)


def block_quotas(schedule: str, n: int, steps: int, timestep_eps: float = DREAM_TIMESTEP_EPS) -> list[int]:
    """Tokens to commit at each of `steps` steps of a block holding `n` masked positions.

    timestep_eps: where the "dream" schedule's time ends (the model's generation_config `eps`).
    """
    if not 1 <= steps <= n:
        raise ValueError(f"a block of {n} tokens cannot be denoised in {steps} steps (need 1 ≤ steps ≤ {n})")
    if schedule == "uniform":
        return uniform_quotas(n, steps)
    if schedule == "dream":
        return list(dream_quotas(n, steps, timestep_eps))
    spare = n - steps
    if schedule == "front_loaded":
        shares = _front_loaded_shares(spare, steps)
    elif schedule == "cosine":
        shares = _cosine_shares(spare, steps)
    else:
        raise ValueError(f"unknown block schedule {schedule!r}")
    return [1 + extra for extra in _largest_remainder(shares, spare)]
