"""CPU serving: OpenMP thread settings against a noisy neighbour, through a real `bentoml serve`.

    python benchmarks/cpu_threads.py                       # idle machine, then a torch process beside it
    python benchmarks/cpu_threads.py --neighbour none      # idle only

Each setting gets its own server (the embedded model, CPU): OpenMP reads its environment once, when torch
loads. Per setting: the median latency of 10 sequential requests (gen 32, 32 steps) and the throughput of
8 concurrent ones, with ratios against the first setting: the service's default, one torch thread.

The neighbour is another process running small torch matmuls on every core with OpenMP's default
(spinning) wait policy, e.g. a training job. Spinning OpenMP workers of two processes on the same cores
wait for each other at every barrier; that is the case a CPU server must survive.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
BODY = {"messages": [{"role": "user", "content": "What is 3 plus 4?"}], "max_tokens": 32, "num_denoising_steps": 32}
ALL_CORES = str(os.cpu_count())
# The service sets OMP_NUM_THREADS=1 and OMP_WAIT_POLICY=PASSIVE unless the environment says otherwise.
# An empty OMP_WAIT_POLICY is kept by the service and ignored by libgomp: its default policy.
SETTINGS = {
    "service default (1 thread)": {},
    "all cores, OMP_WAIT_POLICY=PASSIVE": {"OMP_NUM_THREADS": ALL_CORES},
    "all cores, libgomp default (spin, sleep)": {"OMP_NUM_THREADS": ALL_CORES, "OMP_WAIT_POLICY": ""},
    "all cores, OMP_WAIT_POLICY=ACTIVE": {"OMP_NUM_THREADS": ALL_CORES, "OMP_WAIT_POLICY": "ACTIVE"},
}
NEIGHBOUR = "import torch\na = torch.randn(192, 192)\nwhile True:\n    a = torch.tanh(a @ a)\n"


def start_server(env_overrides: dict[str, str], port: int, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    env.update(env_overrides, BENTOML_DO_NOT_TRACK="true")
    command = [sys.executable, "-m", "bentoml", "serve", "service:DiffusionLLMService", "--port", str(port)]
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    os.killpg(process.pid, signal.SIGKILL)
    raise SystemExit(f"server not ready in 180 s; see {log}")


async def measure(port: int) -> tuple[float, float]:
    """(median seconds of a lone request, tokens/s of 8 concurrent requests)."""
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=600) as client:

        async def one() -> float:
            start = time.perf_counter()
            response = await client.post(url, json=BODY)
            response.raise_for_status()
            return time.perf_counter() - start

        warm_up = [await one() for _ in range(3)]
        slow = min(warm_up) > 2  # a collapsed setting: fewer repetitions, or this takes many minutes
        latencies = [await one() for _ in range(3 if slow else 10)]
        rates = []
        for _ in range(1 if slow else 3):
            start = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(8)))
            rates.append(8 * BODY["max_tokens"] / (time.perf_counter() - start))
    return statistics.median(latencies), statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--neighbour", choices=["torch", "none"], default="torch", help="also run beside a torch job")
    parser.add_argument("--port", type=int, default=3950)
    args = parser.parse_args()
    conditions = ["idle"] + (["torch neighbour"] if args.neighbour == "torch" else [])
    print(
        f"cpus: {os.cpu_count()}; embedded model; gen 32, 32 steps; lone: median of 10; 8 concurrent: median of 3 "
        "(3 and 1 when a lone request takes over 2 s)"
    )
    print("speedup: against the first setting, in the same condition (> 1 = faster)")
    print(f"{'condition':16}{'setting':44}{'lone ms':>9}{'speedup':>9}{'8 conc tok/s':>14}{'speedup':>9}")
    for condition in conditions:
        baseline = None
        for port, (name, env) in enumerate(SETTINGS.items(), start=args.port):
            server = start_server(env, port, Path(f"/tmp/cpu_threads_{port}.log"))
            neighbour = None
            if condition != "idle":
                neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR])
            try:
                lone, rate = asyncio.run(measure(port))
            finally:
                if neighbour is not None:
                    neighbour.kill()
                os.killpg(server.pid, signal.SIGTERM)
                server.wait(60)
            baseline = baseline or (lone, rate)
            print(f"{condition:16}{name:44}{lone * 1000:9.0f}{baseline[0] / lone:8.2f}x{rate:14.0f}"
                  f"{rate / baseline[1]:8.2f}x", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
