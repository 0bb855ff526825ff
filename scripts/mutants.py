"""The mutants that scripts/mutation_check.py applies: small, meaningful faults in the code that decides what a
client gets (sampler, schedules, text, KV cache, batching, scheduler, validation, error mapping).

Each mutant replaces one exact piece of source text (it must occur exactly once in its file) and names the fast
tests that must catch it, most direct first (the run stops at the first failure). A mutant that no test can tell
apart from the original carries `equivalent`: the reason why, which docs/testing.md repeats.

Adding one: pick a fault a plausible edit could introduce, name the behaviour it breaks in `breaks`, list the tests
that guard that behaviour, then run `python scripts/mutation_check.py --only <id>`: it must be killed, or you have
found a gap (write the test) or an equivalent mutant (say why).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str  # relative to the repository root
    before: str  # exact source text, found exactly once in `path`
    after: str
    breaks: str  # the behaviour the mutation breaks, in words
    tests: tuple[str, ...]  # pytest arguments (files or node ids), most direct first
    equivalent: str | None = None  # why no test can distinguish it; None for a mutant the tests must kill


SAMPLER = "engine/sampler.py"
TEXT = "engine/text.py"
SCHEDULES = "engine/schedules.py"
BATCH = "engine/batch.py"
MODEL = "engine/model.py"
DREAM = "engine/dream.py"
DREAM_CACHE = "engine/dream_cache.py"
SCHEDULER = "engine/scheduler.py"
PARAMS = "engine/params.py"

# The sampler's "pinned by hand" tests, and the fixture-reference runs that pin it end to end.
SAMPLER_RULES = "tests/test_sampler_rules.py"
TEMPERATURE = "tests/test_temperature_sampling.py"
LLADA_REFERENCE = "tests/test_reference_generate.py"
FAST_DLLM = "tests/test_kv_cache.py"
FAST_DLLM_DREAM = "tests/test_dream_kv_cache.py"

MUTANTS: tuple[Mutant, ...] = (
    # --- sampler: temperature --------------------------------------------------------------------------------
    Mutant(
        "sampler-gumbel-sign",
        SAMPLER,
        "(logits.double() - p.temperature * torch.log(-torch.log(uniform)))",
        "(logits.double() + p.temperature * torch.log(-torch.log(uniform)))",
        "Gumbel-max samples softmax(logits / T): the noise is +g, g = -log(-log U)",
        (TEMPERATURE,),
    ),
    Mutant(
        "sampler-temperature-inverted",
        SAMPLER,
        "(logits.double() - p.temperature * torch.log(-torch.log(uniform)))",
        "(logits.double() - torch.log(-torch.log(uniform)) / p.temperature)",
        "the temperature divides the logits (higher T flattens the distribution)",
        (TEMPERATURE,),
    ),
    Mutant(
        "sampler-gumbel-exponential-noise",
        SAMPLER,
        "(logits.double() - p.temperature * torch.log(-torch.log(uniform)))",
        "(logits.double() - p.temperature * torch.log(uniform))",
        "the noise is Gumbel (double log), not exponential",
        (TEMPERATURE,),
    ),
    Mutant(
        "sampler-gumbel-shared-noise",
        SAMPLER,
        "torch.rand(logits.shape, generator=self.generator",
        "torch.rand(logits.shape[-1:], generator=self.generator",
        "every candidate position draws its own noise (independent samples)",
        (TEMPERATURE,),
    ),
    # --- sampler: which candidates a step commits --------------------------------------------------------------
    Mutant(
        "sampler-threshold-strict",
        SAMPLER,
        "chosen = confidence >= p.confidence_threshold",
        "chosen = confidence > p.confidence_threshold",
        "threshold decoding commits every candidate with confidence ≥ τ (τ = 1 is valid)",
        (f"{FAST_DLLM}::test_threshold_commits_everything_at_or_above_tau_plus_the_most_confident",),
    ),
    Mutant(
        "sampler-threshold-no-forced-top1",
        SAMPLER,
        "chosen = confidence >= p.confidence_threshold\n            chosen[confidence.argmax(0, keepdim=True)] = True",
        "chosen = confidence >= p.confidence_threshold",
        "threshold decoding always commits the most confident candidate (every forward makes progress)",
        (f"{FAST_DLLM}::test_threshold_always_commits_one_token_and_ties_go_left",),
    ),
    Mutant(
        "sampler-threshold-top1-rightmost",
        SAMPLER,
        "chosen = confidence >= p.confidence_threshold\n            chosen[confidence.argmax(0, keepdim=True)] = True",
        "chosen = confidence >= p.confidence_threshold\n"
        "            chosen[count - 1 - confidence.flip(0).argmax(0, keepdim=True)] = True",
        "the forced top-1 of threshold decoding is the leftmost among equal confidences",
        (f"{FAST_DLLM}::test_threshold_always_commits_one_token_and_ties_go_left",),
    ),
    Mutant(
        "sampler-quota1-rightmost",
        SAMPLER,
        "chosen[confidence.argmax(0, keepdim=True)] = True  # a 1-element index",
        "chosen[count - 1 - confidence.flip(0).argmax(0, keepdim=True)] = True  # a 1-element index",
        "a one-token quota commits the leftmost of equally confident candidates",
        (SAMPLER_RULES,),
    ),
    Mutant(
        "sampler-sort-unstable",
        SAMPLER,
        "torch.sort(confidence, descending=True, stable=True)",
        "torch.sort(confidence, descending=True, stable=False)",
        "a larger quota breaks ties leftmost first (the sort must be stable)",
        (SAMPLER_RULES,),
    ),
    Mutant(
        "sampler-sort-ties-rightmost",
        SAMPLER,
        "chosen[torch.sort(confidence, descending=True, stable=True).indices[:quota]] = True",
        "chosen[count - 1 - torch.sort(confidence.flip(0), descending=True, stable=True).indices[:quota]] = True",
        "a larger quota breaks ties leftmost first",
        (SAMPLER_RULES,),
    ),
    Mutant(
        "sampler-quota-ignores-confidence",
        SAMPLER,
        "chosen[torch.sort(confidence, descending=True, stable=True).indices[:quota]] = True",
        "chosen[:quota] = True",
        "a quota commits the most confident candidates, not the leftmost ones",
        (SAMPLER_RULES, LLADA_REFERENCE),
    ),
    Mutant(
        "sampler-last-step-late",
        SAMPLER,
        "last_step = self.block_step >= p.steps_per_block - 1",
        "last_step = self.block_step >= p.steps_per_block",
        "the last step of a block commits every remaining candidate",
        (SAMPLER_RULES, LLADA_REFERENCE),
        equivalent=(
            "the last scheduled step never has more candidates than its quota: quotas sum to the block length "
            "and every earlier step committed at least its own, so min(count, quota) is already every candidate; "
            "with a threshold, steps_per_block is the block length and each earlier forward committed at least "
            "one token, so at most one candidate is left and the forced top-1 commits it"
        ),
    ),
    Mutant(
        "sampler-commit-drops-token-0",
        SAMPLER,
        "committed = [(offset, token) for offset, token in zip(offsets, proposal) if token >= 0]",
        "committed = [(offset, token) for offset, token in zip(offsets, proposal) if token > 0]",
        "-1 alone means 'leave masked': token id 0 is a real token and is committed",
        (f"{SAMPLER_RULES}::test_commit_applies_token_id_0_and_skips_only_minus_1",),
    ),
    # --- sampler: LocalLeap ---------------------------------------------------------------------------------
    Mutant(
        "leap-anchor-strict",
        SAMPLER,
        "is_anchor = confidence >= anchor",
        "is_anchor = confidence > anchor",
        "LocalLeap anchors are candidates with c ≥ κ (κ = 1 is valid)",
        ("tests/test_local_leap.py",),
    ),
    Mutant(
        "leap-neighbor-strict",
        SAMPLER,
        "(near_anchor & (confidence >= neighbor))",
        "(near_anchor & (confidence > neighbor))",
        "LocalLeap neighbours need c ≥ τ (τ = 1 is valid)",
        ("tests/test_local_leap.py",),
    ),
    Mutant(
        "leap-radius-exclusive",
        SAMPLER,
        "(distance <= radius)",
        "(distance < radius)",
        "a neighbour exactly W positions from an anchor is within the radius",
        ("tests/test_local_leap.py",),
    ),
    # --- sampler: confidence metrics ---------------------------------------------------------------------------
    Mutant(
        "metric-margin-is-top1",
        SAMPLER,
        "return top2[:, 0] - top2[:, 1]",
        "return top2[:, 0]",
        'the "margin" metric is p1 − p2 (Dream\'s topk_margin), not p1',
        (
            "tests/test_sampler_knobs.py::test_margin_is_the_lead_of_the_best_token_over_the_runner_up",
            "tests/test_dream_reference.py",
        ),
    ),
    Mutant(
        "metric-entropy-sign",
        SAMPLER,
        "return (log_probs.exp() * log_probs).sum(-1).exp()",
        "return (-(log_probs.exp() * log_probs).sum(-1)).exp()",
        '"entropy_inverse" is exp(−H): lower entropy, higher confidence',
        ("tests/test_sampler_knobs.py::test_confidence_metrics",),
    ),
    # --- sampler: finishing -------------------------------------------------------------------------------------
    Mutant(
        "sampler-last-eos-wins",
        SAMPLER,
        "if self.stop_offset is None and self.generated[self.first_masked] in self.stop_ids:",
        "if self.generated[self.first_masked] in self.stop_ids:",
        "the answer ends at the first EOS/EOT of the committed prefix",
        (f"{LLADA_REFERENCE}::test_reproduces_official_generate_token_for_token",),
    ),
    Mutant(
        "sampler-no-early-exit",
        SAMPLER,
        "ending = self.block == p.num_blocks or (hit_stop_token and p.early_exit)",
        "ending = self.block == p.num_blocks",
        "early exit ends a request once its committed prefix holds an EOS/EOT",
        (f"{LLADA_REFERENCE}::test_early_exit_saves_forward_passes_somewhere",),
    ),
    Mutant(
        "sampler-no-release-on-finish",
        SAMPLER,
        "self.finished = True\n        self.release()",
        "self.finished = True",
        "a finished request drops its KV cache with its result",
        (f"{FAST_DLLM}::test_cache_lives_from_the_first_forward_to_the_end",),
    ),
    # --- sampler: KV-cache spans ---------------------------------------------------------------------------------
    Mutant(
        "kv-dual-span-is-prefix",
        SAMPLER,
        'end = self.length if self.params.kv_cache == "prefix" else start + self.params.block_length',
        "end = self.length",
        '"dual" recomputes the current block alone',
        (f"{FAST_DLLM}::test_reproduces_official_fast_dllm_sampler",),
    ),
    Mutant(
        "kv-cache-never-refreshed",
        SAMPLER,
        "if not self.uses_kv_cache or self.block_step == 0:",
        "if not self.uses_kv_cache or self.step == 0:",
        "every block's first forward recomputes the whole canvas and refreshes the cache",
        (f"{FAST_DLLM}::test_reproduces_official_fast_dllm_sampler",),
    ),
    # --- text ---------------------------------------------------------------------------------------------------
    Mutant(
        "text-stop-last-occurrence",
        TEXT,
        "(text.find(s) for s in stop)",
        "(text.rfind(s) for s in stop)",
        "the text is cut at the first occurrence of a stop string",
        ("tests/test_text.py", "tests/test_http_protocol.py::test_stop_string_cuts_the_text_at_its_first_occurrence"),
    ),
    Mutant(
        "text-stop-latest-string",
        TEXT,
        "cut = min((i for i in",
        "cut = max((i for i in",
        "the text is cut at whichever stop string starts first",
        ("tests/test_text.py",),
    ),
    Mutant(
        "text-no-utf8-holdback",
        TEXT,
        "text = text.rstrip(REPLACEMENT_CHAR)",
        "text = text",
        "a character split over tokens is held back until complete",
        ("tests/test_text.py",),
    ),
    Mutant(
        "text-no-stop-prefix-holdback",
        TEXT,
        "undecided = len(text) - _stop_prefix_overlap(text, self._stop)",
        "undecided = len(text)",
        "text that may still grow into a stop string is held back",
        ("tests/test_text.py",),
    ),
    Mutant(
        "text-stop-decided-late",
        TEXT,
        "self.stopped = found and len(cut) <= undecided",
        "self.stopped = found and len(cut) < undecided",
        "a stop string ends the request as soon as nothing can start before it",
        ("tests/test_text.py",),
    ),
    # --- schedules ----------------------------------------------------------------------------------------------
    Mutant(
        "schedule-uniform-remainder-late",
        SCHEDULES,
        "[base + (1 if i < extra else 0) for i in range(steps)]",
        "[base + (1 if i >= steps - extra else 0) for i in range(steps)]",
        "LLaDA's uniform schedule gives the remainder to the first steps",
        ("tests/test_schedules.py",),
    ),
    Mutant(
        "schedule-remainder-ties-late",
        SCHEDULES,
        "key=lambda i: (-(shares[i] - floors[i]), i))",
        "key=lambda i: (-(shares[i] - floors[i]), -i))",
        "largest-remainder rounding gives a tied leftover token to the earlier step",
        ("tests/test_schedules.py",),
    ),
    Mutant(
        "schedule-front-loaded-reversed",
        SCHEDULES,
        "Fraction(spare * (2 * (steps - i) - 1), steps * steps)",
        "Fraction(spare * (2 * i + 1), steps * steps)",
        '"front_loaded" commits more tokens early',
        ("tests/test_schedules.py", "tests/test_sampler_knobs.py::test_each_step_commits_its_scheduled_quota"),
    ),
    Mutant(
        "schedule-dream-rounds",
        SCHEDULES,
        "quota = int(torch.tensor(float(remaining)) * (1 - s / t))",
        "quota = round(float(torch.tensor(float(remaining)) * (1 - s / t)))",
        "Dream's schedule truncates each step's share, as the official code does",
        ("tests/test_dream_reference.py::test_dream_schedule_matches_every_recorded_transfer_count",),
    ),
    # --- batching and the KV cache --------------------------------------------------------------------------------
    Mutant(
        "batch-padding-visible",
        BATCH,
        " mask += [0] * pad + [1] * request.length",  # the leading space tells it from key_mask
        " mask += [1] * (pad + request.length)",
        "left padding is hidden from attention in a shared forward",
        (f"{LLADA_REFERENCE}::test_batched_reference_rows_reproduced_in_one_shared_forward",),
    ),
    Mutant(
        "kv-columns-past-the-canvas-visible",
        BATCH,
        "key_mask += [1] * request.length + [0] * (key_width - request.length)",
        "key_mask += [1] * key_width",
        "a shorter row's keys past its own canvas (another occupant's stale columns) are hidden",
        (f"{FAST_DLLM}::test_cached_requests_batched_with_others_match_their_solo_runs",),
    ),
    Mutant(
        "kv-mask-only-with-dummies",
        BATCH,
        "hide_keys = static is not None or batch > len(rows) "
        "or any(request.length < key_width for request in requests)",
        "hide_keys = static is not None or batch > len(rows)",
        "columns past a shorter row's canvas are hidden even when no dummy row is in the frame",
        (f"{FAST_DLLM}::test_cached_requests_batched_with_others_match_their_solo_runs",),
    ),
    Mutant(
        "compiled-key-window-the-pool",
        "engine/compiled.py",
        "return pool_width if self.on_cuda else longest_canvas",
        "return pool_width",
        "on CPU a compiled cached step reads the keys of its canvases only, not the pool's whole width",
        (
            "tests/test_compiled.py::test_a_compiled_cached_step_reads_only_its_canvases_keys_on_cpu_and_the_whole_pool_on_cuda",
        ),
    ),
    Mutant(
        "aot-graph-reads-strided-inputs",
        "engine/compiled.py",
        "else a.contiguous() for a in args]",
        "else a for a in args]",
        "an ahead-of-time graph gets contiguous inputs (it reads every input with the strides it was exported with)",
        ("tests/test_compiled.py::test_the_ahead_of_time_graph_writes_the_pool_in_place_and_gives_eagers_logits",),
    ),
    Mutant(
        "aot-graph-compiled-at-every-start",
        "engine/aot_graphs.py",
        "cached = package.exists()",
        "cached = False",
        "a restart loads its compiled graphs from the disk cache instead of compiling them again",
        ("tests/test_compiled.py::test_a_restart_loads_its_graphs_from_the_disk_cache_without_compiling",),
    ),
    Mutant(
        "aot-key-window-unchecked",
        "engine/aot_graphs.py",
        "if window is not None and args[window[0]].shape[1] not in window[1]:",
        "if False:",
        "a key window outside the graph's exported range runs eagerly",
        ("tests/test_compiled.py::test_the_ahead_of_time_graph_writes_the_pool_in_place_and_gives_eagers_logits",),
    ),
    Mutant(
        "kv-positions-count-the-fill",
        BATCH,
        "positions += [*range(row.start, row.end), *[0] * fill]",
        "positions += [*range(row.start + fill, row.end + fill), *[0] * fill]",
        "a cached key's rotary position is its place in its own canvas",
        (f"{FAST_DLLM}::test_cached_requests_batched_with_others_match_their_solo_runs",),
    ),
    Mutant(
        "kv-slot-move-skips-the-cache",
        "engine/kv_slots.py",
        "self.pool[:, :, row] = self.pool[:, :, last]",
        "pass",
        "a request moved into a freed row keeps its cache (the rows stay compact)",
        (f"{FAST_DLLM}::test_caches_are_rows_of_one_pool_written_in_place_and_freed_at_the_end",),
    ),
    Mutant(
        "kv-write-skips-values",
        MODEL,
        "self.buffer.index_put_(self.value_index, v)",
        "pass",
        "a cached forward writes the fresh values of the positions it computes",
        (f"{FAST_DLLM}::test_reproduces_official_fast_dllm_sampler",),
    ),
    Mutant(
        "model-padding-visible",
        MODEL,
        "key_mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]",
        "key_mask = None",
        "the model hides left padding from attention",
        ("tests/test_model.py::test_left_padded_row_equals_unpadded_row",),
    ),
    Mutant(
        "dream-logits-unshifted",
        DREAM,
        "columns = (logit_index.columns - 1).clamp(min=0)",
        "columns = logit_index.columns",
        "Dream predicts column c at c − 1 (shifted logits)",
        ("tests/test_dream_model.py::test_logit_index_returns_the_predictions_for_its_columns",),
    ),
    Mutant(
        "dream-positions-count-padding",
        DREAM,
        "positions = (attention_mask.long().cumsum(1) - 1).clamp(min=0)",
        "positions = torch.arange(length, device=input_ids.device)[None].expand(input_ids.shape[0], -1)",
        "a padded Dream row numbers its positions from its first real token",
        ("tests/test_dream_model.py::test_a_row_behind_long_padding_sees_the_positions_it_has_alone",),
    ),
    # --- the KV cache on Dream -------------------------------------------------------------------------------------
    Mutant(
        "dream-kv-no-block-start-commit",
        DREAM_CACHE,
        "if self.block_step == 0:\n            return [self.block * self.params.block_length]",
        "if False:\n            return [self.block * self.params.block_length]",
        "a cached Dream block's full forward commits its first position only (the shifted logits)",
        (f"{FAST_DLLM_DREAM}::test_reproduces_official_fast_dllm_dream_sampler",),
    ),
    Mutant(
        "dream-kv-spent-forward-commits",
        DREAM_CACHE,
        "if self._spent_forward():",
        "if False:",
        "with one step per block, the official cached forward commits nothing and leaves the block's masks",
        (f"{FAST_DLLM_DREAM}::test_a_block_with_one_step_keeps_its_masks_and_returns_text_up_to_the_first",),
    ),
    Mutant(
        "dream-kv-schedule-restarts",
        DREAM_CACHE,
        "return [1, *dream_quotas(left, steps, eps, first_step=1)]",
        "return [1, *dream_quotas(left, steps - 1, eps)]",
        "a cached Dream block continues Dream's time grid after the block-start commit",
        (f"{FAST_DLLM_DREAM}::test_the_cached_quota_counts_are_the_official_loop_s",),
    ),
    Mutant(
        "dream-kv-positions-count-padding",
        DREAM,
        "positions, key_mask = kv.positions, ",
        "positions, key_mask = kv.columns, ",
        "a padded cached Dream row keeps its own rotary positions",
        (f"{FAST_DLLM_DREAM}::test_cached_dream_requests_batched_with_others_match_the_official_runs",),
    ),
    # --- scheduler --------------------------------------------------------------------------------------------------
    Mutant(
        "scheduler-capacity-off-by-one",
        SCHEDULER,
        "if self._running + waiting >= capacity:",
        "if self._running + waiting > capacity:",
        "the queue holds max_batch_size running + max_waiting waiting requests, not one more",
        ("tests/test_scheduler.py::test_overload_fires_exactly_at_the_bound",),
    ),
    Mutant(
        "scheduler-budget-strict",
        SCHEDULER,
        "self._kv_cache_reserved + handle.kv_cache_bytes <= budget",
        "self._kv_cache_reserved + handle.kv_cache_bytes < budget",
        "caches that fill the KV budget exactly run together",
        ("tests/test_scheduler.py::test_caches_that_fill_the_budget_exactly_run_together",),
    ),
    Mutant(
        "scheduler-budget-ignored",
        SCHEDULER,
        "return budget is None or not self._active or self._kv_cache_reserved + handle.kv_cache_bytes <= budget",
        "return True",
        "a request whose cache does not fit beside the running ones waits",
        ("tests/test_scheduler.py::test_requests_wait_for_kv_cache_memory_and_uncached_ones_do_not",),
    ),
    Mutant(
        "scheduler-budget-checked-when-idle",
        SCHEDULER,
        "return budget is None or not self._active or self._kv_cache_reserved",
        "return budget is None or self._kv_cache_reserved",
        "with nothing running, the next request is admitted whatever its cache",
        ("tests/test_scheduler.py::test_requests_wait_for_kv_cache_memory_and_uncached_ones_do_not",),
        equivalent=(
            "with nothing running no cache is reserved, and the engine refuses up front any request whose cache "
            "exceeds the whole budget (DiffusionEngine.new_request), so the remaining comparison holds anyway"
        ),
    ),
    Mutant(
        "scheduler-lifo",
        SCHEDULER,
        "handle = self._waiting.popleft()",
        "handle = self._waiting.pop()",
        "waiting requests are admitted first come, first served",
        ("tests/test_scheduler.py::test_requests_wait_for_kv_cache_memory_and_uncached_ones_do_not",),
    ),
    Mutant(
        "scheduler-no-release-on-cancel",
        SCHEDULER,
        "self._kv_cache_reserved -= handle.kv_cache_bytes\n            handle.request.release()",
        "self._kv_cache_reserved -= handle.kv_cache_bytes",
        "a cancelled request drops its KV cache",
        ("tests/test_scheduler.py::test_cancelled_and_finished_requests_give_their_cache_back",),
    ),
    Mutant(
        "scheduler-reservation-kept",
        SCHEDULER,
        "self._kv_cache_reserved -= handle.kv_cache_bytes\n",
        "\n",
        "a request that leaves gives its KV-cache reservation back",
        ("tests/test_scheduler.py::test_cancelled_and_finished_requests_give_their_cache_back",),
    ),
    Mutant(
        "scheduler-cancelled-waiter-kept",
        SCHEDULER,
        "if any(h.cancelled for h in self._waiting):",
        "if False:",
        "a cancelled waiting request frees its queue place at the next iteration, even while every slot is busy",
        ("tests/test_scheduler.py::test_a_cancelled_waiting_request_frees_its_queue_place_at_once",),
    ),
    # --- parameter validation ----------------------------------------------------------------------------------------
    Mutant(
        "params-upper-bound-exclusive",
        PARAMS,
        "below_high = high is None or value <= high",
        "below_high = high is None or value < high",
        "every knob's maximum is valid (temperature 2, confidence_threshold 1, 512 steps)",
        ("tests/test_params.py::test_valid_edge_values_are_accepted",),
    ),
    Mutant(
        "params-lower-bound-exclusive",
        PARAMS,
        "value > low or (value == low and not self.exclusive_minimum)",
        "value > low or False",
        "every knob's minimum is valid unless its spec excludes it (temperature 0, LocalLeap thresholds 0)",
        ("tests/test_params.py::test_valid_edge_values_are_accepted",),
    ),
    Mutant(
        "params-threshold-accepts-0",
        PARAMS,
        "value > low or (value == low and not self.exclusive_minimum)",
        "value >= low",
        "confidence_threshold 0 is refused (it would commit the whole block at once)",
        ("tests/test_kv_cache.py::test_invalid_cache_and_threshold_settings_name_their_field",),
    ),
    Mutant(
        "params-steps-per-block-bound",
        PARAMS,
        "if self.steps_per_block > self.block_length:",
        "if self.steps_per_block >= self.block_length:",
        "as many steps as tokens in a block (one token per step) is valid",
        ("tests/test_params.py",),
    ),
    Mutant(
        "params-temperature-max",
        PARAMS,
        "MAX_TEMPERATURE = 2.0",
        "MAX_TEMPERATURE = 1.99",
        "temperature 2 is valid",
        ("tests/test_params.py",),
    ),
    Mutant(
        "params-leap-radius-max",
        PARAMS,
        "MAX_LOCAL_LEAP_RADIUS = 16",
        "MAX_LOCAL_LEAP_RADIUS = 15",
        "local_leap_radius 16 is valid",
        ("tests/test_params.py",),
    ),
    Mutant(
        "params-leap-threshold-range",
        PARAMS,
        '"number", minimum=0, maximum=1, requires="use_local_leap", when_on=0.9,',
        '"number", minimum=0.01, maximum=1, requires="use_local_leap", when_on=0.9,',
        "LocalLeap thresholds of 0 are valid",
        ("tests/test_params.py",),
    ),
    Mutant(
        "params-seed-max",
        PARAMS,
        "SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1",
        "SEED_MIN, SEED_MAX = -(2**63), 2**64 - 2",
        "seed 2**64 − 1 is valid (torch.Generator accepts it)",
        ("tests/test_params.py",),
    ),
    Mutant(
        "params-leap-setting-without-switch",
        PARAMS,
        "            if not is_on(getattr(params, self.requires)):\n                if value is not None:",
        "            if not is_on(getattr(params, self.requires)):\n                if False:",
        "a LocalLeap setting without use_local_leap is refused, never silently ignored",
        ("tests/test_params.py", "tests/test_http_validation.py"),
    ),
    # --- HTTP validation and errors -------------------------------------------------------------------------------
    Mutant(
        "request-id-max-127",
        "schemas/request_id.py",
        "MAX_REQUEST_ID_LENGTH = 128",
        "MAX_REQUEST_ID_LENGTH = 127",
        "an X-Request-ID of 128 characters is honoured",
        ("tests/test_http_protocol.py::test_request_id_length_bounds",),
    ),
    Mutant(
        "request-id-max-129",
        "schemas/request_id.py",
        "MAX_REQUEST_ID_LENGTH = 128",
        "MAX_REQUEST_ID_LENGTH = 129",
        "an X-Request-ID of 129 characters is refused",
        ("tests/test_http_protocol.py::test_request_id_length_bounds",),
    ),
    Mutant(
        "request-id-length-strict",
        "schemas/request_id.py",
        "1 <= len(value) <= MAX_REQUEST_ID_LENGTH",
        "1 <= len(value) < MAX_REQUEST_ID_LENGTH",
        "an X-Request-ID of 128 characters is honoured",
        ("tests/test_http_protocol.py::test_request_id_length_bounds",),
    ),
    Mutant(
        "request-id-allows-del",
        "schemas/request_id.py",
        'all("!" <= c <= "~" for c in value)',
        'all("!" <= c <= "\\x7f" for c in value)',
        "an X-Request-ID is printable ASCII: DEL is refused",
        ("tests/test_http_protocol.py::test_request_id_length_bounds",),
    ),
    Mutant(
        "chat-neutral-ignores-type",
        "schemas/fields.py",
        "    if type(value) is not type(neutral):\n        return False\n",
        "",
        "only the neutral value in its own JSON type is accepted (n: 1, not n: true or n: 1.0)",
        ("tests/test_http_validation.py::test_adr_rejected_field_is_a_400_citing_the_adr",),
    ),
    Mutant(
        "chat-stream-options-without-stream",
        "schemas/sampling.py",
        "if self.stream_options is not None and not self.stream:",
        "if False:",
        "stream_options is refused without stream: true",
        ("tests/test_http_validation.py::test_out_of_range_or_inconsistent_extension_field_is_a_400",),
    ),
    Mutant(
        "api-overload-is-500",
        "api/errors.py",
        "if isinstance(error, EngineOverloaded):",
        "if False:",
        "a full queue is a 429 with Retry-After, not a 500",
        ("tests/test_http_engine_states.py::test_a_full_queue_is_a_429_through_the_real_engine",),
    ),
    Mutant(
        "api-shutdown-is-500",
        "api/errors.py",
        "if isinstance(error, EngineShutdown):",
        "if False:",
        "a request the stopping engine refuses is a 503 shutting_down",
        ("tests/test_http_engine_states.py::test_a_request_still_waiting_at_shutdown_is_a_503",),
    ),
    Mutant(
        "api-not-ready-is-500",
        "api/app.py",
        "if engine is None:\n        raise APIError.not_ready()",
        "if False:\n        raise APIError.not_ready()",
        "while the model loads, /v1 answers 503 model_not_ready",
        ("tests/test_http_engine_states.py::test_before_the_model_is_loaded_v1_is_a_503_model_not_ready",),
    ),
    Mutant(
        "api-405-as-generic-error",
        "api/app.py",
        "    if allowed:\n        raise APIError.method_not_allowed",
        "    if False:\n        raise APIError.method_not_allowed",
        "a wrong method on a /v1 route is a 405 method_not_allowed with an Allow header",
        ("tests/test_http_protocol.py::test_wrong_method_on_a_v1_route",),
    ),
)
