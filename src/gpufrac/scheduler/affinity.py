"""A pod's required node affinity, matched as kube-scheduler matches it, and the selector pieces the other
placement constraints share (requirements, a persistent volume's node affinity, topologies). Pure.

`spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution` is where GPU pods usually name
their GPU product or pool (`nvidia.com/gpu.product In [...]`), so a scheduler that skipped it would put them
on GPUs they were written against. Its terms are ORed, each term's requirements ANDed; a term without any
matches no node. Preferred terms only rank nodes for kube-scheduler and are not read.

Constraints on other pods (inter-pod affinity, topology spread) are `pod_affinity`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufrac import contract

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_NODE_AFFINITY = f"spec.affinity.nodeAffinity.{REQUIRED}"
_LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
_FIELD_OPERATORS = ("In", "NotIn")
_NODE_NAME_FIELD = "metadata.name"  # the one field a term's matchFields may name
# The most requirements, and values, a pod's node affinity may hold in all. Every node is matched against
# them on every try, and the spec is the tenant's: a pod of ten thousand would cost the scheduler seconds a
# try. Real pods name a few.
MAX_REQUIREMENTS = 256
MAX_VALUES = 4096


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: frozenset[str]

    def holds(self, value: str | None) -> bool:
        """Whether a node whose label (or field) `key` is `value` (None: absent) meets the requirement."""
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values
        if self.operator == "Exists":
            return value is not None
        if self.operator == "DoesNotExist":
            return value is None
        number = _integer(value)
        if number is None:
            return False
        bound = int(next(iter(self.values)))
        return number > bound if self.operator == "Gt" else number < bound


@dataclass(frozen=True, slots=True)
class Term:
    expressions: tuple[Requirement, ...]
    fields: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        if not (self.expressions or self.fields):
            return False
        return all(r.holds(labels.get(r.key)) for r in self.expressions) and all(
            r.holds(name) for r in self.fields
        )


def node_terms(pod: Mapping[str, Any]) -> tuple[Term, ...] | None:
    """The pod's required node affinity terms, or None when it has none; `ContractError` for one the API
    server would not have taken (a pod made past its validation, or an older one)."""
    required = field_at(pod, "spec", "affinity", "nodeAffinity", REQUIRED)
    return None if required is None else selector_terms(required, _NODE_AFFINITY)


def selector_terms(selector: object, where: str) -> tuple[Term, ...]:
    """The terms of a NodeSelector (`nodeSelectorTerms`: a pod's required node affinity, a persistent
    volume's `spec.nodeAffinity.required`) found at `where`; `ContractError` for one the API server would
    not have taken."""
    terms = mapping_at(selector, where).get("nodeSelectorTerms")
    where = f"{where}.nodeSelectorTerms"
    if not isinstance(terms, list) or not terms:
        raise contract.ContractError(where, repr(terms), "name one term or more")
    # Counted before anything is read, so that a huge one costs no more than this.
    raw = [r for term in terms if isinstance(term, Mapping) for kind in _KINDS for r in _items(term, kind)]
    values = sum(len(_items(r, "values")) for r in raw if isinstance(r, Mapping))
    if len(terms) + len(raw) > MAX_REQUIREMENTS or values > MAX_VALUES:
        rule = f"at most {MAX_REQUIREMENTS} terms and requirements, of {MAX_VALUES} values, in all"
        raise contract.ContractError(where, f"{len(terms) + len(raw)} terms and requirements", rule)
    return tuple(_term(term, f"{where}[{i}]") for i, term in enumerate(terms))


def node_named(name: str) -> tuple[Term, ...]:
    """Terms that only the node `name` matches."""
    return (Term((), (Requirement(_NODE_NAME_FIELD, "In", frozenset({name})),)),)


def topology_terms(topologies: object, where: str) -> tuple[Term, ...]:
    """A StorageClass's `allowedTopologies` (label keys, each with the values allowed) as terms: ORed, each
    term's keys ANDed, as for a node selector."""
    terms = []
    for i, topology in enumerate(list_at(topologies, where)):
        at = f"{where}[{i}].matchLabelExpressions"
        found = list_at(mapping_at(topology, f"{where}[{i}]").get("matchLabelExpressions") or [], at)
        terms.append(
            Term(
                tuple(
                    requirement({**mapping_at(item, at), "operator": "In"}, f"{at}[{j}]", ("In",))
                    for j, item in enumerate(found)
                ),
                (),
            )
        )
    return tuple(terms)


def matches(terms: tuple[Term, ...] | None, labels: Mapping[str, str], name: str) -> bool:
    """Whether a node of `labels` and `name` meets the pod's required node affinity (`node_terms`)."""
    return terms is None or any(term.matches(labels, name) for term in terms)


# Per operator: how many values it takes ("some", "none" or "one" whole number).
_VALUES = {"In": "some", "NotIn": "some", "Exists": "none", "DoesNotExist": "none", "Gt": "one", "Lt": "one"}
_VALUES_RULE = {"some": "needs values", "none": "takes no values", "one": "needs one whole number"}


def _term(term: object, where: str) -> Term:
    fields = mapping_at(term, where)

    def requirements(name: str, operators: tuple[str, ...]) -> tuple[Requirement, ...]:
        items = list_at(fields.get(name) or [], f"{where}.{name}")
        return tuple(requirement(item, f"{where}.{name}[{i}]", operators) for i, item in enumerate(items))

    return Term(
        requirements("matchExpressions", _LABEL_OPERATORS), requirements("matchFields", _FIELD_OPERATORS)
    )


def requirement(item: object, where: str, operators: tuple[str, ...]) -> Requirement:
    """One requirement (`key`, `operator` among `operators`, `values`) of a node or label selector."""
    fields = mapping_at(item, where)
    key, operator, values = fields.get("key"), fields.get("operator"), fields.get("values") or []
    if operators is _FIELD_OPERATORS and key != _NODE_NAME_FIELD:
        raise contract.ContractError(f"{where}.key", repr(key), f"must be {_NODE_NAME_FIELD}")
    if not isinstance(key, str) or not key:
        raise contract.ContractError(f"{where}.key", repr(key), "must name a label")
    if operator not in operators:
        raise contract.ContractError(
            f"{where}.operator", repr(operator), f"must be one of {', '.join(operators)}"
        )
    if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
        raise contract.ContractError(f"{where}.values", repr(values), "must be a list of strings")
    count = _VALUES[operator]
    if (
        (count == "some" and not values)
        or (count == "none" and values)
        or (count == "one" and (len(values) != 1 or _integer(values[0]) is None))
    ):
        raise contract.ContractError(f"{where}.values", repr(values), f"{operator} {_VALUES_RULE[count]}")
    return Requirement(key, operator, frozenset(values))


_KINDS = ("matchExpressions", "matchFields")


def _items(obj: Mapping[str, Any], name: str) -> list[Any]:
    """`obj[name]` where it is a list, else none: for counting before the fields are checked."""
    value = obj.get(name)
    return value if isinstance(value, list) else []


def _integer(text: str | None) -> int | None:
    """A label value read as Kubernetes reads one for Gt and Lt: a whole number, or nothing."""
    if text is None:
        return None
    digits = text[1:] if text[:1] in "+-" else text
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 19):
        return None
    number = int(text)
    return number if -(2**63) <= number < 2**63 else None  # an int64, as Kubernetes parses it


def field_at(obj: object, *path: str) -> Any:
    """`obj[path[0]][path[1]]...`, None where a step is missing or not an object."""
    for name in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(name)
    return obj


def mapping_at(obj: object, where: str) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise contract.ContractError(where, repr(obj), "must be an object")
    return obj


def list_at(obj: object, where: str) -> list[Any]:
    if not isinstance(obj, list):
        raise contract.ContractError(where, repr(obj), "must be a list")
    return obj
