"""Simulator speed and fidelity on the bundled openb trace (issue: engine and simulator).

Prints:
- one `fgd` replay to 1.3x arrival: wall time, engine decision time per pod (median, p99), peak RSS;
- the six paper policies x seeds 42-51 with `--workers 2`: wall time, and each policy's mean allocation
  at 100% arrival against the published figure.

Run: .venv/bin/python benchmarks/simulate.py [--seeds 42-51] [--workers 2]
"""

from __future__ import annotations

import argparse
import resource
import time

from gpufrac.sim import experiment, trace
from gpufrac.sim.replay import replay


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    loaded = trace.load()

    single = replay(loaded, policy="fgd", seed=42)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"fgd replay, seed 42, {single.pods} pods to 130% arrival: {single.seconds:.2f} s")
    p50, p99 = single.decision_ms_p50, single.decision_ms_p99
    print(f"  engine decision per pod: median {p50:.3f} ms, p99 {p99:.3f} ms")
    print(f"  peak RSS of this process: {peak_mib:.0f} MiB")

    seeds = experiment.parse_seeds(args.seeds)
    started = time.perf_counter()
    sweep = experiment.run_sweep(
        [loaded], policies=experiment.PAPER_POLICIES, seeds=seeds, inflation=1.3, workers=args.workers
    )[loaded.name]
    results = sweep.runs
    wall = time.perf_counter() - started
    print(
        f"\n6 paper policies x {len(seeds)} seeds, with bounds, --workers {args.workers}: {wall:.1f} s wall"
    )
    summary = experiment.summarize(loaded, seeds, results, sweep.bounds)
    bound = summary["bound"]
    print(f"upper bound (LP): {bound['allocation_at_100']:.2f}, solved in {bound['seconds']:.2f} s per seed")
    print(f"{'policy':<12}{'ours':>8}{'std':>7}{'paper':>8}{'diff':>7}{'s/run':>8}{'p50 ms':>8}{'p99 ms':>8}")
    for policy, row in summary["policies"].items():
        runs = [run for run in results if run.policy == policy]
        p50 = max(run.decision_ms_p50 for run in runs)
        p99 = max(run.decision_ms_p99 for run in runs)
        published = row["published_at_100"]
        print(
            f"{policy:<12}{row['allocation_at_100']:>8.2f}{row['allocation_at_100_std']:>7.2f}{published:>8.2f}"
            f"{row['allocation_at_100'] - published:>+7.2f}{row['seconds']:>8.2f}{p50:>8.3f}{p99:>8.3f}"
        )


if __name__ == "__main__":
    main()
