"""Objects the scheduler skips, reported once each: a log line, a metric and a Warning Event.

A pod or node the scheduler cannot read, or a bound pod it cannot account on its node, is skipped so that
every other object is still handled; an operator must still hear of it. The watches deliver the same object
again on every change (a node's heartbeat every few seconds), so a problem is reported when it is new, not
each time it is seen again.

The cache and the event handlers call `report` synchronously; the Events are written later by `send`, so
that reporting never waits on the API server.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import lightkube

from gpufrac.kubeapi import events
from gpufrac.scheduler import objects

log = logging.getLogger("gpufrac.scheduler")

INVALID = "InvalidObject"  # a pod or node the scheduler cannot read: skipped
NOT_ACCOUNTED = "NotAccounted"  # a bound pod its node cannot hold as its annotations say: the node is held


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str  # "Pod" or "Node"
    name: str
    namespace: str | None
    uid: str | None
    reason: str  # INVALID or NOT_ACCOUNTED, the Event's reason
    message: str

    @classmethod
    def about(cls, kind: str, obj: Mapping[str, Any], reason: str, message: str) -> Problem:
        """A problem with `obj`, named by whatever of its identity can be read."""
        namespace = objects.text_field(obj, "metadata", "namespace") or None
        uid = objects.text_field(obj, "metadata", "uid") or None
        return cls(kind, objects.name_of(obj), namespace, uid, reason, message)

    def describe(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}: {self.message}"[: events.MAX_MESSAGE]


def log_problem(problem: Problem) -> None:
    log.warning("%s (%s)", problem.describe(), problem.reason)


class Problems:
    """The problems reported and not yet written as Events; `on_new` sees each new one (the metrics)."""

    def __init__(
        self,
        *,
        on_new: Callable[[Problem], None] = lambda _: None,
        remember: int = 4096,
        backlog: int = 256,
    ) -> None:
        self._on_new = on_new
        self._seen: OrderedDict[Problem, None] = OrderedDict()  # bounded: the newest `remember`
        self._remember = remember
        self._unsent: deque[Problem] = deque(maxlen=backlog)  # a flood drops the oldest Events, not memory
        self.waiting = asyncio.Event()

    def report(self, problem: Problem) -> None:
        if problem in self._seen:
            self._seen.move_to_end(problem)
            return
        self._seen[problem] = None
        if len(self._seen) > self._remember:
            self._seen.popitem(last=False)
        log_problem(problem)
        self._on_new(problem)
        self._unsent.append(problem)
        self.waiting.set()

    async def send(self, client: lightkube.AsyncClient, *, component: str) -> None:
        """Write a Warning Event for each problem reported since the last call."""
        self.waiting.clear()
        while self._unsent:
            problem = self._unsent.popleft()
            if not problem.name:
                continue  # an object without a readable name cannot be the subject of an Event
            involved = {"kind": problem.kind, "name": problem.name, "namespace": problem.namespace}
            involved["uid"] = problem.uid
            await events.record(
                client,
                events.warning(
                    involved=involved, reason=problem.reason, message=problem.message, component=component
                ),
            )
