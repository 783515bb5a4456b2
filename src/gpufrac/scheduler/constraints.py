"""Whether gpufrac can read a pod's placement constraints at all. Pure.

A node affinity, pod (anti-)affinity or topology spread the API server would not have taken (a pod made past
its validation, or by an older one) cannot be honoured, so such a pod is refused with the field at fault
rather than placed as if it had none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufrac import contract
from gpufrac.scheduler import affinity, pod_affinity, spread


def refusal(pod: Mapping[str, Any]) -> str | None:
    """Why gpufrac will not place the pod by its placement constraints; None when it may."""
    try:
        affinity.node_terms(pod)
        pod_affinity.facts_of(pod)
        spread.constraints_of(pod)
    except contract.ContractError as error:
        return f"unreadable placement constraints: {error}"
    return None
