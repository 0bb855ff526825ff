"""Which active requests share the next forward: a pure policy, no threads, no torch.

Every row of a batched forward is computed at the batch's widest step width (left padding), so sharing a
forward costs padding, while splitting the batch pays the forward's fixed cost once more.
`ForwardCost` measures that trade-off on the running device, `length_groups` cuts the active set into
the cheapest groups, and `next_batch` picks the group whose turn it is. The scheduler thread
(engine/scheduler.py) calls `next_batch` once per iteration.

Lengths: a request's *canvas* is the `gen_length` positions being denoised; its *row* is prompt + canvas.
The policy sees each request's *step width*: the positions its next forward computes, the whole row
without a KV cache, less with one (see `RequestHandle.step_width` in engine/scheduler.py).
"""

from __future__ import annotations

from typing import Protocol, TypeVar

# Until the cost of a forward has been measured, merging a length group saves a forward only if the
# forward's fixed cost exceeds this many padded tokens.
PRIOR_OVERHEAD_TOKENS = 256.0


class BatchCandidate(Protocol):
    """What the policy reads of an active request (the scheduler's RequestHandle)."""

    @property
    def step_width(self) -> int: ...  # positions its next forward computes

    @property
    def runs_alone(self) -> bool: ...  # force_single_batch

    @property
    def order(self) -> int: ...  # submission order: the tie-break

    @property
    def start_tag(self) -> float: ...  # when its next step is due, in the scheduler's virtual time (below)


Candidate = TypeVar("Candidate", bound=BatchCandidate)


class ForwardCost:
    """Seconds per forward ≈ overhead + per_token × (rows × width), fitted online over recent forwards.

    Padding is the one cost a shared forward adds: every row is computed at the batch's widest step width.
    Splitting the batch saves that padding but pays the forward's fixed cost (kernel launches, weight
    reads, Python) once more. Which wins depends on the device and the model by orders of magnitude (a
    small model on a CPU is compute-bound from batch 1; an LLM on a GPU is bound by weight reads until
    thousands of tokens), so the ratio, `overhead_tokens`, is measured rather than configured: a
    least-squares line through recent (tokens, seconds) pairs, with exponential forgetting.
    """

    DECAY = 0.98  # weight of the previous observations at each new one: the fit follows ~50 forwards
    MIN_WEIGHT = 8.0  # observations (decayed) before the fit is trusted
    MIN_SPREAD = 0.1  # std of the token counts, relative to their mean, needed to separate the two terms
    OUTLIER_FACTOR = 2.0  # a forward slower than this × the prediction (a GC pause, a compile) counts as this

    def __init__(self, prior_overhead_tokens: float = PRIOR_OVERHEAD_TOKENS):
        self.overhead_tokens = prior_overhead_tokens
        self._sums = [0.0] * 5  # Σw, Σw·x, Σw·y, Σw·x², Σw·x·y
        self._line: tuple[float, float] | None = None  # (intercept s, slope s/token) once fitted

    def observe(self, tokens: int, seconds: float) -> None:
        if self._line is not None:
            seconds = min(seconds, self.OUTLIER_FACTOR * (self._line[0] + self._line[1] * tokens))
        self._sums = [total * self.DECAY for total in self._sums]
        for i, value in enumerate((1.0, tokens, seconds, tokens * tokens, tokens * seconds)):
            self._sums[i] += value
        w, sx, sy, sxx, sxy = self._sums
        mean_x, mean_y = sx / w, sy / w
        variance = sxx / w - mean_x * mean_x
        if w < self.MIN_WEIGHT or variance <= (self.MIN_SPREAD * mean_x) ** 2:
            return  # every recent forward had about the same size: the two terms cannot be told apart
        slope = (sxy / w - mean_x * mean_y) / variance
        if slope <= 0:
            return  # noise: more tokens cannot be cheaper
        intercept = max(mean_y - slope * mean_x, 0.0)
        self._line = (intercept, slope)
        self.overhead_tokens = intercept / slope


def length_groups(
    active: list[Candidate], overhead_tokens: float, token_budget: float = float("inf")
) -> list[list[Candidate]]:
    """Split the active set into the groups that share a forward, at the least estimated cost per round.

    A `force_single_batch` request is a group of its own (bit-reproducible output whatever the load).
    The others, sorted by step width (what each computes in its next forward), are cut into contiguous
    groups minimising Σ_groups (overhead_tokens + rows × widest step): the cost, in tokens, of one round in
    which every request steps once. Minimising it maximises throughput and minimises every request's time
    per step alike; requests running block-sized cached steps, for one, are not padded up to the whole
    canvases of others unless padding is cheaper than another forward on this device. A group of several
    requests computes at most `token_budget` positions (rows × widest step): a request wider than that, a long
    prompt, runs alone, so a short request's step is never padded to a long one, however cheap padding looks.
    A dynamic programme over at most max_batch_size requests; ties keep groups merged.
    """
    singles = [[request] for request in active if request.runs_alone]
    shared = sorted((r for r in active if not r.runs_alone), key=lambda r: (r.step_width, r.order))
    if not shared or (
        len(shared) * (shared[-1].step_width - shared[0].step_width) <= overhead_tokens
        and (len(shared) == 1 or len(shared) * shared[-1].step_width <= token_budget)
    ):
        # All the padding together costs less than one extra forward: no split can be cheaper.
        return singles + ([shared] if shared else [])
    best = [0.0] + [float("inf")] * len(shared)  # best[j]: cheapest split of shared[:j]
    cut = [0] * (len(shared) + 1)
    for j in range(1, len(shared) + 1):
        width = shared[j - 1].step_width
        for i in range(j):
            if j - i > 1 and (j - i) * width > token_budget:
                continue  # over the budget: these cannot share a forward
            cost = best[i] + overhead_tokens + (j - i) * width
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], len(shared)
    while j > 0:
        groups.append(shared[cut[j] : j])
        j = cut[j]
    return singles + groups[::-1]


def next_batch(active: list[Candidate], overhead_tokens: float, token_budget: float = float("inf")) -> list[Candidate]:
    """The group holding the request whose next step is due first (the smallest start tag; the older on a tie).

    Usually there is one group (everyone steps every iteration). Otherwise groups take turns by the time their
    forwards take (start-time fair queuing; the scheduler keeps the tags): a request's tag advances by the
    seconds of each forward it takes part in, and a request admitted starts at the tag of the forward that ran
    last. So groups get the engine in equal shares of time, not of steps: beside a long prompt whose step
    takes seconds, a short request runs until it has had as much time as one long step before the long one
    runs again, and waits behind at most the one step that was running when it arrived.
    """
    if len(active) == 1:
        return list(active)  # a lone request (the common case when idle): nothing to decide
    due = min(active, key=lambda r: (r.start_tag, r.order))
    for group in length_groups(active, overhead_tokens, token_budget):
        if any(r is due for r in group):
            return sorted(group, key=lambda r: r.order)
    raise AssertionError("every active request belongs to a group")
