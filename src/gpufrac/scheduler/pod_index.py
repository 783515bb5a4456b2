"""The placed pods as inter-pod affinity, topology spread and ReadWriteOncePod claims read them: each pod's
namespace, labels, terms and persistent volume claims, indexed so that a decision reads only the pods a
term or spread may name, or that mount a claim it mounts. Pure.

A term or spread names pods of some namespaces by a label selector, and nearly every selector requires some
label to be one of a few values (`matchLabels`): only the pods with that label value are looked at, not
every pod of the namespace, which at 100,000 pods cost a tenth of a second a decision.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from gpufrac.scheduler import pod_affinity, volumes
from gpufrac.scheduler.pod_affinity import PodFacts, PodTerm, Selector

# Above this many namespaces a term's pods are found by label value across namespaces (`PodIndex.named`).
FEW_NAMESPACES = 8


class PodIndex:
    def __init__(self) -> None:
        self.facts: dict[str, PodFacts] = {}  # uid -> facts of a placed pod (bound or assumed)
        # The required anti-affinity terms of placed pods, each with the uids of the pods that hold it.
        self.repelling: dict[PodTerm, set[str]] = {}
        # (namespace, claim) -> uids of the placed pods that mount it, for ReadWriteOncePod (`volumes.read`).
        self.mounting: dict[tuple[str, str], set[str]] = {}
        self._claims: dict[str, list[str]] = {}  # uid -> the claims it mounts, for pods that mount any
        self._in_namespace: dict[str, set[str]] = {}
        self._labelled: dict[tuple[str, str, str], set[str]] = {}  # (namespace, label, value) -> uids
        self._labelled_anywhere: dict[tuple[str, str], set[str]] = {}  # (label, value) -> uids

    def know(self, uid: str, pod: Mapping[str, Any]) -> None:
        """Note a placed pod, or its new version (its labels may have changed)."""
        self.forget(uid)
        facts = self.facts[uid] = pod_affinity.bound_facts(pod)
        self._in_namespace.setdefault(facts.namespace, set()).add(uid)
        for key, value in facts.labels.items():
            self._labelled.setdefault((facts.namespace, key, value), set()).add(uid)
            self._labelled_anywhere.setdefault((key, value), set()).add(uid)
        for term in facts.anti_affinity:
            self.repelling.setdefault(term, set()).add(uid)
        if claims := volumes.claim_names(pod):
            self._claims[uid] = claims
            for claim in claims:
                self.mounting.setdefault((facts.namespace, claim), set()).add(uid)

    def forget(self, uid: str) -> None:
        facts = self.facts.pop(uid, None)
        if facts is None:
            return
        for term in facts.anti_affinity:
            _drop(self.repelling, term, uid)
        _drop(self._in_namespace, facts.namespace, uid)
        for key, value in facts.labels.items():
            _drop(self._labelled, (facts.namespace, key, value), uid)
            _drop(self._labelled_anywhere, (key, value), uid)
        for claim in self._claims.pop(uid, ()):
            _drop(self.mounting, (facts.namespace, claim), uid)

    def named(self, namespaces: Iterable[str], selector: Selector | None) -> Iterator[str]:
        """The uids of the pods in `namespaces` that `selector` may match (a superset: the caller matches
        them); none for no selector."""
        if selector is None:
            return
        pinned = next((r for r in selector.requirements if r.operator == "In"), None)
        namespaces = list(namespaces)
        if pinned is not None and len(namespaces) > FEW_NAMESPACES:
            # Across many namespaces (a `namespaceSelector`, perhaps of every one of thousands): the pods
            # with each value, whatever their namespace, then theirs kept, rather than a look-up per
            # namespace and value. Over a few, those look-ups cost less than the other namespaces' pods.
            wanted = set(namespaces)
            for value in pinned.values:
                for uid in self._labelled_anywhere.get((pinned.key, value), ()):
                    if self.facts[uid].namespace in wanted:
                        yield uid
            return
        for namespace in namespaces:
            if pinned is None:
                yield from self._in_namespace.get(namespace, ())
            else:
                for value in pinned.values:
                    yield from self._labelled.get((namespace, pinned.key, value), ())


def _drop(index: dict[Any, set[str]], key: Any, uid: str) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(uid)
        if not members:
            del index[key]
