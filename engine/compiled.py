"""A compiled forward with static shapes: each step is padded into a bucket so that one graph serves it.

A compiled graph is specialised on its input shapes. A denoising step's shapes change
all the time (batch size, canvas and span lengths, the number of masked candidates), so engine/batch.py pads
each step up to a bucket (`StaticShapes`): batch sizes from a short list (1, 2, 4, 8 by default; padding rows
are dummies), lengths rounded up (to 32 up to 64, then to 128) and the candidates per row to a multiple of 32.
Padding never reaches a real row: padded positions are hidden keys, dummy rows see only themselves, and the
logits of padded candidates are dropped after the graph. One dimension is left symbolic instead: a cached
step's key window (the canvas length it attends over), so that one graph serves every canvas length without
reading keys past the canvases (`StaticShapes.key_window`; on CUDA the window is the pool's whole width).

Only short forwards run compiled: at most `COMPILED_SPAN` (64) positions per row, a cached step over its block.
Those are the steps whose cost is overhead (a kernel call per operator for little arithmetic), which a graph
removes. A longer forward (a whole canvas: the uncached step, a block's first forward with a cache, the
prefix cache's query to the canvas's end) is arithmetic: a graph saves little on it, and its bucket (lengths
rounded up to 128, the key window to the pool's width) costs more than that, so it runs eagerly (measured:
docs/benchmarks.md, "Only the short forwards compiled").

On CPU each bucket's graph is compiled ahead of time (engine/aot_graphs.py: exported, compiled by AOTInductor
into a shared library, called with a flat list of tensors and no guards): one cached dual step 2.12x eager at
batch 1 and 1.71x at batch 8, against 1.75x and 1.57x through torch.compile with inductor's C++ wrapper, whose
guards and wrapper were the rest of the step's cost (benchmarks/compiled_step.py, docs/benchmarks.md "Ahead of
time"). On CUDA it is torch.compile's graph captured as a CUDA graph per bucket (mode "reduce-overhead"), which
is what removes the per-kernel launch cost; the KV pool, which the graph writes in place, is marked as a static
input so the capture may keep its address.

The graph writes the pool in place because `KVFrame` (engine/model.py) writes with an `index_put_` on the
pool tensor itself, a graph input. Written through a view of it instead (the flat `.view(-1, head_dim)` it
used before), inductor functionalized the write into a clone of the whole pool and a copy of it all back per
call, so a compiled cached step cost the pool's size (2-3x slower than eager with an 8-row pool, CPU, torch
2.13); tests/test_compiled.py checks that the output code has no pass over the whole pool.

Compiled graphs land on disk (under TORCHINDUCTOR_CACHE_DIR, by default /tmp/torchinductor_$USER), so a restart
exports again but does not recompile: engine.warm_up logs its time, and each graph's build is logged.
Quantized (torchao) weights are refused: through torch.compile their tensor subclasses recompiled at every step
until dynamo's limit (measured on CPU); ahead-of-time graphs over them are untried.
"""

from __future__ import annotations

import logging
import threading

import torch
from torch._dynamo.utils import counters

from engine.aot_graphs import AheadOfTimeGraphs
from engine.model import KVFrame, LogitIndex

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZES = (1, 2, 4, 8)
CANDIDATE_QUANTUM = 32
# Graphs of `_forward` dynamo may build, one per shape bucket: past its limit (8 by default) it stops
# compiling and runs every further shape eagerly, padded, without a word but one log line. A warm-up of
# batch 1 and 8 with all three cache modes already needs 12.
MAX_GRAPHS = 256
# The most positions per row a compiled forward computes; longer forwards run eagerly (module docstring).
COMPILED_SPAN = 64


def round_up(value: int, quantum: int) -> int:
    return -(-value // quantum) * quantum


def length_bucket(length: int) -> int:
    """Query and canvas lengths: a multiple of 32 up to 64 (a block's span), of 128 beyond (whole canvases)."""
    return round_up(length, 32) if length <= 64 else round_up(length, 128)


def _forward(model, input_ids, attention_mask, grid, buffer, columns, positions, key_mask):
    """The graph: a whole forward whose every input has a bucketed shape (`real` is applied outside it)."""
    # `forward`, not `model(...)`: a module's hooks (a benchmark's timers) would be traced into the graph and
    # recompile it at every call; the caller times the compiled call instead.
    if buffer is None:  # the uncached forward, which every family has (Dream's takes no `kv`)
        return model.forward(input_ids, attention_mask, logit_index=LogitIndex(grid))
    return model.forward(input_ids, logit_index=LogitIndex(grid), kv=KVFrame(buffer, columns, positions, key_mask))


class StaticShapes:
    """The compiled forward of one model and the buckets its steps are padded into.

    batch_sizes: the batch buckets, ascending; a batch larger than the last runs at its own size (a shape of
    its own, compiled when first seen). Every graph built once warm-up has ended (`warmed_up`) counts
    as a recompile (`recompiles`), the number /metrics exposes: it should stay 0 once warm-up covers the traffic.
    """

    def __init__(self, model, batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES, max_span: int = COMPILED_SPAN):
        self.max_span = max_span
        device = next(model.parameters()).device
        self.on_cuda = device.type == "cuda"
        self.batch_sizes = tuple(sorted(set(batch_sizes)))
        if self.on_cuda:
            for limit in ("recompile_limit", "accumulated_recompile_limit"):  # process-wide settings: only raised
                setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), MAX_GRAPHS))
            self._compiled = torch.compile(_forward, dynamic=False, mode="reduce-overhead")
        else:
            self._graphs = AheadOfTimeGraphs(model, _forward)
        self.shapes: set[tuple] = set()
        self.warmed_up = False
        self.recompiles = 0
        self._lock = threading.Lock()

    def serves(self, positions_per_row: int) -> bool:
        """Whether a forward computing this many positions per row runs compiled (else eagerly, unpadded)."""
        return positions_per_row <= self.max_span

    def batch(self, rows: int) -> int:
        return next((size for size in self.batch_sizes if size >= rows), rows)

    @staticmethod
    def length(length: int) -> int:
        return length_bucket(length)

    @staticmethod
    def candidates(per_row: int, computed: int) -> int:
        return min(round_up(per_row, CANDIDATE_QUANTUM), computed)

    def key_window(self, longest_canvas: int, pool_width: int) -> int:
        """The key columns a cached step's attention reads. On CPU the longest canvas itself, as eagerly: the
        graph leaves that one dimension symbolic (`__call__`), so one graph serves every canvas length and
        attention reads no column past the canvases. On CUDA the pool's whole width, a static shape that a
        captured CUDA graph can replay (a symbolic one would be captured again for every width)."""
        return pool_width if self.on_cuda else longest_canvas

    def __call__(self, model, input_ids, attention_mask, logit_index: LogitIndex, kv: KVFrame | None):
        """Logits at `logit_index` (its `real` entries only), through the compiled graph."""
        args = [input_ids, attention_mask, logit_index.columns]
        args += [None] * 4 if kv is None else [kv.buffer, kv.columns, kv.positions, kv.key_mask]
        key = [None if a is None else tuple(a.shape) for a in args]
        if kv is not None and not self.on_cuda:
            key[-1] = (key[-1][0], "keys")  # the key window (`key_window`): symbolic, the rest of the shapes static
        key = tuple(key)
        if self.on_cuda:
            logits, new_graphs = self._captured(model, kv, args)
        else:
            # The forward asks the rotary tables for at most the canvas (uncached) or the pool's width (cached).
            rotary_length = input_ids.shape[1] if kv is None else kv.buffer.shape[4]
            # Windows up to one less than the pool's width: at the full width the key slice is the whole pool,
            # which export specialises on; the pool keeps a column past every canvas (engine/kv_slots.py).
            window = None if kv is None else (len(args) - 1, range(2, kv.buffer.shape[4]))  # the key mask's width
            # Contiguous inputs (engine/aot_graphs.py); the pool is so by construction, and written in place.
            args = [a if a is None or (kv is not None and a is kv.buffer) else a.contiguous() for a in args]
            logits, built = self._graphs(key, args, window, rotary_length)
            new_graphs = int(built)
        with self._lock:
            self.shapes.add(key)
            if new_graphs and self.warmed_up:
                self.recompiles += new_graphs
                logger.warning("compiled a graph after warm-up (a shape it did not cover, or a failed guard): %s", key)
        return logits if logit_index.real is None else logits[logit_index.real]

    def _captured(self, model, kv: KVFrame | None, args: list) -> tuple[torch.Tensor, int]:
        """The CUDA graph of these shapes (torch.compile, mode reduce-overhead), and how many graphs it built."""
        if kv is not None:
            torch._dynamo.mark_static_address(kv.buffer)  # written in place by the captured graph
        # Dynamo's own count of the graphs it built, so that a recompile a guard forces on a known shape counts
        # too, not only a new shape. Steps run one at a time, so the difference is this call's.
        graphs_before = counters["stats"]["unique_graphs"]
        logits = self._compiled(model, *args)
        return logits, counters["stats"]["unique_graphs"] - graphs_before


def static_shapes_of(model) -> StaticShapes | None:
    """The model's compiled forward, or None when it runs eagerly."""
    return getattr(model, "_static_shapes", None)


def compiled_forward_for(model, positions_per_row: int) -> StaticShapes | None:
    """The compiled forward that serves a forward of this many positions per row, or None: run it eagerly."""
    static = static_shapes_of(model)
    return static if static is not None and static.serves(positions_per_row) else None


def compile_static(
    model, batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES, max_span: int = COMPILED_SPAN
) -> StaticShapes:
    """Give `model` a compiled static-shape forward (engine/batch.py pads its steps for it)."""
    model.rotary.fill(model.rotary.initial_length, next(model.parameters()).device)
    static = StaticShapes(model, batch_sizes, max_span)
    object.__setattr__(model, "_static_shapes", static)  # a plain attribute, not a submodule
    return static
