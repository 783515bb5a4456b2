"""Gangs: the pods of a pod group are held once placed, their room reserved in the cache, and bound
together once `minMember` of the group can run (those held and those already bound); a group still short
after its `scheduleTimeoutSeconds` gives the room back. Bookkeeping only: the loop places, binds and
reports."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufrac.cluster.model import Placement
from gpufrac.contract.podgroups import PodGroupSpec, group_of
from gpufrac.kubeapi.custom import pod_group_index

Held = tuple[str, dict[str, Any], Placement]  # uid, pod, its reserved placement


@dataclass
class _Gang:
    since: float  # when its first member was held
    held: dict[str, Held] = field(default_factory=dict)


class Gangs:
    def __init__(self, *, on_bad: Callable[..., None]) -> None:
        self.index = pod_group_index(on_bad=on_bad)
        self.gangs: dict[str, _Gang] = {}  # group key -> members held
        self._group_of: dict[str, str] = {}  # held uid -> group key

    def spec(self, key: str) -> PodGroupSpec | None:
        return self.index.specs.get(key)

    def hold(self, key: str, held: Held, *, bound: int, now: float) -> list[Held] | None:
        """Hold a placed member; every held member once `bound` and held reach the group's `minMember`."""
        gang = self.gangs.setdefault(key, _Gang(now))
        gang.held[held[0]] = held
        self._group_of[held[0]] = key
        spec = self.spec(key)
        if spec is None or bound + len(gang.held) < spec.min_member:
            return None
        return self._release(key)

    def held_uids(self) -> set[str]:
        """The uids of every member held."""
        return set(self._group_of)

    def drop(self, uid: str) -> Held | None:
        """A held member went: no longer held (its room is the caller's to free)."""
        key = self._group_of.pop(uid, None)
        if key is None:
            return None
        gang = self.gangs[key]
        held = gang.held.pop(uid)
        if not gang.held:
            del self.gangs[key]
        return held

    def ready(self, bound: Callable[[str], int]) -> list[list[Held]]:
        """The groups whose held members, with their members bound (`bound(key)`), now reach `minMember`: its
        PodGroup lowered it, or members bound meanwhile (an extra member placed while the rest were being
        bound). No longer held: theirs to bind, where they would otherwise wait out their timeout."""
        due = []
        for key, gang in list(self.gangs.items()):
            spec = self.spec(key)
            if spec is not None and bound(key) + len(gang.held) >= spec.min_member:
                due.append(self._release(key))
        return due

    def give_back(self, key: str) -> list[Held]:
        """The group's held members, no longer held (their room is the caller's to free)."""
        return self._release(key)

    def expired(self, now: float) -> list[tuple[PodGroupSpec | None, str, list[Held]]]:
        """The groups held past their timeout (or whose PodGroup is gone): no longer held."""
        due = []
        for key, gang in list(self.gangs.items()):
            spec = self.spec(key)
            if spec is None or now - gang.since >= spec.timeout_seconds:
                due.append((spec, key, self._release(key)))
        return due

    def _release(self, key: str) -> list[Held]:
        gang = self.gangs.pop(key)
        for uid in gang.held:
            self._group_of.pop(uid, None)
        return list(gang.held.values())


def members_of(groups: Collection[str], pods: Iterable[Mapping[str, Any]]) -> Counter[str]:
    """Per group of `groups`, its members among `pods`: one pass over them, however many groups ask."""
    found = (group_of(pod) for pod in pods)
    return Counter(group for group in found if group is not None and group in groups)
