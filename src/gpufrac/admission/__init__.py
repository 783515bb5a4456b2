"""The admission webhook: an AdmissionReview in, its response out, for pods, env ConfigMaps and Queues.

Where to look:
- `exchange`: the review read into a shape-checked `Request`; the `Decision`; the reply.
- `mutation`: `/mutate`, which hands share pods to gpufrac and prepares their env delivery.
- `pod_guards`, `configmap_guards`: `/validate`, the contract and the guards of the threat model;
  `queue_guards`: `/validate` for Queue objects and the tree they make;
  `gpu_env` (which variables grant GPUs, and which `envFrom` prefixes spell them) and `host_paths`
  (canonical host paths, and which reach the MPS pipes) are their vocabulary.
- `settings`: the `Policy` the `gpufrac webhook` flags build, and its defaults.
- `shapes`: checking and reading objects that may not be shaped as the API promises.
- `server`: the HTTPS server; `certs`: its TLS certificate.

All but `server` and `certs` are pure: the server decides nothing; it passes the body's bytes to
`exchange.read_review`, the request to `decide`, and sends back `exchange.review_response`, so every rule
is unit-tested without a server or a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpufrac.admission import configmap_guards, exchange, mutation, pod_guards, queue_guards, settings
from gpufrac.contract import queues as queue_contract
from gpufrac.contract.queues import QueueSpec


def decide(
    request: exchange.Request,
    *,
    endpoint: str,
    policy: settings.Policy,
    configmap_name: str,
    trusted_namespace: bool,
    queues: Mapping[str, QueueSpec] | None = None,
) -> exchange.Decision:
    """The decision at `endpoint`: "mutate" (which never denies) or "validate"; `trusted_namespace`: the
    request's namespace is in the trusted tier (`settings.TRUST_LABEL`)."""
    if endpoint == "mutate":
        return mutation.mutate(
            request, policy, configmap_name=configmap_name, trusted_namespace=trusted_namespace
        )
    return validate(request, policy, trusted_namespace=trusted_namespace, queues=queues)


# Queue reviews as the API server names their resource: with its group, as `exchange.read_review` keeps it.
QUEUES = f"queues.{queue_contract.GROUP}"


def validate(
    request: exchange.Request,
    policy: settings.Policy,
    *,
    trusted_namespace: bool,
    queues: Mapping[str, QueueSpec] | None = None,
) -> exchange.Decision:
    """Allowed, or denied with the first rule broken, by the rules for the object's kind.

    A guarded review without the object its operation must carry (the new one for CREATE and UPDATE, the
    old one for UPDATE and DELETE) is denied: the webhook fails closed rather than judge nothing.
    """
    if request.namespace in policy.exempt_namespaces:
        return exchange.ALLOW
    pods = request.resource in ("pods", pod_guards.BINDINGS)
    guarded = pods or (request.resource == "configmaps" and not request.sub_resource)
    if guarded and (missing := exchange.missing_object(request)):
        return exchange.malformed(exchange.MalformedReview(f'"request.{missing}" is missing', request.uid))
    if request.resource == "configmaps" and not request.sub_resource:
        return configmap_guards.validate(request, policy)
    if pods:
        return pod_guards.validate(request, policy, trusted_namespace=trusted_namespace, queues=queues)
    if request.resource == QUEUES:  # `known` queues: the server's watch of them, when it runs one
        return queue_guards.validate(request, queues or {})
    return exchange.ALLOW
