"""The validating webhook's rule for gpufrac's env ConfigMaps: only the scheduler writes them."""

from __future__ import annotations

from typing import Any

import pytest

from .reviews import SCHEDULER, allowed, configmap, denial

IDENTITY = SCHEDULER


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_only_the_scheduler_writes_env_configmaps(operation: str) -> None:
    fields: dict[str, Any] = {
        "operation": operation,
        "resource": "configmaps",
        "name": "gpufrac-env-dddd-app",
    }
    obj = None if operation == "DELETE" else configmap()
    old = None if operation == "CREATE" else configmap()
    verb = operation.lower()
    assert denial(obj, "env-configmap-write", old=old, **fields) == (
        'ConfigMap "gpufrac-env-dddd-app" is a gpufrac env ConfigMap (name "gpufrac-env-..." or label '
        "gpufrac.io/env), which sets a pod's GPU devices and memory limits: only the gpufrac scheduler "
        f'({IDENTITY}) may {verb} it, not "tenant"'
    )
    assert allowed(obj, old=old, user=SCHEDULER, **fields)


def test_the_label_guards_a_configmap_whatever_its_name_and_removing_it_is_an_edit() -> None:
    labelled = configmap("settings", labels={"gpufrac.io/env": "true"})
    assert "may create it" in denial(labelled, "env-configmap-write", resource="configmaps")
    unlabelled = configmap("settings")
    assert "may update it" in denial(
        unlabelled, "env-configmap-write", resource="configmaps", old=labelled, operation="UPDATE"
    )
    generated = configmap("", generateName="gpufrac-env-")
    assert denial(generated, "env-configmap-write", resource="configmaps").startswith(
        'ConfigMap "gpufrac-env-"'
    )


def test_the_garbage_collector_may_delete_env_configmaps_but_not_write_them() -> None:
    gc = "system:serviceaccount:kube-system:generic-garbage-collector"
    fields: dict[str, Any] = {"resource": "configmaps", "user": gc}
    assert allowed(None, operation="DELETE", old=configmap(), name="gpufrac-env-dddd-app", **fields)
    assert 'not "system:serviceaccount:kube-system:generic-garbage-collector"' in denial(
        configmap(), "env-configmap-write", **fields
    )


def test_other_configmaps_are_allowed() -> None:
    assert allowed(configmap("settings"), resource="configmaps")
    assert allowed(
        None, resource="configmaps", operation="DELETE", old=configmap("settings"), name="settings"
    )
