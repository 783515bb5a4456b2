"""How far moving pods can go (issue 15, item 3): the least packing waste of every share that arrives.

In the arrival sweep nothing leaves, and every policy places a pod that fits, moves or not: a move changes
where shares sit, not which are placed. So if every share (one-GPU pod of under 1000 milli) that arrives by
100% arrival is placed, the GPUs they take are at least what a bin packing of their sizes needs, and the
whole-GPU pods get the rest: allocation at 100% arrival is at most 100% minus that packing's waste. The
waste is bounded from below by the pattern LP (Gilmore and Gomory): one variable per way of filling a GPU
with shares, minimising GPUs while every share is covered. CPU, memory and node boundaries are ignored, so
this is a relaxation: no placement does better, however many pods it moves.

Run: .venv/bin/python benchmarks/share_packing_cap.py [--pods openb_pod_list_default.csv] [--seeds 42-51]
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.optimize import linprog

from gpufrac.sim import experiment, trace
from gpufrac.sim.replay import arrival_order

MILLI = 1000


def shares_by_100(loaded: trace.Trace, seed: int) -> Counter[int]:
    """Per size (milli), the shares that arrive by 100% arrival in the seed's replay."""
    arrived = 0
    sizes: Counter[int] = Counter()
    for pod in arrival_order(loaded, np.random.default_rng(seed), inflation=1.3):
        arrived += pod.gpu_demand_milli
        if arrived > loaded.gpus * MILLI:
            break
        if pod.num_gpu == 1 and pod.gpu_milli < MILLI:
            sizes[pod.gpu_milli] += 1
    return sizes


def fillings(sizes: Sequence[int], counts: Sequence[int]) -> list[tuple[int, ...]]:
    """Every maximal way to fill one GPU (per size, how many): one where no further share fits. A covering LP
    over these has the optimum of one over every filling, since a filling extends to a maximal one."""
    found: list[tuple[int, ...]] = []

    def extend(size: int, room: int, chosen: list[int]) -> None:
        if size == len(sizes):
            if all(sizes[i] > room or chosen[i] >= counts[i] for i in range(len(sizes))):
                found.append(tuple(chosen))
            return
        for count in range(min(counts[size], room // sizes[size]), -1, -1):
            chosen.append(count)
            extend(size + 1, room - count * sizes[size], chosen)
            chosen.pop()

    extend(0, MILLI, [])
    return found


def least_gpus(shares: Counter[int]) -> float:
    """The pattern LP's optimum: GPUs needed to hold every share."""
    sizes = sorted(shares, reverse=True)
    counts = [shares[size] for size in sizes]
    cover = np.array(fillings(sizes, counts), float).T
    solved = linprog(np.ones(cover.shape[1]), A_ub=-cover, b_ub=-np.array(counts, float), method="highs")
    if not solved.success:
        raise SystemExit(f"benchmarks/share_packing_cap.py: the LP failed: {solved.message}")
    return float(solved.fun)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=Path, help="openb pod list CSV (default: the bundled default trace)")
    parser.add_argument("--seeds", default="42-51")
    args = parser.parse_args()
    loaded = trace.load(pods=args.pods)
    print(f"{'seed':>5} {'shares':>7} {'their GPUs':>11} {'GPUs needed':>12} {'waste':>7} {'cap %':>7}")
    caps = []
    for seed in experiment.parse_seeds(args.seeds):
        shares = shares_by_100(loaded, seed)
        demand = sum(size * count for size, count in shares.items()) / MILLI
        needed = least_gpus(shares)
        caps.append(100 * (1 - (needed - demand) / loaded.gpus))
        print(
            f"{seed:>5} {sum(shares.values()):>7} {demand:>11.1f} {needed:>12.1f} {needed - demand:>7.1f} "
            f"{caps[-1]:>7.2f}"
        )
    print(f"no placement that places every share arriving by 100% allocates more than {max(caps):.2f}% there")


if __name__ == "__main__":
    main()
