"""Interference between N identical clients of one GPU (issue 16): each runs a matmul loop for a fixed time,
as time-slicing clients (plain processes) and as sm-sharing clients (MPS, under a control daemon this
script starts in a temporary pipe directory and quits after). Per mode: GFLOP/s of one client alone, of
each of N clients together, their total, and the total's ratio to one alone. With --memory-over, one MPS
client with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT allocates half its limit, then twice it: the second must fail.

On a GPU the matmuls run through CuPy or PyTorch, whichever imports (neither is a gpufrac dependency: a
CUDA build is gigabytes; `pip install cupy-cuda12x`). Without a GPU (`--device auto` finds none through
NVML, or `--device cpu`) numpy runs them on the CPU, one thread per client, with the same report: a smoke
check of the script that says nothing about GPUs. sm-sharing and the memory check need MPS, so on the CPU
they say why they were skipped.

Run (on a GPU machine, as root for MPS):
    pip install cupy-cuda12x
    PYTHONPATH=src .venv/bin/python benchmarks/interference.py --clients 4 --seconds 10 --memory-over \
        --out interference.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

MODES = ("time-slicing", "sm-sharing")
INSTALL = "pip install cupy-cuda12x (or torch) into the Python that runs this script"
SETUP_TIMEOUT_S = 300  # a worker's import and first matmul (CuPy compiles its kernels on first use)
# One BLAS thread per CPU client, as one GPU client is one process: without this numpy takes every core.
CPU_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class SetupError(Exception):
    """What keeps the benchmark from running at all: said in one line, exit 2."""


# --- the clients (run as `--worker`, one process each) -----------------------------------------------


def library(device: str) -> tuple[str, Callable[[int], Any], Callable[[], None]]:
    """(name, make an n×n float32 matrix, wait for the device) for `device`."""
    if device == "cpu":
        import numpy

        return "numpy", lambda n: numpy.ones((n, n), dtype=numpy.float32), lambda: None
    with contextlib.suppress(ImportError):
        import cupy

        return "cupy", lambda n: cupy.ones((n, n), dtype=cupy.float32), cupy.cuda.Device().synchronize
    with contextlib.suppress(ImportError):
        import torch

        return (
            "torch",
            lambda n: torch.ones((n, n), dtype=torch.float32, device="cuda"),
            torch.cuda.synchronize,
        )
    raise SetupError(f"neither CuPy nor PyTorch is importable for --device gpu: {INSTALL}")


def worker(device: str, size: int, seconds: float) -> dict[str, Any]:
    """Warm up, say `ready`, wait for `go` on stdin, then multiply for `seconds`; GFLOP/s."""
    name, matrix, wait = library(device)
    a, b = matrix(size), matrix(size)
    a @ b
    wait()
    print("ready", flush=True)
    sys.stdin.readline()
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(8):  # a batch between syncs, so the GPU's queue never runs dry
            a @ b
        wait()
        done += 8
    elapsed = time.perf_counter() - started
    return {"library": name, "gflops": 2 * size**3 * done / elapsed / 1e9}


def allocate(mib: int) -> dict[str, Any]:
    """Allocate `mib` MiB on the GPU and say whether it worked, and the error if not."""
    name, _, wait = library("gpu")
    try:
        if name == "cupy":
            import cupy

            cupy.empty(mib * 2**20, dtype=cupy.uint8)
        else:
            import torch

            torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda")
        wait()
    except Exception as error:  # the library's out-of-memory error, whatever its class
        return {"allocated": False, "error": f"{type(error).__name__}: {error}".strip()[:300]}
    return {"allocated": True, "error": ""}


# --- the parent --------------------------------------------------------------------------------------


def pick_device(asked: str) -> str:
    """`auto`: gpu where NVML lists a GPU, else cpu."""
    if asked != "auto":
        return asked
    from gpufrac.node import nvml

    backend = nvml.RealBackend()
    try:
        snapshot = backend.sample()
    finally:
        backend.close()
    return "gpu" if not snapshot.error and snapshot.gpus else "cpu"


def spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def run_clients(count: int, device: str, size: int, seconds: float, env: dict[str, str]) -> list[float]:
    """GFLOP/s of each of `count` clients started together, once all have warmed up."""
    extra = CPU_ENV if device == "cpu" else {}
    worker_args = ["--worker", "--device", device, "--size", str(size), "--seconds", str(seconds)]
    clients = [spawn(worker_args, {**extra, **env}) for _ in range(count)]
    try:
        for client in clients:
            assert client.stdout is not None
            if client.stdout.readline().strip() != "ready":
                raise SetupError(f"a client failed to start: {_last_line(client)}")
        for client in clients:
            assert client.stdin is not None
            client.stdin.write("go\n")
            client.stdin.flush()
        results = []
        for client in clients:
            out, err = client.communicate(timeout=seconds + SETUP_TIMEOUT_S)
            if client.returncode != 0:
                raise SetupError(f"a client failed: {err.strip().splitlines()[-1:] or client.returncode}")
            results.append(float(json.loads(out)["gflops"]))
        return results
    finally:
        for client in clients:
            if client.poll() is None:
                client.kill()
                client.wait()


def _last_line(process: subprocess.Popen[str]) -> str:
    process.kill()
    _, err = process.communicate()
    lines = err.strip().splitlines()
    return lines[-1] if lines else f"exit {process.returncode}"


@contextlib.contextmanager
def mps_daemon() -> Iterator[dict[str, str]]:
    """An MPS control daemon in a temporary pipe directory: yields the clients' environment; quit after."""
    program = shutil.which("nvidia-cuda-mps-control")
    if program is None:
        raise SetupError("nvidia-cuda-mps-control is not on PATH (no NVIDIA driver utilities)")
    with tempfile.TemporaryDirectory(prefix="gpufrac-mps-") as folder:
        env = {"CUDA_MPS_PIPE_DIRECTORY": f"{folder}/pipe", "CUDA_MPS_LOG_DIRECTORY": f"{folder}/log"}
        for path in env.values():
            os.mkdir(path)
        daemon_env = {**os.environ, **env}
        subprocess.run([program, "-d"], env=daemon_env, check=True, timeout=30)
        try:
            yield env
        finally:
            subprocess.run([program], input="quit\n", text=True, env=daemon_env, timeout=30, check=False)


def measure_mode(mode: str, args: argparse.Namespace, device: str) -> dict[str, Any]:
    """One client alone, then N together, in `mode`; the reason instead where the mode cannot run."""
    if mode == "time-slicing":
        return summary(*(run_clients(n, device, args.size, args.seconds, {}) for n in (1, args.clients)))
    if device == "cpu":
        return {"skipped": "sm-sharing needs MPS on an NVIDIA GPU"}
    try:
        with mps_daemon() as env:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(args.thread_percentage)
            return summary(*(run_clients(n, device, args.size, args.seconds, env) for n in (1, args.clients)))
    except (SetupError, subprocess.SubprocessError) as error:
        return {"skipped": f"MPS: {error}"}


def summary(alone: list[float], together: list[float]) -> dict[str, Any]:
    """The report of one mode: GFLOP/s alone, per client together, their total and its ratio to alone."""
    total = sum(together)
    return {"alone": alone[0], "clients": together, "total": total, "ratio_to_alone": total / alone[0]}


def memory_over(device: str, limit_mib: int) -> dict[str, Any]:
    """One MPS client limited to `limit_mib`: half of it must allocate, twice it must not."""
    if device == "cpu":
        return {"skipped": "needs MPS on an NVIDIA GPU"}
    try:
        with mps_daemon() as env:
            limited = {**env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={limit_mib}M"}
            under, over = (_allocation(mib, limited) for mib in (limit_mib // 2, limit_mib * 2))
    except (SetupError, subprocess.SubprocessError) as error:
        return {"skipped": f"MPS: {error}"}
    expected = under["allocated"] and not over["allocated"]
    return {"limit_mib": limit_mib, "under": under, "over": over, "as_expected": expected}


def _allocation(mib: int, env: dict[str, str]) -> dict[str, Any]:
    client = spawn(["--allocate", str(mib)], env)
    out, err = client.communicate(timeout=SETUP_TIMEOUT_S)
    if client.returncode != 0:
        return {"allocated": False, "error": f"client exited {client.returncode}: {err.strip()[-300:]}"}
    return dict(json.loads(out))


def report(args: argparse.Namespace) -> dict[str, Any]:
    device = args.device
    result: dict[str, Any] = {"device": device, "library": library(device)[0], "size": args.size}
    result |= {"seconds": args.seconds, "clients": args.clients, "thread_percentage": args.thread_percentage}
    result["modes"] = {mode: measure_mode(mode, args, device) for mode in args.modes}
    result["memory_over"] = memory_over(device, args.memory_limit_mib) if args.memory_over else None
    return result


def show(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    title = (
        f"{result['clients']} clients, {result['size']}×{result['size']} float32 matmul, "
        f"{result['seconds']} s, {result['device']} ({result['library']})"
    )
    table = Table(title=title, title_justify="left")
    for column in ("mode", "alone GFLOP/s", "per client GFLOP/s", "total GFLOP/s", "total / alone"):
        table.add_column(column, justify="left" if column == "mode" else "right")
    for mode, row in result["modes"].items():
        if "skipped" in row:
            table.add_row(mode, "", row["skipped"], "", "")
            continue
        clients = ", ".join(f"{g:.1f}" for g in row["clients"])
        table.add_row(
            mode, f"{row['alone']:.1f}", clients, f"{row['total']:.1f}", f"{row['ratio_to_alone']:.2f}"
        )
    console = Console(width=140)
    console.print(table)
    if result["memory_over"] is not None:
        console.print(f"memory over its limit: {json.dumps(result['memory_over'])}", soft_wrap=True)
    if result["device"] == "cpu":
        console.print("CPU path (numpy): a smoke check of this script; it says nothing about GPUs.")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=4, help="N, the clients run together (default 4)")
    parser.add_argument("--seconds", type=float, default=10.0, help="each client's loop (default 10)")
    parser.add_argument("--size", type=int, help="matrix side (default 4096 on a GPU, 256 on the CPU)")
    parser.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    parser.add_argument("--modes", type=lambda text: text.split(","), default=list(MODES))
    parser.add_argument("--thread-percentage", type=int, default=100, help="sm-sharing clients' SM share")
    parser.add_argument("--memory-over", action="store_true", help="check an MPS client's memory limit")
    parser.add_argument("--memory-limit-mib", type=int, default=1024)
    parser.add_argument("--out", type=Path, help="also write the report as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--allocate", type=int, metavar="MIB", help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        if args.worker:
            print(json.dumps(worker(args.device, args.size, args.seconds)))
        elif args.allocate is not None:
            print(json.dumps(allocate(args.allocate)))
        else:
            if unknown := set(args.modes) - set(MODES):
                raise SetupError(f"--modes: unknown {sorted(unknown)}; use {','.join(MODES)}")
            if args.clients < 1 or args.seconds <= 0:
                raise SetupError("--clients must be at least 1 and --seconds above 0")
            args.device = pick_device(args.device)
            args.size = args.size or (256 if args.device == "cpu" else 4096)
            result = report(args)
            show(result)
            if args.out:
                args.out.write_text(json.dumps(result, indent=2) + "\n")
    except SetupError as error:
        print(f"interference: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
