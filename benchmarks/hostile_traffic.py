"""A small request's latency while hostile traffic hits the same server, as a ratio to its latency alone.

    python benchmarks/hostile_traffic.py --base-url http://127.0.0.1:3000 [--rounds 9] [--flooders 4]

Against a running server (loopback), three scenarios, each measured against a baseline taken just before
it in the same run: the median latency of a small chat completion
- sent 0.2 s after a burst of `--burst` ~2 MB prompts (`"a " * 1_000_000`, far too long for the model):
  the head-of-line case of issue 15, where each used to be tokenized in full on one thread first;
- while `--flooders` clients send such prompts back to back (this saturates the event loop with JSON
  parsing: the server's CPU, not its queueing, is what is measured);
- while `--sockets` idle and half-open connections are held open (then: how many the server still holds
  after its timeouts).
Prints the medians, the ratios and what the floods got back.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx

SMALL = {"messages": [{"role": "user", "content": "What is 2 plus 3?"}], "max_tokens": 16}
OVERSIZED = json.dumps({"messages": [{"role": "user", "content": "a " * 1_000_000}]}).encode()


def small_latency(client: httpx.Client) -> float:
    started = time.perf_counter()
    response = client.post("/v1/chat/completions", json=SMALL)
    response.raise_for_status()
    return time.perf_counter() - started


def median_latency(client: httpx.Client, rounds: int) -> float:
    return statistics.median(small_latency(client) for _ in range(rounds))


def burst_latency(client: httpx.Client, pool: ThreadPoolExecutor, clients: list[httpx.Client], outcomes: Counter):
    """A small request's latency while one oversized prompt per client arrives at the same moment."""
    burst = [
        pool.submit(c.post, "/v1/chat/completions", content=OVERSIZED, headers={"Content-Type": "application/json"})
        for c in clients
    ]
    time.sleep(0.2)  # the burst is on its way in: the small request comes "meanwhile"
    latency = small_latency(client)
    for future in burst:
        outcomes[future.result().status_code] += 1
    return latency


def flood_oversized(base_url: str, stop: threading.Event, outcomes: Counter) -> None:
    with httpx.Client(base_url=base_url, timeout=600) as client:
        while not stop.is_set():
            response = client.post(
                "/v1/chat/completions", content=OVERSIZED, headers={"Content-Type": "application/json"}
            )
            outcomes[response.status_code] += 1


def open_sockets(base_url: str, count: int) -> list[socket.socket]:
    host, port = base_url.removeprefix("http://").split(":")
    sockets = []
    for i in range(count):
        connection = socket.create_connection((host, int(port)))
        if i % 2:
            connection.sendall(b"GET /readyz HTTP/1.1\r\nHost: te")  # half a request head
        sockets.append(connection)
    return sockets


def still_open(sockets: list[socket.socket]) -> int:
    """How many of the client's sockets the server has not closed."""
    count = 0
    for connection in sockets:
        connection.setblocking(False)
        try:
            while connection.recv(65536):  # a 408 the server sent before closing
                pass
        except BlockingIOError:
            count += 1  # nothing (more) to read, and not closed
        except OSError:
            pass  # reset: closed
    return count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:3000")
    ap.add_argument("--rounds", type=int, default=9, help="small requests per median")
    ap.add_argument("--burst", type=int, default=10, help="oversized prompts sent at once beside a small request")
    ap.add_argument("--flooders", type=int, default=4, help="clients sending oversized prompts back to back")
    ap.add_argument("--sockets", type=int, default=2000)
    ap.add_argument("--settle", type=float, default=40.0, help="seconds to wait for the server's timeouts")
    args = ap.parse_args()

    with httpx.Client(base_url=args.base_url, timeout=600) as client:
        small_latency(client)  # warm-up
        alone = median_latency(client, args.rounds)
        burst_clients = [httpx.Client(base_url=args.base_url, timeout=600) for _ in range(args.burst)]
        outcomes = Counter()
        with ThreadPoolExecutor(args.burst) as pool:
            bursts = statistics.median(burst_latency(client, pool, burst_clients, outcomes) for _ in range(args.rounds))
        for burst_client in burst_clients:
            burst_client.close()
        print(
            f"bursts of {args.burst} oversized prompts: small request {alone * 1000:.0f} ms alone, "
            f"{bursts * 1000:.0f} ms beside a burst, ratio {bursts / alone:.2f}; burst answers {dict(outcomes)}"
        )

        alone = median_latency(client, args.rounds)
        stop, outcomes = threading.Event(), Counter()
        with ThreadPoolExecutor(args.flooders) as pool:
            floods = [pool.submit(flood_oversized, args.base_url, stop, outcomes) for _ in range(args.flooders)]
            time.sleep(1.0)
            flooded = median_latency(client, args.rounds)
            stop.set()
            for flood in floods:
                flood.result()
        print(
            f"oversized flood ({args.flooders} clients): small request {alone * 1000:.0f} ms alone, "
            f"{flooded * 1000:.0f} ms during the flood, ratio {flooded / alone:.2f}; flood answers {dict(outcomes)}"
        )

        alone = median_latency(client, args.rounds)
        sockets = open_sockets(args.base_url, args.sockets)
        with httpx.Client(base_url=args.base_url, timeout=600) as fresh:  # probes on new connections
            probe = statistics.median(
                (lambda t: (fresh.get("/readyz").raise_for_status(), time.perf_counter() - t)[1])(time.perf_counter())
                for _ in range(args.rounds)
            )
        crowded = median_latency(client, args.rounds)
        print(
            f"{args.sockets} idle/half-open sockets: small request {alone * 1000:.0f} ms alone, "
            f"{crowded * 1000:.0f} ms among them, ratio {crowded / alone:.2f}; /readyz {probe * 1000:.0f} ms"
        )
        time.sleep(args.settle)
        print(f"after {args.settle:.0f} s: the server still holds {still_open(sockets)} of them")
        for connection in sockets:
            connection.close()


if __name__ == "__main__":
    main()
