"""Admission latency of `gpufrac webhook` under a fixed request rate (issue: admission webhook).

Starts the real command over HTTPS on loopback (a fresh self-signed certificate) and drives it with an
open-loop load generator: request i is due at start + i / rate whether or not earlier ones have been
answered, and its latency runs from when it was due to when its answer was read, so a stalled server
shows up as latency instead of as a lower rate (no coordinated omission). Connections are kept alive, as
the apiserver keeps them.

The mix is what a pod create costs the apiserver, plus the ConfigMap rule: for each share pod, one
`/mutate` and one `/validate` of the mutated pod; a scheduler's ConfigMap create; and a tenant pod that
sets NVIDIA_VISIBLE_DEVICES and is denied (which the webhook also logs and counts).

Prints the achieved rate, errors and latency percentiles, overall and per request kind, and then the
time the decision itself takes in-process, to tell the webhook's own cost from the HTTP and TLS stack's.

Run: .venv/bin/python benchmarks/webhook.py [--rate 200] [--seconds 30] [--warmup 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from gpufrac import admission
from gpufrac.admission import certs, exchange, settings


def share_pod(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"infer-{index}",
            "namespace": "team-a",
            "annotations": {"gpu-fraction": "0.25"},
        },
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [
                {
                    "name": "server",
                    "image": "registry.example/infer:1",
                    "env": [{"name": "MODEL", "value": "small"}],
                    "resources": {"requests": {"cpu": "1", "memory": "4Gi"}},
                },
                {"name": "metrics", "image": "registry.example/exporter:1"},
            ],
        },
    }


def review(obj: dict[str, Any], *, user: str, resource: str = "pods") -> dict[str, Any]:
    return {
        "apiVersion": exchange.API_VERSION,
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {
                "group": "",
                "version": "v1",
                "kind": "ConfigMap" if resource == "configmaps" else "Pod",
            },
            "resource": {"group": "", "version": "v1", "resource": resource},
            "operation": "CREATE",
            "namespace": "team-a",
            "name": obj["metadata"]["name"],
            "userInfo": {"username": user, "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": None,
        },
    }


def workload() -> list[tuple[str, str, bytes]]:
    """(kind, endpoint, body) of one round of the mix."""
    pod = share_pod(0)
    # The same pod as the mutation leaves it (tests/admission/test_mutation.py checks what it adds).
    base = "gpufrac-env-0123456789abcdef"
    mutated = share_pod(0)
    mutated["spec"]["schedulerName"] = "gpufrac"
    mutated["metadata"]["annotations"].update(
        {
            "nvidia.com/container.server.gpu-compute.mode": "time-slicing",
            "gpu-fraction-container-name": "server",
            "gpufrac.io/env-configmap": base,
        }
    )
    mutated["spec"]["containers"][0]["envFrom"] = [
        {"configMapRef": {"name": f"{base}-server", "optional": False}}
    ]
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpufrac-env-0123456789abcdef-server", "labels": {"gpufrac.io/env": "true"}},
        "data": {"NVIDIA_VISIBLE_DEVICES": "GPU-1", "NVIDIA_GPU_MEMORY_LIMIT": "20480"},
    }
    greedy = share_pod(1)
    greedy["metadata"]["annotations"] = {}
    greedy["spec"]["containers"][0]["env"].append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
    scheduler = settings.DEFAULT_SCHEDULER_IDENTITY
    return [
        ("mutate share pod", "mutate", json.dumps(review(pod, user="tenant")).encode()),
        ("validate share pod", "validate", json.dumps(review(mutated, user="tenant")).encode()),
        (
            "validate env ConfigMap",
            "validate",
            json.dumps(review(configmap, user=scheduler, resource="configmaps")).encode(),
        ),
        ("deny GPU env", "validate", json.dumps(review(greedy, user="tenant")).encode()),
    ]


def start_server(folder: Path) -> tuple[subprocess.Popen[str], str, Path]:
    certs.write(
        certs.generate(["127.0.0.1"]), cert=folder / "tls.crt", key=folder / "tls.key", ca=folder / "ca.crt"
    )
    command = [sys.executable, "-m", "gpufrac.cli", "webhook", "--host", "127.0.0.1", "--port", "0"]
    command += ["--tls-cert", str(folder / "tls.crt"), "--tls-key", str(folder / "tls.key")]
    command += ["--log-level", "error"]  # a denial log line per request would measure the terminal
    server = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    assert server.stdout is not None
    line = server.stdout.readline()
    if not line.startswith("gpufrac webhook: serving on "):
        server.kill()
        raise SystemExit(f"gpufrac webhook did not start: {line!r}")
    return server, line.split()[-1], folder / "ca.crt"


async def drive(
    session: aiohttp.ClientSession, url: str, *, rate: float, seconds: float
) -> tuple[list[tuple[str, float]], int, float]:
    """Send `rate` requests a second for `seconds`; return (kind, latency) of each answered request, the
    number of errors, and the largest delay between a request's due time and its send."""
    mix = workload()
    results: list[tuple[str, float]] = []
    errors = 0
    worst_lag = 0.0

    async def one(due: float, kind: str, endpoint: str, body: bytes) -> None:
        nonlocal errors, worst_lag
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        worst_lag = max(worst_lag, time.perf_counter() - due)
        try:
            async with session.post(f"{url}/{endpoint}", data=body) as response:
                answer = await response.read()
                ok = response.status == 200 and b'"response"' in answer
        except aiohttp.ClientError:
            ok = False
        if ok:
            results.append((kind, time.perf_counter() - due))
        else:
            errors += 1

    start = time.perf_counter() + 0.1
    count = int(rate * seconds)
    await asyncio.gather(*(one(start + i / rate, *mix[i % len(mix)]) for i in range(count)))
    return results, errors, worst_lag


async def measure(
    url: str, ca: Path, *, rate: float, seconds: float, warmup: float
) -> tuple[list[tuple[str, float]], int, float, float]:
    """Warm up (connections, TLS sessions, caches), then measure; one session, kept-alive connections."""
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(ca)), limit=0)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        await drive(session, url, rate=rate, seconds=warmup)
        began = time.perf_counter()
        results, errors, lag = await drive(session, url, rate=rate, seconds=seconds)
        return results, errors, lag, time.perf_counter() - began


def decision_times(rounds: int = 2000) -> list[tuple[str, float]]:
    """What the server does per request, in this process: read the review, decide, build the answer."""
    policy = settings.Policy()
    times = []
    for _ in range(rounds):
        for kind, endpoint, body in workload():
            started = time.perf_counter()
            request = exchange.read_review(body)
            decision = admission.decide(
                request, endpoint=endpoint, policy=policy, configmap_name="gpufrac-env-0"
            )
            json.dumps(exchange.review_response(request.uid, decision))
            times.append((kind, time.perf_counter() - started))
    return times


def report(label: str, latencies: list[float]) -> str:
    ms = np.array(latencies) * 1000
    p50, p90, p99, p999 = np.percentile(ms, [50, 90, 99, 99.9])
    return f"{label:<24}{len(ms):>7}{p50:>9.2f}{p90:>9.2f}{p99:>9.2f}{p999:>9.2f}{ms.max():>9.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second (default 200)")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured seconds (default 30)")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds at the rate before measuring")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpufrac-webhook-bench-") as folder:
        server, url, ca = start_server(Path(folder))
        try:
            results, errors, lag, wall = asyncio.run(
                measure(url, ca, rate=args.rate, seconds=args.seconds, warmup=args.warmup)
            )
        finally:
            server.terminate()
            server.wait(timeout=10)
    sent = len(results) + errors
    print(f"gpufrac webhook, HTTPS on loopback, open loop: {args.rate:g} requests/s for {args.seconds:g} s")
    print(f"  {sent} sent in {wall:.1f} s ({sent / wall:.1f}/s), {errors} errors")
    print(f"  load generator: largest delay of a send behind its due time {lag * 1000:.1f} ms")
    print(f"{'latency (ms)':<24}{'n':>7}{'p50':>9}{'p90':>9}{'p99':>9}{'p99.9':>9}{'max':>9}")
    print(report("all", [latency for _, latency in results]))
    for kind in dict.fromkeys(kind for kind, _ in results):
        print(report(kind, [latency for k, latency in results if k == kind]))
    decided = decision_times()
    print("\nin-process decision (read_review + decide + answer, no HTTP or TLS)")
    print(report("all", [latency for _, latency in decided]))


if __name__ == "__main__":
    main()
