"""The fairness figures of a tenant replay, as plain numbers for the JSON document, the table and the page.

Per queue and GPU resource (whole GPUs, shares' GPU memory), over the whole replay, every series held
constant from one round to the next:

- `allocation_over_fair_share`: the time integral of what the queue held over that of its fair share;
  1 is a queue that got its share on average, above 1 one that held more (borrowed, and kept it);
- `quota_met`: of the time the queue's demand reached its quota, the part in which it held its quota at
  least: the guarantee, kept or not (reclaim takes time: victims must be old enough, then terminate);

and per queue: waits (from joining the queue, or re-joining it after an eviction, to running), reclaims
(pods that ran on room taken back by evictions: seconds from the first round in which the pod was
entitled to reclaim to its start), evictions of its pods and the GPU-hours they had run, and gang waits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gpufrac.contract.queues import GPU_RESOURCES
from gpufrac.sim.tenants.config import TenantsConfig
from gpufrac.sim.tenants.replay import RESOURCES, TenantRun


def summarize(run: TenantRun, config: TenantsConfig) -> dict[str, dict[str, Any]]:
    """Per leaf queue, the figures the module's docstring lists."""
    spans = np.diff(run.times, append=run.end)
    queues: dict[str, dict[str, Any]] = {}
    for at, queue in enumerate(run.queues):
        tally = run.tallies[queue]
        resources = {}
        for resource in GPU_RESOURCES:
            r = RESOURCES.index(resource)
            quota = config.queues[queue].entitlement(resource).quota
            resources[resource.value] = _resource(
                run.usage[:, at, r], run.share[:, at, r], run.demand[:, at, r], spans, quota
            )
        queues[queue] = {
            "pods": tally.pods,
            "gangs": tally.gangs,
            "never_fit": tally.never_fit,
            "never_ran": tally.never_ran,
            "resources": resources,
            "wait_seconds": percentiles(tally.waits),
            "reclaim_seconds": percentiles(tally.reclaims),
            "entitled_wait_seconds": percentiles(tally.entitled_waits),
            "evicted": tally.evicted,
            "wasted_gpu_hours": round(tally.wasted_gpu_seconds / 3600, 2),
            "gang_wait_seconds": percentiles(tally.gang_waits),
            "gang_timeouts": tally.gang_timeouts,
        }
    return queues


def _resource(
    usage: np.ndarray, share: np.ndarray, demand: np.ndarray, spans: np.ndarray, quota: int
) -> dict[str, Any]:
    held, fair = float(usage @ spans), float(share @ spans)
    asking = (demand >= quota) & (quota > 0)
    asked_time = float(spans[asking].sum())
    total = float(spans.sum()) or 1.0
    return {
        "quota": quota,
        "mean_allocation": round(held / total, 3),
        "mean_fair_share": round(fair / total, 3),
        "allocation_over_fair_share": round(held / fair, 3) if fair > 0 else None,
        "quota_met": round(float(spans[asking & (usage >= quota)].sum()) / asked_time, 3)
        if asked_time > 0
        else None,
    }


def percentiles(values: Sequence[float]) -> dict[str, float | int | None]:
    """How many, and the median and 95th percentile (None of nothing)."""
    if not values:
        return {"count": 0, "p50": None, "p95": None}
    p50, p95 = np.percentile(np.asarray(values, float), [50, 95])
    return {"count": len(values), "p50": round(float(p50), 1), "p95": round(float(p95), 1)}
