"""Webhook latency for small reviews while one large review is being decided (issue 11).

Starts `gpufrac webhook` over HTTPS on loopback (as benchmarks/webhook.py does), then sends one large
`/mutate` review (a pod of `--containers` containers, each named in a per-container annotation, about
6 MiB: what `kubectl create --dry-run=server` can send) and, while it is in flight, one small share-pod
review every `--interval` ms. Prints the large review's own time and the small reviews' latency during
it: an event loop held by the large one shows up as small reviews waiting for it.

Run it against this checkout, and against another for a before/after:
    PYTHONPATH=src .venv/bin/python benchmarks/webhook_stall.py
    PYTHONPATH=/path/to/other/src .venv/bin/python benchmarks/webhook_stall.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

# Run as a script, this folder is on the path: the server, the reviews and the share pod are webhook.py's.
from webhook import review, share_pod, start_server


def large_pod(containers: int, annotations: int) -> dict[str, Any]:
    """A share pod whose last `annotations` containers have a per-container key, padded to about 6 MiB."""
    names = [f"c{i}" for i in range(containers)]
    pod = share_pod(0)
    keyed = names[containers - annotations :]
    pod["metadata"]["annotations"] = {f"nvidia.com/container.{n}.gpu-memory.request": "1Gi" for n in keyed}
    pod["spec"]["containers"] = [
        {"name": n, "image": "registry.example/infer:1", "args": ["--padding", "x" * 200]} for n in names
    ]
    return pod


async def measure(
    url: str, ca: Path, *, containers: int, annotations: int, interval: float
) -> tuple[float, list[float], int]:
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(ca)), limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    big = json.dumps(review(large_pod(containers, annotations), user="tenant")).encode()
    small = json.dumps(review(share_pod(1), user="tenant")).encode()
    print(f"large review: {len(big) / 2**20:.1f} MiB, {containers} containers, {annotations} annotations")
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def post(body: bytes) -> float:
            started = time.perf_counter()
            async with session.post(f"{url}/mutate", data=body) as response:
                await response.read()
                assert response.status == 200
            return time.perf_counter() - started

        for _ in range(20):  # warm up connections and the small path
            await post(small)
        large = asyncio.create_task(post(big))
        latencies: list[float] = []
        pending: list[asyncio.Task[float]] = []
        while not large.done():
            pending.append(asyncio.create_task(post(small)))
            await asyncio.sleep(interval)
        large_seconds = await large
        latencies = list(await asyncio.gather(*pending))
        return large_seconds, latencies, len(pending)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--containers", type=int, default=20000, help="containers in the large pod")
    parser.add_argument(
        "--annotations", type=int, default=None, help="per-container keys (default: one per container)"
    )
    parser.add_argument("--interval", type=float, default=10.0, help="ms between small reviews")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpufrac-webhook-stall-") as folder:
        server, url, ca = start_server(Path(folder))
        try:
            large, latencies, sent = asyncio.run(
                measure(
                    url,
                    ca,
                    containers=args.containers,
                    annotations=args.containers if args.annotations is None else args.annotations,
                    interval=args.interval / 1000,
                )
            )
        finally:
            server.terminate()
            server.wait(timeout=10)
    ms = np.array(latencies) * 1000
    p50, p99 = np.percentile(ms, [50, 99])
    print(f"large review answered in {large:.2f} s")
    print(
        f"small reviews sent while it ran: {sent}; latency p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
        f"max {ms.max():.1f} ms"
    )


if __name__ == "__main__":
    main()
