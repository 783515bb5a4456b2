"""The validating webhook's rule for gpufrac's env ConfigMaps, which set a pod's GPU devices and limits.

Whoever could write one could hand a pod any GPU, so only the scheduler writes them; the controllers that
clean up after pods may delete them.
"""

from __future__ import annotations

from gpufrac.admission import exchange, settings, shapes
from gpufrac.contract import keys
from gpufrac.kubeapi import fields


def validate(request: exchange.Request, policy: settings.Policy) -> exchange.Decision:
    """Allowed, or denied if the ConfigMap is an env ConfigMap and the user may not write it."""
    names = [request.name]
    guarded = False
    for obj in (request.object, request.old_object):
        meta = shapes.metadata_of(obj)
        names += [fields.as_str(meta.get("name")), fields.as_str(meta.get("generateName"))]
        guarded = guarded or keys.ENV_CONFIGMAP_LABEL in fields.as_mapping(meta.get("labels"))
    guarded = guarded or any(name.startswith(keys.ENV_CONFIGMAP_PREFIX) for name in names)
    if not guarded or policy.is_scheduler(request.user):
        return exchange.ALLOW
    if request.operation == "DELETE" and request.user in policy.configmap_deleters:
        return exchange.ALLOW
    if request.operation not in ("CREATE", "UPDATE", "DELETE"):
        return exchange.ALLOW
    name = next((n for n in names if n), "")
    verb = request.operation.lower()
    return exchange.deny(
        "env-configmap-write",
        f'ConfigMap "{name}" is a gpufrac env ConfigMap (name "{keys.ENV_CONFIGMAP_PREFIX}..." or label '
        f"{keys.ENV_CONFIGMAP_LABEL}), which sets a pod's GPU devices and memory limits: only the gpufrac "
        f"scheduler ({policy.scheduler_identity}) may {verb} it, not {exchange.who(request.user)}",
    )
