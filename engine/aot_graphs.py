"""The step's forward compiled ahead of time on CPU: one shared library per input shape, called without guards.

torch.compile runs dynamo's guards (on every weight and every input) and inductor's wrapper at each call. For a
cached step of the embedded model at batch 1 that call costs about a fifth of the compiled step
(docs/benchmarks.md, "Ahead of time"). AOTInductor compiles the same inductor graph into a shared library that
takes a flat list of tensors: each shape's graph is exported (`torch.export`), compiled once, loaded, and then
called straight (`boxed_run`), so a step costs its kernels.

Nothing checks a loaded graph's assumptions at call time, so each is kept true by construction:
- input shapes: the caller's key (engine/compiled.py pads every step into a bucket) selects the graph; the key
  window is the one symbolic dimension, exported with a range, and a window outside it is refused;
- input strides: every graph is exported for contiguous inputs, and a call with any other is refused (a
  sliced key mask read as if contiguous gave wrong logits without a word);
- weights: not copied into the library (`package_constants_in_so` off); the graph reads the model's own
  parameters and buffers in place (`user_managed`), which serving never replaces;
- the rotary tables, plain tensors of the model: graph inputs (`RotaryCache.serving`), their length in the key;
- the OpenMP thread count, which inductor writes into its kernels: part of the disk cache's key.

Compiled graphs are kept on disk (under inductor's cache directory, TORCHINDUCTOR_CACHE_DIR) keyed by a hash of
the exported graph, its input specs and the compiling setup, so a restart exports again (about a second a shape)
but does not compile.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

# The library holds the kernels only; the loaded graph is handed the model's tensors (module docstring).
INDUCTOR_CONFIGS = {"aot_inductor.package_constants_in_so": False}


class _Exportable(torch.nn.Module):
    """`forward(model, *tensors)` as a module that owns the model, so that export lifts its weights as named
    constants, with the rotary tables as the first two inputs instead of tensors read from the model."""

    def __init__(self, model: torch.nn.Module, forward: Callable):
        super().__init__()
        self.model, self._forward = model, forward

    def forward(self, cos, sin, *tensors):
        with self.model.rotary.serving(cos, sin):
            return self._forward(self.model, *tensors)


class AheadOfTimeGraph:
    """One shape's compiled graph, loaded and bound to the model's own tensors."""

    def __init__(self, package: Path, exportable: _Exportable):
        self.package = package
        runner = torch._inductor.aoti_load_package(str(package), run_single_threaded=True)
        live = dict(exportable.named_parameters(remove_duplicate=False))
        live.update(exportable.named_buffers(remove_duplicate=False))
        runner.load_constants(
            {name: live[name] for name in runner.get_constant_fqns()}, check_full_update=True, user_managed=True
        )
        self._run = runner.loader.boxed_run

    def __call__(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        return self._run(tensors)[0]


class AheadOfTimeGraphs:
    """The graphs of `forward(model, *args)` (args: tensors or None), built on first use of each shape key."""

    def __init__(self, model: torch.nn.Module, forward: Callable, cache_dir: Path | None = None):
        self.model, self.device = model, next(model.parameters()).device
        self._exportable = _Exportable(model, forward)
        self.cache_dir = cache_dir or Path(torch._inductor.runtime.cache_dir_utils.cache_dir()) / "dllm-aot"
        self.graphs: dict[tuple, AheadOfTimeGraph] = {}

    def __call__(
        self, key: tuple, args: list, window: tuple[int, range] | None, rotary_length: int
    ) -> tuple[torch.Tensor, bool]:
        """(the forward's output, whether a graph was built for this call). `window`: (the index in `args` of the
        tensor whose dimension 1 is the symbolic key window, the widths the graph accepts), or None.
        `rotary_length`: the most positions the forward asks the rotary tables for."""
        if window is not None and args[window[0]].shape[1] not in window[1]:
            raise ValueError(f"a key window of {args[window[0]].shape[1]} columns, outside the graph's {window[1]}")
        cos, sin = self.model.rotary.current(rotary_length, self.device)
        tensors = [cos, sin, *(a for a in args if a is not None)]
        if not all(t.is_contiguous() for t in tensors):
            raise ValueError("an ahead-of-time graph takes contiguous inputs (it reads them as if they were)")
        key = (*key, tuple(cos.shape))
        built = key not in self.graphs
        if built:
            self.graphs[key] = self._build(key, [cos, sin, *args], window)
        return self.graphs[key](tensors), built

    def _build(self, key: tuple, inputs: list, window: tuple[int, range] | None) -> AheadOfTimeGraph:
        started = time.perf_counter()
        dynamic: list = [None] * len(inputs)
        with torch.inference_mode(False):
            # Export traces shapes, not values; tensors made in inference mode cannot stand for inputs it writes.
            # Contiguous ones: the graph will read every input with the strides it was exported with.
            examples = [None if t is None else torch.empty(t.shape, dtype=t.dtype) for t in inputs]
            if window is not None:
                index, widths = window
                dynamic[2 + index] = {1: torch.export.Dim("keys", min=widths.start, max=widths.stop - 1)}
            dynamic_shapes = (None, None, tuple(dynamic[2:]))  # `_Exportable.forward(cos, sin, *tensors)`
            program = torch.export.export(self._exportable, tuple(examples), dynamic_shapes=dynamic_shapes)
        package = self.cache_dir / f"{self._fingerprint(program)}.pt2"
        exported_s = time.perf_counter() - started
        cached = package.exists()
        if not cached:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=self.cache_dir) as scratch:
                partial = Path(scratch) / package.name
                torch._inductor.aoti_compile_and_package(
                    program, package_path=str(partial), inductor_configs=INDUCTOR_CONFIGS
                )
                os.replace(partial, package)  # whole or absent: another process may be loading it
        graph = AheadOfTimeGraph(package, self._exportable)
        logger.info(
            "ahead-of-time graph for %s: exported in %.1fs, %s, %.1fs in all",
            key,
            exported_s,
            "loaded from the disk cache" if cached else "compiled",
            time.perf_counter() - started,
        )
        return graph

    @staticmethod
    def _fingerprint(program: torch.export.ExportedProgram) -> str:
        """What the compiled library depends on: the graph, its inputs' specs, and the compiling setup."""
        placeholders = [
            (node.name, str(node.meta["val"].shape), node.meta["val"].stride(), str(node.meta["val"].dtype))
            for node in program.graph.nodes
            if node.op == "placeholder" and isinstance(node.meta.get("val"), torch.Tensor)
        ]
        isa = str(torch._inductor.cpu_vec_isa.pick_vec_isa())
        setup = (torch.__version__, isa, torch.get_num_threads(), INDUCTOR_CONFIGS)
        text = repr((program.graph_module.code, placeholders, str(program.range_constraints), setup))
        return hashlib.sha256(text.encode()).hexdigest()[:32]
