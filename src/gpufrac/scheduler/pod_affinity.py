"""Required inter-pod affinity and anti-affinity, judged as kube-scheduler's InterPodAffinity filter judges
them. Pure.

Inference replicas keep apart (`podAntiAffinity` on `kubernetes.io/hostname`: one node's failure takes
one replica) and a sidecar service keeps beside its model server (`podAffinity`). A term names pods (a
label selector, in some namespaces) and a topology key (a node label: the node, its zone); for a node
whose value of that key is V:

- the pod's own affinity term holds where a pod it names runs on a node of value V; a node without the key
  fails. Should no pod anywhere match any of its terms while the pod matches them all itself (the first of
  a group that keeps together), any node with the keys will do;
- the pod's own anti-affinity term fails where a pod it names runs on a node of value V;
- the pod also fails where a running pod's anti-affinity term names it (anti-affinity is symmetric,
  affinity is not).

A term's namespaces are those it lists and those its `namespaceSelector` matches (`{}`: all), or the pod's
own when it gives neither. `matchLabelKeys` and `mismatchLabelKeys` add the pod's own values of those labels
to the selector (In, NotIn). Only pods on the nodes the scheduler sees are known, so a zone-wide term
also counts only those.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufrac import contract
from gpufrac.scheduler import affinity
from gpufrac.scheduler.affinity import (
    MAX_REQUIREMENTS,
    MAX_VALUES,
    Requirement,
    field_at,
    list_at,
    mapping_at,
    requirement,
)

_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
AFFINITY_FAILED = "node(s) didn't match pod affinity rules"
ANTI_AFFINITY_FAILED = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"


@dataclass(frozen=True, slots=True)
class Selector:
    """A label selector: every requirement must hold. `matchLabels` are In requirements of one value."""

    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.holds(labels.get(r.key)) for r in self.requirements)


@dataclass(frozen=True, slots=True)
class PodTerm:
    """One required term: the pods it names (`selector`, None: none) in `namespaces` or the namespaces
    `namespace_selector` matches, and the node label that says which nodes are together."""

    selector: Selector | None
    namespaces: frozenset[str]
    namespace_selector: Selector | None
    topology_key: str

    def names(self, pod: PodFacts, namespace_labels: Mapping[str, Mapping[str, str]]) -> bool:
        """Whether the term names the pod."""
        if self.selector is None or not self.selector.matches(pod.labels):
            return False
        if pod.namespace in self.namespaces:
            return True
        selector = self.namespace_selector
        return selector is not None and selector.matches(namespace_labels.get(pod.namespace, {}))


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What pod affinity reads of a pod: where it is named from, and its own required terms."""

    namespace: str
    labels: Mapping[str, str]
    affinity: tuple[PodTerm, ...] = ()
    anti_affinity: tuple[PodTerm, ...] = ()

    @property
    def has_terms(self) -> bool:
        return bool(self.affinity or self.anti_affinity)


def facts_of(pod: Mapping[str, Any]) -> PodFacts:
    """The pod's facts; `ContractError` for required terms the API server would not have taken, or more
    than `MAX_REQUIREMENTS` terms and requirements (or `MAX_VALUES` values) in all: every placed pod is
    matched against them on every try, and the spec is the tenant's."""
    known = identity(pod)
    raw = {kind: field_at(pod, "spec", "affinity", kind, affinity.REQUIRED) or [] for kind in _KINDS}
    if not any(raw.values()):
        return known
    check_size(
        [term for items in raw.values() if isinstance(items, list) for term in items],
        f"spec.affinity.{'|'.join(_KINDS)}",
    )
    wanted, shunned = (_terms(raw[kind], kind, known.namespace, known.labels) for kind in _KINDS)
    return PodFacts(known.namespace, known.labels, wanted, shunned)


_KINDS = ("podAffinity", "podAntiAffinity")


def check_size(terms: list[Any], where: str) -> None:
    """Refuse more than `MAX_REQUIREMENTS` terms and requirements, or `MAX_VALUES` values, in all: counted
    before any is read, so that a huge spec costs no more than this."""
    parts, values = len(terms), 0
    for term in terms:
        for part in ("labelSelector", "namespaceSelector"):
            selector = field_at(term, part)
            for name in ("matchLabels", "matchExpressions"):
                found = field_at(selector, name)
                parts += len(found) if isinstance(found, Mapping | list) else 0
                if name == "matchExpressions" and isinstance(found, list):
                    values += sum(len(v) for e in found if isinstance(v := field_at(e, "values"), list))
        found = field_at(term, "namespaces")
        values += len(found) if isinstance(found, list) else 0
    if parts > MAX_REQUIREMENTS or values > MAX_VALUES:
        rule = f"at most {MAX_REQUIREMENTS} terms and requirements, of {MAX_VALUES} values, in all"
        raise contract.ContractError(where, f"{parts} terms and requirements", rule)


def identity(pod: Mapping[str, Any]) -> PodFacts:
    """What another pod's terms match a pod by (its namespace and labels), without reading its own terms
    (labels the API server would refuse, not strings, are left out)."""
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    namespace, labels = meta.get("namespace"), meta.get("labels")
    labels = labels if isinstance(labels, Mapping) else {}
    if not all(isinstance(value, str) for value in labels.values()):  # the API server allows none
        labels = {key: value for key, value in labels.items() if isinstance(value, str)}
    return PodFacts(namespace if isinstance(namespace, str) else "", labels)


def bound_facts(pod: Mapping[str, Any]) -> PodFacts:
    """A running pod's facts: one whose terms do not read keeps only its labels (it runs, whatever it
    asked)."""
    try:
        return facts_of(pod)
    except contract.ContractError:
        return identity(pod)


def namespaces_named(term: PodTerm, namespace_labels: Mapping[str, Mapping[str, str]]) -> set[str]:
    """The namespaces whose pods a term may name: those it lists, and those its namespace selector matches
    among `namespace_labels` (every namespace the scheduler knows)."""
    found = set(term.namespaces)
    if term.namespace_selector is not None:
        selector = term.namespace_selector
        found.update(name for name, labels in namespace_labels.items() if selector.matches(labels))
    return found


def allowed(
    pod: PodFacts,
    rows: np.ndarray,
    column: Callable[[str], np.ndarray],
    *,
    named: Iterable[tuple[PodFacts, int]],
    repelling: Mapping[PodTerm, Iterable[int]],
    namespace_labels: Mapping[str, Mapping[str, str]],
) -> tuple[np.ndarray, Counter[str]]:
    """Per row of `rows`, whether the pod may go there, and the rows it may not counted by reason; no
    verdicts (an empty array) when no term bears on it. `column(key)`: every row's value of a node label as
    a code (-1: none); `named`: the placed pods its terms may name, as (facts, row); `repelling`: the
    anti-affinity terms of the placed pods, each with the rows of the pods that hold it (read only for the
    terms that name the pod: replicas share their terms)."""
    wanted: dict[str, set[int]] = {}  # key -> codes of the domains where pods its affinity names run
    shunned: dict[str, set[int]] = {}  # the same for its anti-affinity
    repelled: dict[str, set[int]] = {}  # key -> domains where pods whose anti-affinity names it run

    def note(found: dict[str, set[int]], key: str, row: int) -> None:
        code = int(column(key)[row])
        if code >= 0:
            found.setdefault(key, set()).add(code)

    for other, row in named:
        # As kube-scheduler counts them: a pod counts for the affinity only if every term names it.
        if pod.affinity and all(term.names(other, namespace_labels) for term in pod.affinity):
            for term in pod.affinity:
                note(wanted, term.topology_key, row)
        for term in pod.anti_affinity:
            if term.names(other, namespace_labels):
                note(shunned, term.topology_key, row)
    for term, holders in repelling.items():
        if term.names(pod, namespace_labels):
            for row in holders:
                note(repelled, term.topology_key, row)
    if not (pod.has_terms or repelled):
        return np.zeros(0, bool), Counter()
    first_of_group = not wanted and all(term.names(pod, namespace_labels) for term in pod.affinity)
    # Judged in kube-scheduler's order, so that a node is counted under the same reason.
    apart = np.zeros(len(rows), bool)
    for term in pod.affinity:
        codes = column(term.topology_key)[rows]
        kept = codes >= 0
        if not first_of_group:
            kept &= np.isin(codes, list(wanted.get(term.topology_key, ())))
        apart |= ~kept
    shuns = ~apart & _within(rows, column, shunned)
    repels = ~apart & ~shuns & _within(rows, column, repelled)
    refused = Counter(
        {
            reason: int(mask.sum())
            for reason, mask in (
                (AFFINITY_FAILED, apart),
                (ANTI_AFFINITY_FAILED, shuns),
                (EXISTING_ANTI_AFFINITY, repels),
            )
            if mask.any()
        }
    )
    return ~(apart | shuns | repels), refused


def _within(
    rows: np.ndarray, column: Callable[[str], np.ndarray], domains: Mapping[str, set[int]]
) -> np.ndarray:
    """Which of `rows` lie in one of `domains` (label key -> value codes)."""
    inside = np.zeros(len(rows), bool)
    for key, codes in domains.items():
        inside |= np.isin(column(key)[rows], list(codes))
    return inside


def _terms(items: object, kind: str, namespace: str, labels: Mapping[str, str]) -> tuple[PodTerm, ...]:
    where = f"spec.affinity.{kind}.{affinity.REQUIRED}"
    return tuple(
        _term(item, f"{where}[{i}]", namespace, labels) for i, item in enumerate(list_at(items, where))
    )


def _term(item: object, where: str, namespace: str, labels: Mapping[str, str]) -> PodTerm:
    fields = mapping_at(item, where)
    key = topology_key(fields, where)
    raw = fields.get("labelSelector")
    pods = (
        None
        if raw is None
        else with_label_keys(selector(raw, f"{where}.labelSelector"), fields, where, labels)
    )
    names = list_at(fields.get("namespaces") or [], f"{where}.namespaces")
    if not all(isinstance(name, str) for name in names):
        raise contract.ContractError(f"{where}.namespaces", repr(names)[:80], "must be namespace names")
    raw = fields.get("namespaceSelector")
    namespace_selector = None if raw is None else selector(raw, f"{where}.namespaceSelector")
    own = frozenset(names) or (frozenset() if namespace_selector is not None else frozenset({namespace}))
    return PodTerm(pods, own, namespace_selector, key)


def topology_key(fields: Mapping[str, Any], where: str) -> str:
    """A term's `topologyKey`: the node label whose value says which nodes are one domain."""
    key = fields.get("topologyKey")
    if not isinstance(key, str) or not key:
        raise contract.ContractError(f"{where}.topologyKey", repr(key), "must name a node label")
    return key


def with_label_keys(
    chosen: Selector, fields: Mapping[str, Any], where: str, labels: Mapping[str, str]
) -> Selector:
    """`chosen` with the pod's own values of the labels its term's `matchLabelKeys` (In) and
    `mismatchLabelKeys` (NotIn) name: a rollout's new pods keep apart from each other, not from the old."""
    extra = []
    for name, operator in (("matchLabelKeys", "In"), ("mismatchLabelKeys", "NotIn")):
        for label in list_at(fields.get(name) or [], f"{where}.{name}"):
            if isinstance(label, str) and label in labels:
                extra.append(Requirement(label, operator, frozenset({labels[label]})))
    return Selector(chosen.requirements + tuple(extra))


def selector(raw: object, where: str) -> Selector:
    fields = mapping_at(raw, where)
    plain = mapping_at(fields.get("matchLabels") or {}, f"{where}.matchLabels")
    expressions = list_at(fields.get("matchExpressions") or [], f"{where}.matchExpressions")
    requirements = []
    for key, value in plain.items():
        if not isinstance(value, str):
            raise contract.ContractError(f"{where}.matchLabels.{key}", repr(value), "must be a string")
        requirements.append(Requirement(key, "In", frozenset({value})))
    for i, item in enumerate(expressions):
        requirements.append(requirement(item, f"{where}.matchExpressions[{i}]", _OPERATORS))
    return Selector(tuple(requirements))
