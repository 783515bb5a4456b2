"""Each queue's fair share of the cluster, and which queue is served first. Pure.

Per resource, top down: the roots share the cluster's capacity and each queue's share is split among its
children. At every level a queue first gets its quota (never more than it asks for), then what is left of
its parent's share is split among the queues that want more, in proportion to their `overQuotaWeight`
(water-filling: a queue that needs less than its part gives the rest back to the others), never past its
limit or its demand. A queue's demand is what its pods hold plus what its pending pods ask; a parent's is
its children's. So capacity no queue wants stays unassigned, and a queue alone in the cluster may use all
of it.

Pods are then taken from the queue furthest below its fair share: the one whose largest ratio of use to
fair share, over the resources, is smallest.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpufrac.contract.queues import DEFAULT_QUEUE, QueueSpec, Resource

Amounts = Mapping[Resource, float]
_EPSILON = 1e-9


def with_default(queues: Mapping[str, QueueSpec]) -> dict[str, QueueSpec]:
    """The queues, with `default` added when no Queue object names it."""
    return {DEFAULT_QUEUE: QueueSpec(DEFAULT_QUEUE), **queues}


def fair_shares(
    queues: Mapping[str, QueueSpec], capacity: Amounts, demand: Mapping[str, Amounts]
) -> dict[str, dict[Resource, float]]:
    """Every queue's fair share of each resource (`demand`: per leaf queue, held plus asked for)."""
    children: dict[str | None, list[str]] = {}
    for name, spec in sorted(queues.items()):
        children.setdefault(spec.parent if spec.parent in queues else None, []).append(name)
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
    """Each queue's demand of `resource`: its own pods' and its children's, capped at its limit. Children
    before parents, without recursion: a tree made without the webhook may be thousands deep."""
    order: list[str] = []
    stack = list(children.get(None, []))
    while stack:
        name = stack.pop()
        order.append(name)
        stack.extend(children.get(name, []))
    found: dict[str, float] = {}
    for name in reversed(order):
        value = float(demand.get(name, {}).get(resource, 0)) + sum(
            found[kid] for kid in children.get(name, [])
        )
        limit = queues[name].entitlement(resource).limit
        found[name] = value if limit is None else min(value, float(limit))
    return found


def _divide(amount: float, claims: list[tuple[QueueSpec, float]], resource: Resource) -> list[float]:
    """`amount` split among sibling queues (spec, demand): quotas first, then by weight, up to demand."""
    quotas = [min(float(spec.entitlement(resource).quota), wanted) for spec, wanted in claims]
    promised = sum(quotas)
    if promised > amount:  # quotas over-promised (capacity shrank): each gets its quota's part
        return [amount * quota / promised if promised else 0.0 for quota in quotas]
    given = list(quotas)
    left = amount - promised
    open_ = {i for i, (_, wanted) in enumerate(claims) if wanted - given[i] > _EPSILON}
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
    return given


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
