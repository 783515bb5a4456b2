"""A scheduler to drive by hand in unit tests, and the annotations bind would have written."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpufrac.contract import keys
from gpufrac.scheduler.loop import Scheduler, SchedulerConfig
from gpufrac.scheduler.queue import SchedulingQueue

from ..kubeapi.fakeapi import FakeClock


def scheduler(client: Any = None, clock: FakeClock | None = None, **settings: Any) -> Scheduler:
    """A scheduler whose queue runs on `clock`, so backoffs pass only when a test says so."""
    made = Scheduler(client, SchedulerConfig(**settings))
    made.queue = SchedulingQueue(clock=clock or FakeClock())
    return made


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


def gpu_free(made: Scheduler, node: str) -> list[int]:
    row = made.state.index[node]
    return [int(v) for v in made.state.gpu_free[row, : int(made.state.gpu_count[row])]]


def gpu_flags(made: Scheduler, node: str, array: str) -> list[bool]:
    row = made.state.index[node]
    values: np.ndarray = getattr(made.state, array)[row, : int(made.state.gpu_count[row])]
    return [bool(v) for v in values]
