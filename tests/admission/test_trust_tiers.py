"""Trust tiers: sm-sharing merges the fault domains of a GPU's processes (one MPS server), so only namespaces
an admin put in the trusted tier may ask for it; elsewhere it is refused, or made time-slicing where the
admin chose that, and the pod says so."""

from __future__ import annotations

from typing import Any

from gpufrac import contract
from gpufrac.admission import settings
from gpufrac.contract import keys

from .reviews import N, apply_patch, mutate, pod, validate

SM = {"gpu-fraction": "0.5", f"{N}app.gpu-compute.mode": "sm-sharing"}
REWRITE = settings.Policy(untrusted_sm_sharing=settings.UntrustedSmSharing.TIME_SLICING)


def sm_pod() -> dict[str, Any]:
    return pod(SM)


def test_sm_sharing_is_refused_outside_the_trusted_tier_with_the_fix() -> None:
    decision = validate(sm_pod(), trusted_namespace=False)
    assert not decision.allowed and decision.rule == "untrusted-sm-sharing"
    assert 'namespace "team" is not trusted' in decision.message
    assert f"{settings.TRUST_LABEL}={settings.TRUSTED}" in decision.message
    assert validate(sm_pod(), trusted_namespace=True).allowed


def test_time_slicing_is_allowed_in_either_tier() -> None:
    assert validate(pod({"gpu-fraction": "0.5"}), trusted_namespace=False).allowed


def test_by_default_the_mutation_rewrites_nothing_and_validation_refuses() -> None:
    stored = apply_patch(sm_pod(), mutate(sm_pod(), trusted_namespace=False).patch)
    assert stored["metadata"]["annotations"][f"{N}app.gpu-compute.mode"] == "sm-sharing"
    assert not validate(stored, trusted_namespace=False).allowed


def test_where_the_admin_chose_it_sm_sharing_becomes_time_slicing_and_the_pod_says_so() -> None:
    decision = mutate(sm_pod(), REWRITE, trusted_namespace=False)
    stored = apply_patch(sm_pod(), decision.patch)
    asked = contract.parse_pod(stored)
    assert [share.mode for share in asked.shares] == [contract.ComputeMode.TIME_SLICING]
    note = stored["metadata"]["annotations"][settings.REWRITTEN_ANNOTATION]
    assert "sm-sharing -> time-slicing for app" in note and "namespace team" in note
    # It is then prepared as a time-slicing share: no MPS pipe directory, and validation lets it through.
    assert not stored["spec"].get("volumes")
    assert keys.ENV_CONFIGMAP_ANNOTATION in stored["metadata"]["annotations"]
    assert validate(stored, trusted_namespace=False).allowed


def test_the_trusted_tier_keeps_sm_sharing_whatever_the_policy() -> None:
    stored = apply_patch(sm_pod(), mutate(sm_pod(), REWRITE, trusted_namespace=True).patch)
    assert stored["metadata"]["annotations"][f"{N}app.gpu-compute.mode"] == "sm-sharing"
    assert settings.REWRITTEN_ANNOTATION not in stored["metadata"]["annotations"]


def test_a_tenant_cannot_name_its_own_fault_domain() -> None:
    decision = validate(pod({**SM, keys.FAULT_DOMAIN_ANNOTATION: "other-team"}))
    assert not decision.allowed and decision.rule == "scheduler-owned"
    assert "sm-sharing shares may share its GPUs" in decision.message


def test_a_capped_share_cannot_lift_its_cap_through_env() -> None:
    capped = pod({**SM, keys.container_key("app", keys.COMPUTE_PERCENTAGE): "30"})
    capped["spec"]["containers"][0]["env"] = [{"name": keys.ENV_MPS_THREAD_PERCENTAGE, "value": "100"}]
    decision = validate(capped)
    assert not decision.allowed and decision.rule == "env"
    assert "would lift its share's compute cap" in decision.message
    uncapped = sm_pod()
    uncapped["spec"]["containers"][0]["env"] = [{"name": keys.ENV_MPS_THREAD_PERCENTAGE, "value": "50"}]
    assert validate(uncapped).allowed  # without a cap it only narrows below the daemon's setting


def test_a_bound_pods_fault_domain_cannot_be_changed_by_a_tenant() -> None:
    bound = pod({**SM, keys.FAULT_DOMAIN_ANNOTATION: "team"})
    moved = pod({**SM, keys.FAULT_DOMAIN_ANNOTATION: "other-team"})
    decision = validate(moved, operation="UPDATE", old=bound)
    assert not decision.allowed and decision.rule == "contract-change"
    assert keys.FAULT_DOMAIN_ANNOTATION in decision.message


def test_a_capped_sm_sharing_share_is_left_for_validation_to_refuse_not_rewritten() -> None:
    """Made time-slicing, a share's compute cap breaks the contract (only MPS holds a cap): the mutation
    raised, and the tenant saw an internal error. It leaves the pod as it is, and validation says why."""
    capped = pod({**SM, keys.container_key("app", keys.COMPUTE_PERCENTAGE): "30"})
    decision = mutate(capped, REWRITE, trusted_namespace=False)
    assert decision.allowed and decision.patch == ()
    refused = validate(capped, REWRITE, trusted_namespace=False)
    assert not refused.allowed and refused.rule == "untrusted-sm-sharing"


def test_a_tenant_cannot_name_the_queue_its_bind_recorded() -> None:
    """The queue a bound pod counts in for good (`keys.BOUND_QUEUE_ANNOTATION`) is the scheduler's."""
    decision = validate(pod({**SM, keys.BOUND_QUEUE_ANNOTATION: "other-team"}))
    assert not decision.allowed and decision.rule == "scheduler-owned"
    assert "names the queue the pod counts in" in decision.message
