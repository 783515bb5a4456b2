"""A scheduler to drive by hand in unit tests, and the annotations bind would have written."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpufrac.contract import keys
from gpufrac.scheduler.cache import SchedulerCache
from gpufrac.scheduler.config import SchedulerConfig
from gpufrac.scheduler.loop import Scheduler
from gpufrac.scheduler.queue import SchedulingQueue

from ..kubeapi.fakeapi import FakeClock


def scheduler(client: Any = None, clock: FakeClock | None = None, **settings: Any) -> Scheduler:
    """A scheduler and its queue that run on `clock`, so backoffs pass only when a test says so; it has
    listed no namespaces (a test that needs some lists them)."""
    clock = clock or FakeClock()
    made = Scheduler(client, SchedulerConfig(**settings), queue=SchedulingQueue(clock=clock), clock=clock)
    made.on_namespaces_listed([])
    return made


def pod_nodes(made: Scheduler) -> dict[str, str]:
    """Pods accounted in the cache (bound, or assumed for a bind) and their nodes."""
    return {uid: placement.node for uid, placement in made.cache.state.placements.items()}


def share_notes(
    container: str, devices: str, request: str, *, limit: str | None = None, mode: str = "time-slicing"
) -> dict[str, str]:
    """A share on `devices` as the API holds it after bind."""
    return {
        keys.container_key(container, keys.MEMORY_REQUEST): request,
        keys.container_key(container, keys.MEMORY_LIMIT): limit or request,
        keys.container_key(container, keys.COMPUTE_MODE): mode,
        keys.container_key(container, keys.DEVICES): devices,
    }


def gpu_free(made: Scheduler | SchedulerCache, node: str) -> list[int]:
    state = (made if isinstance(made, SchedulerCache) else made.cache).snapshot()
    row = state.index[node]
    return [int(v) for v in state.gpu_free[row, : int(state.gpu_count[row])]]


def gpu_flags(made: Scheduler, node: str, array: str) -> list[bool]:
    row = made.cache.state.index[node]
    values: np.ndarray = getattr(made.cache.state, array)[row, : int(made.cache.state.gpu_count[row])]
    return [bool(v) for v in values]
