"""benchmarks/share_packing_cap.py: the pattern LP's answers where they are known by hand, and the script."""

from __future__ import annotations

import functools
import importlib.util
from collections import Counter
from types import ModuleType

import pytest

from tests.benchmarks import scripts

run = functools.partial(scripts.run, "share_packing_cap.py")


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "share_packing_cap", scripts.ROOT / "benchmarks" / "share_packing_cap.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("shares", "gpus"),
    [
        ({810: 2, 190: 2}, 2.0),  # each 810 beside a 190
        ({810: 3}, 3.0),  # nothing beside them
        ({810: 2, 190: 1, 160: 1}, 2.0),
        ({600: 3}, 3.0),  # no two on one GPU
        ({500: 4}, 2.0),
        ({400: 5}, 2.5),  # two a GPU: the relaxation counts half a GPU for the fifth
    ],
)
def test_the_least_gpus_for_shares_known_by_hand(shares: dict[int, int], gpus: float) -> None:
    assert script().least_gpus(Counter(shares)) == pytest.approx(gpus)


def test_the_script_prints_each_seeds_cap_and_the_highest() -> None:
    done = run("--seeds", "42")
    assert done.returncode == 0, done.stderr
    *_, row, verdict = done.stdout.strip().splitlines()
    seed, shares, demand, needed, waste, cap = row.split()
    assert seed == "42" and int(shares) > 0
    assert float(waste) == pytest.approx(float(needed) - float(demand), abs=0.11)
    assert 90 < float(cap) < 100
    assert verdict.endswith(f"allocates more than {cap}% there")
