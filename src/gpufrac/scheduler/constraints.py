"""Whether gpufrac can read a pod's placement constraints at all, and use the names it gives. Pure.

A node affinity, pod (anti-)affinity or topology spread the API server would not have taken (a pod made past
its validation, or by an older one) cannot be honoured, so such a pod is refused with the field at fault
rather than placed as if it had none. A name the bind puts in the path of an API request (the env
ConfigMaps' base) must be an object's name, or `../` would reach another namespace.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpufrac import contract
from gpufrac.contract import keys
from gpufrac.contract.errors import brief
from gpufrac.kubeapi import fields
from gpufrac.scheduler import affinity, objects, pod_affinity, spread

# The most tolerations, and node selector labels, a pod may carry: each tainted node (each node) is matched
# against every one on every try, and the pod is the tenant's. Real pods carry a handful.
MAX_TOLERATIONS = 256
MAX_SELECTOR_LABELS = 256


def refusal(pod: Mapping[str, Any]) -> str | None:
    """Why gpufrac will not place the pod by its placement constraints, or by a name it gives that the bind
    would use (its env ConfigMaps'); None when it may."""
    try:
        affinity.node_terms(pod)
        pod_affinity.facts_of(pod)
        spread.constraints_of(pod)
    except contract.ContractError as error:
        return f"unreadable placement constraints: {error}"
    spec = fields.as_mapping(pod.get("spec"))
    for field, most in (("tolerations", MAX_TOLERATIONS), ("nodeSelector", MAX_SELECTOR_LABELS)):
        value = spec.get(field)
        if isinstance(value, list | Mapping) and len(value) > most:
            return (
                f"unreadable placement constraints: spec.{field} has {len(value)} entries, more than {most}"
            )
    base = objects.annotations_of(pod).get(keys.ENV_CONFIGMAP_ANNOTATION)
    if base is not None and not fields.is_object_name(base):
        return (
            f"annotation {keys.ENV_CONFIGMAP_ANNOTATION}={json.dumps(brief(str(base)))} is not a valid "
            "object name; leave it to gpufrac's webhook"
        )
    return None
