"""Capacity planner speed on the bundled openb trace (issue: capacity planner).

Prints the wall time of the whole default `gpufrac plan` (six strategies, seed 42, timed replay) with
`--workers 2`, and per strategy the probes its search made and the CPU seconds of the search and of the
timed replay. CPU seconds do not grow when other work shares the machine, so their sum over two is what
the plan takes on two idle cores (less whatever the pool cannot balance), whatever the wall time says.

Run: .venv/bin/python benchmarks/plan.py [--workers 2] [--policy bestfit] [--seeds 42]
"""

from __future__ import annotations

import argparse
import time

from gpufrac.plan import planner
from gpufrac.plan.planner import Settings
from gpufrac.sim import experiment, trace


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--policy", default="bestfit")
    parser.add_argument("--seeds", default="42")
    parser.add_argument("--gpu-model", default=None)
    args = parser.parse_args()

    started = time.perf_counter()
    loaded = trace.load()
    settings = Settings(
        seeds=tuple(experiment.parse_seeds(args.seeds)),
        policy=args.policy,
        gpu_model=args.gpu_model,
        workers=args.workers,
    )
    prepared = planner.prepare(loaded, settings)
    static, replays = planner.run(prepared)
    summary = planner.summarize(loaded, prepared, static, replays)
    wall = time.perf_counter() - started
    what = f"{args.policy}, seeds {args.seeds}, --workers {args.workers}"
    print(f"gpufrac plan on the bundled trace, {what}: {wall:.1f} s")
    print(f"{'strategy':<24}{'GPUs':>7}{'probes':>8}{'search CPU s':>14}{'timed CPU s':>13}")
    total = 0.0
    for name, row in summary["strategies"].items():
        probes = sum(len(run["probes"]) for run in row["runs"])
        search, replay = row["cpu_seconds"], row["timed"]["cpu_seconds"]
        total += search + replay
        print(f"{name:<24}{row['gpus_needed']:>7.0f}{probes:>8}{search:>14.1f}{replay:>13.1f}")
    print(f"CPU seconds in all: {total:.1f}; spread over 2 cores: {total / 2:.1f} s")


if __name__ == "__main__":
    main()
