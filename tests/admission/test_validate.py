"""Which reviews the validating webhook checks at all: exempt namespaces and other resources pass."""

from __future__ import annotations

from gpufrac.admission import settings

from .reviews import allowed, configmap, denial, pod, validate

N = "nvidia.com/container."


def test_exempt_namespaces_and_other_resources_are_let_through() -> None:
    forged = pod({f"{N}app.gpus.devices": "GPU-1"})
    assert allowed(forged, namespace="kube-system")
    assert allowed(configmap(), resource="configmaps", namespace="gpufrac-system")
    assert allowed(forged, resource="deployments")
    assert allowed(forged, resource="pods.apps")
    assert allowed(forged, operation="DELETE", old=forged)
    assert allowed(forged, sub_resource="status", operation="UPDATE", old=forged)
    assert not validate(
        forged, settings.Policy(exempt_namespaces=frozenset()), namespace="kube-system"
    ).allowed


def test_an_anonymous_user_is_named_as_such() -> None:
    assert "an anonymous user may not set it" in denial(
        pod({f"{N}app.gpus.devices": "GPU-1"}), "scheduler-owned", user=""
    )
