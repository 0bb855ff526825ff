"""Long prompts beside short ones, and SIGTERM during a long forward (issue 31), on a server this script starts.

    python benchmarks/long_prompts.py [--model tests/fixtures/dream-tiny] [--long-tokens 32000] [--rounds 5]

Starts `bentoml serve` from the current checkout on the Dream fixture (131,072 positions: a prompt of 100k
tokens fits its context) with a grace period of 1 s and `DLLM_MAX_PROMPT_TOKENS` raised to 40,000 (so that the
32k-token prompt gets in), then a second one with 131,000 (for the SIGTERM case), and measures, each against
a baseline taken in the same run:
- a small chat completion's median latency alone, and sent 0.2 s after a burst of four bodies of 20,000
  empty messages (refused: they can never fit);
- the same request sent while a `--long-tokens`-token prompt is being denoised, against that prompt's own
  step time (the request should wait behind one long step at most);
- the time from SIGTERM to the process's exit while a forward over `--sigterm-tokens` positions runs (the
  drain's documented bound: grace + 2 × 3 s + 15 s).
Prints one table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

SMALL = {"messages": [{"role": "user", "content": "What is 2 plus 3?"}], "max_tokens": 16}
EMPTY_MESSAGES = json.dumps({"messages": [{"role": "user", "content": ""}] * 20_000}).encode()
TOKEN = 5  # an ordinary id of the Dream fixture's vocabulary


def start_server(model: str, max_prompt_tokens: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "DLLM_MODEL": model,
        "DLLM_MAX_PROMPT_TOKENS": str(max_prompt_tokens),
        "DLLM_SHUTDOWN_GRACE_S": "1",
        "BENTOML_HOME": tempfile.mkdtemp(prefix="bentoml-home-"),
        "BENTOML_DO_NOT_TRACK": "true",
    }
    command = [sys.executable, "-m", "bentoml", "serve", "service:DiffusionLLMService", "--host", "127.0.0.1"]
    process = subprocess.Popen(
        [*command, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base_url}/readyz", timeout=5).status_code == 200:
                return process, base_url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop(process)
    raise SystemExit("the server did not become ready in 180 s")


def stop(process: subprocess.Popen) -> None:
    """SIGTERM first: BentoML's arbiter then stops its worker, which SIGKILL to the arbiter alone would orphan."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def small_latency(client: httpx.Client) -> float:
    started = time.perf_counter()
    client.post("/v1/chat/completions", json=SMALL).raise_for_status()
    return time.perf_counter() - started


def beside_empty_messages(client: httpx.Client, rounds: int) -> tuple[float, float, set]:
    alone, beside, statuses = [], [], set()
    with ThreadPoolExecutor(4) as pool:
        for _ in range(rounds):
            alone.append(small_latency(client))
            burst = [
                pool.submit(client.post, "/v1/chat/completions", content=EMPTY_MESSAGES,
                            headers={"Content-Type": "application/json"})
                for _ in range(4)
            ]  # fmt: skip
            time.sleep(0.2)
            beside.append(small_latency(client))
            statuses |= {future.result().status_code for future in burst}
    return statistics.median(alone), statistics.median(beside), statuses


def beside_long_prompt(client: httpx.Client, base_url: str, tokens: int) -> tuple[float, float]:
    """(the small request's latency, the long prompt's step time) with the small one sent between two steps."""
    body = {"prompt": [TOKEN] * tokens, "max_tokens": 16, "num_denoising_steps": 16, "stream": True}
    with httpx.Client(base_url=base_url, timeout=600) as long_client, ThreadPoolExecutor(1) as pool:
        with long_client.stream("POST", "/v1/completions", json=body) as long:
            long.raise_for_status()
            chunks = (line for line in long.iter_lines() if line.startswith("data: "))
            next(chunks)
            step_started = time.perf_counter()
            small = pool.submit(small_latency, client)
            next(chunks)
            long_step = time.perf_counter() - step_started
            return small.result(), long_step


def sigterm_during_forward(process: subprocess.Popen, base_url: str, tokens: int) -> float:
    body = {"prompt": [TOKEN] * tokens, "max_tokens": 8, "num_denoising_steps": 8}
    thread = threading.Thread(target=lambda: httpx.post(f"{base_url}/v1/completions", json=body, timeout=600))
    thread.start()
    while "dllm_requests_running 1" not in httpx.get(f"{base_url}/metrics", timeout=60).text:
        time.sleep(0.1)
    time.sleep(2)  # inside the forward
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=600)
    thread.join(600)
    return time.monotonic() - signalled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(Path("tests") / "fixtures" / "dream-tiny"))
    parser.add_argument("--long-tokens", type=int, default=32_000)
    parser.add_argument("--sigterm-tokens", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    process, base_url = start_server(args.model, max_prompt_tokens=40_000)
    try:
        with httpx.Client(base_url=base_url, timeout=600) as client:
            small_latency(client)  # warm-up
            alone, beside, statuses = beside_empty_messages(client, args.rounds)
            print(f"{'scenario':<52} {'small request':>14} {'ratio':>8}", flush=True)
            print(f"{'alone':<52} {alone * 1000:>11.0f} ms {1:>8.2f}")
            print(
                f"{'0.2 s after 4 bodies of 20,000 empty messages':<52} {beside * 1000:>11.0f} ms "
                f"{beside / alone:>8.2f}   (their statuses: {sorted(statuses)})",
                flush=True,
            )
            alone = statistics.median(small_latency(client) for _ in range(args.rounds))
            latency, long_step = beside_long_prompt(client, base_url, args.long_tokens)
            print(
                f"{f'beside a {args.long_tokens}-token prompt (its step: {long_step:.1f} s)':<52} "
                f"{latency * 1000:>11.0f} ms {latency / alone:>8.2f}   ({latency / long_step:.2f} long steps; "
                f"alone now {alone * 1000:.0f} ms)",
                flush=True,
            )
    finally:
        stop(process)
    process, base_url = start_server(args.model, max_prompt_tokens=131_000)
    try:
        exit_s = sigterm_during_forward(process, base_url, args.sigterm_tokens)
        print(
            f"SIGTERM during a {args.sigterm_tokens}-position forward: exit after {exit_s:.1f} s (bound 1 + 6 + 15 s)"
        )
    finally:
        stop(process)


if __name__ == "__main__":
    main()
