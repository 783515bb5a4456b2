"""`/validate` for Queue objects (`queues.gpufrac.io`): each is read as the scheduler reads it, and the tree
it makes with the queues the webhook knows (`known`, kept by the server from a watch) is checked, so a bad
field, a missing parent, a cycle, children promised more than their parent, or a parent deleted under its
children is refused with the reason, before the scheduler ever sees it. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from gpufrac import contract
from gpufrac.admission import exchange
from gpufrac.contract import queues
from gpufrac.contract.queues import QueueSpec


def validate(request: exchange.Request, known: Mapping[str, QueueSpec]) -> exchange.Decision:
    if request.operation == "DELETE":
        gone = request.name
        children = sorted(spec.name for spec in known.values() if spec.parent == gone)
        if children:
            return exchange.deny(
                "queue", f"queue {gone} is the parent of {', '.join(children)}: delete or move them first"
            )
        return exchange.ALLOW
    if request.object is None:
        return exchange.malformed(exchange.MalformedReview('"request.object" is missing', request.uid))
    try:
        spec = queues.parse_queue(request.object)
    except contract.ContractError as error:
        return exchange.deny("queue", f"Queue {request.name}: {error}")
    try:
        queues.check_tree({**known, spec.name: spec})
    except contract.ContractError as error:
        return exchange.deny("queue", f"Queue {spec.name}: {error}")
    return exchange.ALLOW
