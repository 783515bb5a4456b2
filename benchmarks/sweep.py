"""Research speed (issue 15, item 5): the full sweep of 17 traces x 7 policies x 10 seeds (1,190 replays).

Prints, per trace, the CPU seconds of one replay of each policy (seed 42, one at a time in this process,
`time.process_time`, which waiting for a core on a shared machine does not inflate), and the full sweep's
time projected from them: each policy's replay times x the seeds, spread over the workers. With `--full`
it then runs the sweep itself (`gpufrac simulate --traces all`, every table, plot and bound) and prints its
wall time. The target: the full sweep in under 10 minutes on a 2-core machine.

Run: .venv/bin/python benchmarks/sweep.py [--trace-dir ../shared/data/openb] [--seeds 42-51] [--workers 2]
     [--full]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpufrac.sim import experiment, trace
from gpufrac.sim.replay import replay
from gpufrac.sim.simulate import PAPER_TRACES

POLICIES = (*experiment.PAPER_POLICIES, "fgd-stranding")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace-dir", type=Path, default=Path("../shared/data/openb"))
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--full", action="store_true", help="also run the whole sweep and time it")
    args = parser.parse_args()
    seeds = experiment.parse_seeds(args.seeds)
    nodes = args.trace_dir / trace.BUNDLED_NODES
    print(f"{'trace':<12}" + "".join(f"{policy:>15}" for policy in POLICIES) + f"{'pods':>8}")
    total = 0.0
    for name in PAPER_TRACES:
        loaded = trace.load(nodes, args.trace_dir / f"openb_pod_list_{name}.csv")
        seconds = []
        for policy in POLICIES:
            started = time.process_time()
            run = replay(loaded, policy=policy, seed=seeds[0])
            seconds.append(time.process_time() - started)
        total += sum(seconds)
        print(f"{name:<12}" + "".join(f"{s:>15.2f}" for s in seconds) + f"{run.pods:>8}", flush=True)
    replays = len(PAPER_TRACES) * len(POLICIES)
    print(f"\none replay: {total / replays:.2f} s CPU on average ({replays} replays, seed {seeds[0]})")
    projected = total * len(seeds) / args.workers
    print(
        f"projected sweep, {replays * len(seeds)} replays on {args.workers} workers: "
        f"{projected / 60:.1f} min (target: 10)"
    )
    if args.full:
        with tempfile.TemporaryDirectory() as out:
            command = [
                *(sys.executable, "-m", "gpufrac.cli", "simulate", "--traces", "all"),
                *("--trace-dir", str(args.trace_dir), "--policies", ",".join(POLICIES)),
                *("--seeds", args.seeds, "--workers", str(args.workers), "--out", out),
            ]
            started = time.perf_counter()
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            print(
                f"full sweep (gpufrac simulate --traces all): {(time.perf_counter() - started) / 60:.1f} min"
            )


if __name__ == "__main__":
    main()
