"""Engine statistics for `/metrics`: a few gauges, counters and histograms, with no metrics library.

The scheduler thread writes, HTTP handlers read; one lock guards everything (updates are a handful of
integer additions per forward, far below the cost of the forward itself). `prometheus_text()` renders the
Prometheus text exposition format so the service can append it to BentoML's own /metrics output;
`snapshot()` gives the same numbers as a dict for tests, logs and benchmarks.

Tokens per forward is derivable: dllm_tokens_committed_total / dllm_forward_passes_total, and the mean
batch size is dllm_batch_size_sum / dllm_batch_size_count.
"""

from __future__ import annotations

import bisect
import math
import threading
from dataclasses import dataclass, field

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
DURATION_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


@dataclass
class Histogram:
    """Cumulative-on-render histogram: per-bucket counts are kept disjoint and summed when rendered."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # one per bucket, plus the +Inf overflow
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        running, out = 0, []
        for bound, count in zip((*self.buckets, math.inf), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == math.inf else _number(bound), running))
        return out


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


# name → (type, help). The names are part of the HTTP contract (docs/design.md, "HTTP fine print"); do not rename.
METRICS = {
    "dllm_requests_running": ("gauge", "Requests admitted to the scheduler and being denoised."),
    "dllm_requests_waiting": ("gauge", "Requests accepted but not yet admitted (waiting for a batch slot)."),
    "dllm_requests_preparing": ("gauge", "Requests being tokenized and validated, or queued for it."),
    "dllm_kv_cache_bytes": ("gauge", "KV-cache memory reserved by running requests (Fast-dLLM or LLaDA2 block cache)."),
    "dllm_kv_cache_budget_bytes": ("gauge", "KV-cache memory running requests may reserve together."),
    "dllm_model_weight_bytes": ("gauge", "Bytes of the loaded model's weights (quantized ones at their packed size)."),
    "dllm_model_quantization_info": ("gauge", "Always 1; its label says the loaded weights' quantization."),
    "dllm_compiled_shapes": ("gauge", "Shape buckets the compiled forward has compiled (0 when it runs eagerly)."),
    "dllm_compile_recompiles_total": (
        "counter",
        "Shapes compiled after warm-up ended, while serving (each one stalls its step; 0 when warm-up covers traffic).",
    ),
    "dllm_warm_up_seconds": ("gauge", "Seconds the startup warm-up took (compiling the configured shape buckets)."),
    "dllm_requests_total": ("counter", "Requests accepted by the scheduler (rejected-as-overloaded excluded)."),
    "dllm_requests_cancelled_total": ("counter", "Requests cancelled by their consumer (client disconnect)."),
    "dllm_requests_overloaded_total": ("counter", "Requests refused because the engine was at capacity (HTTP 429)."),
    "dllm_forward_passes_total": ("counter", "Model forward passes run by the scheduler (one per step)."),
    "dllm_tokens_committed_total": ("counter", "Canvas tokens committed, over all requests and steps."),
    "dllm_batch_size": ("histogram", "Requests sharing each forward pass."),
    "dllm_request_duration_seconds": ("histogram", "Seconds from submission to the last event, completed requests."),
}


class EngineStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests_running = 0
        self.requests_waiting = 0
        self.requests_preparing = 0
        self.kv_cache_bytes = 0
        self.kv_cache_budget_bytes = 0
        self.model_weight_bytes = 0
        self.quantization = "none"
        self.compiled_shapes = 0
        self.compile_recompiles_total = 0
        self.warm_up_seconds = 0.0
        self.requests_total = 0
        self.requests_cancelled_total = 0
        self.requests_overloaded_total = 0
        self.forward_passes_total = 0
        self.tokens_committed_total = 0
        self.batch_size = Histogram(BATCH_SIZE_BUCKETS)
        self.request_duration_seconds = Histogram(DURATION_BUCKETS_S)

    # --- written by the scheduler and the preparation stage ---------------------------------------------

    def set_preparing(self, preparing: int) -> None:
        with self._lock:
            self.requests_preparing = preparing

    def request_overloaded(self) -> None:
        with self._lock:
            self.requests_overloaded_total += 1

    def request_accepted(self) -> None:
        with self._lock:
            self.requests_total += 1

    def set_queue_sizes(self, running: int, waiting: int, kv_cache_bytes: int = 0) -> None:
        with self._lock:
            self.requests_running = running
            self.requests_waiting = waiting
            self.kv_cache_bytes = kv_cache_bytes

    def set_kv_cache_budget(self, budget_bytes: int) -> None:
        with self._lock:
            self.kv_cache_budget_bytes = budget_bytes

    def set_model(self, weight_bytes: int, quantization: str) -> None:
        with self._lock:
            self.model_weight_bytes = weight_bytes
            self.quantization = quantization

    def set_compile(self, shapes: int, recompiles: int) -> None:
        with self._lock:
            self.compiled_shapes = shapes
            self.compile_recompiles_total = recompiles

    def set_warm_up(self, seconds: float) -> None:
        with self._lock:
            self.warm_up_seconds = seconds

    def forward_done(self, batch_size: int, tokens_committed: int) -> None:
        with self._lock:
            self.forward_passes_total += 1
            self.tokens_committed_total += tokens_committed
            self.batch_size.observe(batch_size)

    def request_completed(self, duration_s: float) -> None:
        with self._lock:
            self.request_duration_seconds.observe(duration_s)

    def request_cancelled(self) -> None:
        with self._lock:
            self.requests_cancelled_total += 1

    # --- read by /metrics, tests, benchmarks --------------------------------------------------------

    def snapshot(self) -> dict:
        """Every metric by its exposition name; histograms as {"buckets": {le: cumulative}, "sum", "count"}."""
        with self._lock:
            out: dict = {
                "dllm_requests_running": self.requests_running,
                "dllm_requests_waiting": self.requests_waiting,
                "dllm_requests_preparing": self.requests_preparing,
                "dllm_kv_cache_bytes": self.kv_cache_bytes,
                "dllm_kv_cache_budget_bytes": self.kv_cache_budget_bytes,
                "dllm_model_weight_bytes": self.model_weight_bytes,
                "dllm_model_quantization_info": {"labels": {"quantization": self.quantization}, "value": 1},
                "dllm_compiled_shapes": self.compiled_shapes,
                "dllm_compile_recompiles_total": self.compile_recompiles_total,
                "dllm_warm_up_seconds": round(self.warm_up_seconds, 3),
                "dllm_requests_total": self.requests_total,
                "dllm_requests_cancelled_total": self.requests_cancelled_total,
                "dllm_requests_overloaded_total": self.requests_overloaded_total,
                "dllm_forward_passes_total": self.forward_passes_total,
                "dllm_tokens_committed_total": self.tokens_committed_total,
            }
            for name, hist in (
                ("dllm_batch_size", self.batch_size),
                ("dllm_request_duration_seconds", self.request_duration_seconds),
            ):
                out[name] = {"buckets": dict(hist.cumulative()), "sum": hist.total, "count": hist.count}
        return out

    def prometheus_text(self) -> str:
        """Prometheus text exposition format (version 0.0.4), newline-terminated."""
        lines: list[str] = []
        for name, value in self.snapshot().items():
            kind, help_text = METRICS[name]
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            if kind == "histogram":
                lines += [f'{name}_bucket{{le="{le}"}} {count}' for le, count in value["buckets"].items()]
                lines += [f"{name}_sum {_number(value['sum'])}", f"{name}_count {value['count']}"]
            elif isinstance(value, dict):  # an info gauge: its labels carry the information
                labels = ",".join(f'{key}="{text}"' for key, text in value["labels"].items())
                lines.append(f"{name}{{{labels}}} {value['value']}")
            else:
                lines.append(f"{name} {value}")
        return "\n".join(lines) + "\n"
