"""The event-driven replay: pods arrive at their creation time and leave at their deletion time.

This reads the trace as a history rather than a snapshot. It runs on the trace's own cluster (retargeted
with `--gpu-model`), nodes in the seed's order; a pod that fits nowhere when it arrives is counted as
rejected and never runs. At equal times departures go first. A pod without a deletion time runs to the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpufrac.cluster.model import PodDemand, Unschedulable
from gpufrac.plan.packer import Packer
from gpufrac.sim import trace
from gpufrac.sim.trace import TracePod

# At one instant: departures, then arrivals, then the departures of pods that lived no time at all.
DEPART, ARRIVE, LEAVE_AT_ONCE = 0, 1, 2
POINTS = 400  # the series keeps the largest value in each of this many equal spans of time


@dataclass(frozen=True, slots=True)
class TimedReplay:
    peak_gpus: int  # the most GPUs holding a pod at any one time
    peak_time: float
    rejected: int
    series: tuple[tuple[float, int], ...]  # (time, the most busy GPUs in the span starting then)


def require_times(pods: Sequence[TracePod]) -> None:
    trace.require_times(pods, replay="the timed replay", fix="; pass --no-timed to skip it")


def replay(packer: Packer, times: Sequence[TracePod], pods: Sequence[PodDemand]) -> TimedReplay:
    """`times[i]` gives the creation and deletion time of `pods[i]`."""
    require_times(times)
    events: list[tuple[float, int, int]] = []  # (time, DEPART / ARRIVE / LEAVE_AT_ONCE, pod)
    for i, pod in enumerate(times):
        assert pod.creation_time is not None
        events.append((pod.creation_time, ARRIVE, i))
        if pod.deletion_time is not None:
            kind = DEPART if pod.deletion_time > pod.creation_time else LEAVE_AT_ONCE
            events.append((pod.deletion_time, kind, i))
    events.sort()
    rejected: set[int] = set()
    states: list[tuple[float, int]] = []
    for time, kind, i in events:
        if kind == ARRIVE:
            if isinstance(packer.place(pods[i]), Unschedulable):
                rejected.add(i)
        elif i not in rejected:
            packer.release(pods[i].name)
        states.append((time, packer.busy_gpus()))
    peak_time, peak = max(states, key=lambda state: (state[1], -state[0]), default=(0.0, 0))
    return TimedReplay(peak, peak_time, len(rejected), downsample(states))


def downsample(states: Sequence[tuple[float, int]], points: int = POINTS) -> tuple[tuple[float, int], ...]:
    """The largest value in each of `points` equal spans; a span without events holds the value before it."""
    if not states:
        return ()
    start, end = states[0][0], states[-1][0]
    width = (end - start) / points or 1.0
    spans = [-1] * points
    current = 0
    at = 0
    for span in range(points):
        limit = start + (span + 1) * width
        spans[span] = current
        while at < len(states) and (states[at][0] < limit or span == points - 1):
            current = states[at][1]
            spans[span] = max(spans[span], current)
            at += 1
    return tuple((start + span * width, value) for span, value in enumerate(spans))
