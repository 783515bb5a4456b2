"""Each queue's fair share of the cluster, and which queue is served first. Pure.

Per resource, top down: the roots share the cluster's capacity and each queue's share is split among its
children. At every level a queue first gets its quota (never more than it asks for), then what is left of its
parent's share is split among the queues that want more: those of the highest `priority` first, in proportion
to their `overQuotaWeight` (water-filling: a queue that needs less than its part gives the rest back to the
others), never past its limit or its demand; what they all leave goes to the next priority. A queue's demand
is what its pods hold plus what its pending pods ask; a parent's is its children's. So capacity no queue wants
stays unassigned, and a queue alone in the cluster may use all of it.

Pods are then taken from the queue furthest below its fair share: the one whose largest ratio of use to
fair share, over the resources, is smallest. A pod that would take its queue, or a queue above it, past a
limit is not placed at all (`past_limit`).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpufrac.contract.queues import DEFAULT_QUEUE, QueueSpec, Resource, ancestry

Amounts = Mapping[Resource, float]
_EPSILON = 1e-9


def with_default(queues: Mapping[str, QueueSpec]) -> dict[str, QueueSpec]:
    """The queues, with `default` added when no Queue object names it."""
    return {DEFAULT_QUEUE: QueueSpec(DEFAULT_QUEUE), **queues}


def fair_shares(
    queues: Mapping[str, QueueSpec], capacity: Amounts, demand: Mapping[str, Amounts]
) -> dict[str, dict[Resource, float]]:
    """Every queue's fair share of each resource (`demand`: per leaf queue, held plus asked for)."""
    children = _children(queues)
    shares: dict[str, dict[Resource, float]] = {name: {} for name in queues}
    for resource in Resource:
        wanted = _demands(queues, children, demand, resource)
        level: list[tuple[str | None, float]] = [(None, float(capacity.get(resource, 0)))]
        while level:  # each parent's share, split among its children
            parent, amount = level.pop()
            kids = children.get(parent, [])
            for kid, share in zip(
                kids, _divide(amount, [(queues[k], wanted[k]) for k in kids], resource), strict=True
            ):
                shares[kid][resource] = share
                level.append((kid, share))
    return shares


def _demands(
    queues: Mapping[str, QueueSpec],
    children: Mapping[str | None, list[str]],
    demand: Mapping[str, Amounts],
    resource: Resource,
) -> dict[str, float]:
    """Each queue's demand of `resource`: its own pods' and its children's, capped at its limit."""
    found: dict[str, float] = {}
    for name in reversed(_top_down(children)):
        value = float(demand.get(name, {}).get(resource, 0)) + sum(
            found[kid] for kid in children.get(name, [])
        )
        limit = queues[name].entitlement(resource).limit
        found[name] = value if limit is None else min(value, float(limit))
    return found


def held_under(
    queues: Mapping[str, QueueSpec], usage: Mapping[str, Amounts]
) -> dict[str, dict[Resource, float]]:
    """What each queue holds with the queues under it (`usage`: per queue, what its own pods hold)."""
    children = _children(queues)
    found: dict[str, dict[Resource, float]] = {}
    for name in reversed(_top_down(children)):
        total = dict(usage.get(name, {}))
        for kid in children.get(name, []):
            for resource, amount in found[kid].items():
                total[resource] = total.get(resource, 0.0) + amount
        found[name] = total
    return found


def past_limit(
    queues: Mapping[str, QueueSpec], held: Mapping[str, Amounts], queue: str, asked: Amounts
) -> tuple[str, Resource, int] | None:
    """The first queue, from `queue` up to its root, whose limit of a resource `asked` more would pass
    (`held`: per queue, with the queues under it, as `held_under` counts), with that resource and limit;
    None when every limit holds."""
    for name in ancestry(queues, queue):
        for resource, amount in asked.items():
            limit = queues[name].entitlement(resource).limit
            if (
                amount > 0
                and limit is not None
                and held.get(name, {}).get(resource, 0.0) + amount > limit + _EPSILON
            ):
                return name, resource, limit
    return None


def _children(queues: Mapping[str, QueueSpec]) -> dict[str | None, list[str]]:
    """Each queue's children, by name (None: the roots, and queues whose parent does not exist)."""
    children: dict[str | None, list[str]] = {}
    for name, spec in sorted(queues.items()):
        children.setdefault(spec.parent if spec.parent in queues else None, []).append(name)
    return children


def _top_down(children: Mapping[str | None, list[str]]) -> list[str]:
    """The queues, each before its children, without recursion: a tree made without the webhook may be
    thousands deep."""
    order: list[str] = []
    stack = list(children.get(None, []))
    while stack:
        name = stack.pop()
        order.append(name)
        stack.extend(children.get(name, []))
    return order


def _divide(amount: float, claims: list[tuple[QueueSpec, float]], resource: Resource) -> list[float]:
    """`amount` split among sibling queues (spec, demand): quotas first, then by weight, up to demand."""
    quotas = [min(float(spec.entitlement(resource).quota), wanted) for spec, wanted in claims]
    promised = sum(quotas)
    if promised > amount:  # quotas over-promised (capacity shrank): each gets its quota's part
        return [amount * quota / promised if promised else 0.0 for quota in quotas]
    given = list(quotas)
    left = amount - promised
    for priority in sorted({spec.priority for spec, _ in claims}, reverse=True):
        level = [i for i, (spec, _) in enumerate(claims) if spec.priority == priority]
        left = _fill(left, given, claims, level, resource)
    return given


def _fill(
    left: float,
    given: list[float],
    claims: list[tuple[QueueSpec, float]],
    level: list[int],
    resource: Resource,
) -> float:
    """Water-fills `left` into `given` among the claims at positions `level`, by weight, each up to its
    demand; returns what none of them wanted, for the next priority."""
    open_ = {i for i in level if claims[i][1] - given[i] > _EPSILON}
    while left > _EPSILON and open_:
        weights = {i: claims[i][0].entitlement(resource).over_quota_weight for i in open_}
        total = sum(weights.values())
        if total <= 0:
            break
        spent = 0.0
        for i in sorted(open_):
            part = left * weights[i] / total
            room = claims[i][1] - given[i]
            take = min(part, room)
            given[i] += take
            spent += take
            if room - take <= _EPSILON:
                open_.discard(i)
        left -= spent
        if spent <= _EPSILON:
            break
    return left


def starvation(usage: Amounts, share: Amounts) -> float:
    """How far a queue is from being below its fair share: the largest ratio of use to share over the
    resources it uses (0 when it uses nothing; infinite when it uses what it has no share of)."""
    worst = 0.0
    for resource, used in usage.items():
        if used <= 0:
            continue
        fair = share.get(resource, 0.0)
        worst = max(worst, used / fair if fair > 0 else float("inf"))
    return worst
