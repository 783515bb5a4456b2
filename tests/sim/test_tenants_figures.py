"""The fairness figures (`sim.tenants.figures`) of a replay written by hand: time integrals, the quota
kept, percentiles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpufrac.contract.queues import Resource
from gpufrac.sim.tenants import config, figures, replay


def test_figures_weigh_each_value_by_how_long_it_held() -> None:
    settings = config.parse(
        {"queues": [{"name": "a", "resources": {"gpus": {"quota": 4}}}, {"name": "b"}]}, Path("t.toml")
    )
    series = np.zeros((3, 2, 2, len(replay.RESOURCES)))  # (usage, share, demand) × steps × queues × resources
    g = replay.RESOURCES.index(Resource.GPUS)
    series[:, :, 0, g] = [[2, 4], [4, 4], [4, 6]]  # queue a: held 2 then 4 of a share of 4, asking 4 then 6
    a = replay.QueueTally(pods=3, waits=[0, 10, 20, 30], reclaims=[30], gang_waits=[], evicted=2)
    a.wasted_gpu_seconds = 7200
    run = replay.TenantRun(
        queues=("a", "b"),
        nodes=1,
        gpus=8,
        times=np.array([0.0, 10.0]),
        usage=series[0],
        share=series[1],
        demand=series[2],
        end=30.0,  # the second value holds 20 s
        tallies={"a": a, "b": replay.QueueTally()},
        rounds=2,
    )
    done = figures.summarize(run, settings)
    gpus = done["a"]["resources"]["gpus"]
    assert gpus["quota"] == 4
    assert gpus["mean_allocation"] == pytest.approx((2 * 10 + 4 * 20) / 30, abs=1e-3)
    assert gpus["allocation_over_fair_share"] == pytest.approx(100 / 120, abs=1e-3)
    assert gpus["quota_met"] == pytest.approx(
        20 / 30, abs=1e-3
    )  # asked for its quota all along, held it 20 s
    assert done["a"]["resources"]["gpuMemory"]["allocation_over_fair_share"] is None  # no share of it at all
    assert done["b"]["resources"]["gpus"]["quota_met"] is None  # no quota to meet
    assert done["a"]["wait_seconds"] == {"count": 4, "p50": 15.0, "p95": 28.5}
    assert done["a"]["reclaim_seconds"] == {"count": 1, "p50": 30.0, "p95": 30.0}
    assert done["a"]["gang_wait_seconds"] == {"count": 0, "p50": None, "p95": None}
    assert (done["a"]["evicted"], done["a"]["wasted_gpu_hours"]) == (2, 2.0)
