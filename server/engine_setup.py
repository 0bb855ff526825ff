"""The engine from the environment: its settings checked before any worker starts, then loaded in the worker.

The settings are DLLM_MODEL, DLLM_DEVICE, DLLM_DTYPE, DLLM_COMPILE (and DLLM_WARMUP_*), DLLM_QUANTIZE and the
scheduler's (docs/deploy.md has the table). The service's `@bentoml.on_deployment` hook calls
`check_in_child_process` once, in the `bentoml serve` process: an invalid setting then stops the command with a
message naming it, where a worker failing its startup would be restarted by BentoML forever. The check imports
the engine, hence torch, so it runs in a child process: the long-lived `bentoml serve` process never loads torch.
`load_from_env` is the worker's startup. Like the rest of `server`, this module imports the engine only inside
its functions.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine import DiffusionEngine

logger = logging.getLogger(f"dllm_serve.{__name__}")

# Run by `check_in_child_process` in a child process: the error's message alone on stderr, exit status 1.
CHECK_IN_CHILD = """
from server.engine_setup import check_engine_configuration
try:
    check_engine_configuration()
except (ValueError, OSError) as error:
    raise SystemExit(str(error))
"""


def check_in_child_process() -> None:
    """Exit (SystemExit, one line naming the setting) on an engine setting that `load_from_env` would refuse."""
    check = [sys.executable, "-c", CHECK_IN_CHILD]
    # From the directory that holds the `server` package (the checkout, or a Bento's src/), so that it imports.
    result = subprocess.run(check, cwd=Path(__file__).parent.parent, capture_output=True, text=True)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        # SystemExit: the message is the whole story, a traceback of BentoML's serve command would bury it.
        raise SystemExit(f"dllm-serve: invalid configuration: {lines[-1] if lines else result.returncode}")


def check_engine_configuration() -> None:
    """Raise (ValueError, FileNotFoundError) on an engine setting that `load_from_env` would refuse.

    Cheap: reads the environment and, for a local DLLM_MODEL, its config.json and which weight files it has;
    never loads weights or contacts the hub (a hub id is checked when the worker fetches it).
    """
    from engine import SchedulerConfig
    from engine.config import read_config
    from engine.loading import (
        check_compile,
        compile_from_env,
        default_device,
        default_dtype,
        dtype_from_name,
        local_model_dir,
        weight_files,
    )
    from engine.quantization import check_quantization, quantize_from_env, quantized_dtype
    from engine.warm_up import WarmUpPlan

    SchedulerConfig.from_env()
    WarmUpPlan.from_env()
    compile = compile_from_env()
    quantize = quantize_from_env()
    check_compile(compile, quantize, setting="DLLM_COMPILE=1 with DLLM_QUANTIZE")
    dtype = dtype_from_name(raw_dtype) if (raw_dtype := os.environ.get("DLLM_DTYPE")) else None
    device = os.environ.get("DLLM_DEVICE") or None
    if device:
        check_device(device)
    device = device or default_device()
    dtype = quantized_dtype(quantize, dtype) or default_dtype(device)
    check_quantization(quantize, device, dtype, setting="DLLM_QUANTIZE")
    model = os.environ.get("DLLM_MODEL") or None
    try:
        local = local_model_dir(model)  # None for a hub id
    except FileNotFoundError as error:
        raise FileNotFoundError(f"DLLM_MODEL={model!r}: {error}") from None
    if local is not None:
        try:
            read_config(local)
            for shard in weight_files(local):  # a sharded checkpoint's index may name files that are missing
                if not shard.is_file():
                    raise FileNotFoundError(f"{shard.name}, named by its index, is missing")
        except (OSError, ValueError, KeyError) as error:
            raise ValueError(f"DLLM_MODEL={model!r}: not a checkpoint this engine can load ({error})") from None


def check_device(device: str) -> None:
    """Refuse a DLLM_DEVICE that names no device of this machine (a CUDA device without a GPU, or past the
    last one): the worker would fail loading the model, and BentoML restart it forever."""
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"DLLM_DEVICE={device!r}: {error}") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"DLLM_DEVICE={device!r}: this machine has no CUDA device (use cpu, or leave it unset)")
        if parsed.index is not None and parsed.index >= count:
            raise ValueError(f"DLLM_DEVICE={device!r}: this machine has {count} CUDA device(s), numbered from 0")
    elif parsed.type != "cpu":
        raise ValueError(f"DLLM_DEVICE={device!r}: this engine runs on cpu or cuda")


def load_from_env() -> DiffusionEngine:
    """The engine the settings describe, loaded (the model's weights onto its device), with a log line."""
    # Before torch loads: OpenMP reads its environment once. CPU threads only run the model on a CPU; on a
    # GPU they run small host-side ops. With OpenMP's spinning workers, a request took 0.5-16 s instead
    # of 0.1 s when another torch process shared the cores; one thread is immune to that and,
    # for the embedded model, also faster than several sleeping (PASSIVE) ones: benchmarks/cpu_threads.py.
    # A large model on a many-core CPU wants OMP_NUM_THREADS=<cores>: PASSIVE then keeps it safe.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from engine import DiffusionEngine

    model = os.environ.get("DLLM_MODEL") or None
    device = os.environ.get("DLLM_DEVICE") or None
    dtype = os.environ.get("DLLM_DTYPE") or None
    started = time.perf_counter()
    engine = DiffusionEngine.from_pretrained(model, device=device, dtype=dtype)
    logger.info(
        "loaded %s on %s (%s, quantization %s) in %.1fs; scheduler %s",
        engine.model_name,
        engine.device,
        next(engine.model.parameters()).dtype,
        engine.quantization,
        time.perf_counter() - started,
        engine.scheduler_config,
    )
    if engine.compiled:  # before the engine is handed over: readiness stays false until the graphs exist
        engine.warm_up()
    return engine
