"""Which keys belong to the contract, and which only the scheduler may write."""

from __future__ import annotations

import pytest

from gpufrac.contract import container_key, is_contract_key, is_scheduler_owned, keys, split_container_key


def test_container_keys_split_at_the_first_dot_after_the_prefix() -> None:
    assert container_key("app", "gpu-memory.request") == "nvidia.com/container.app.gpu-memory.request"
    assert split_container_key("nvidia.com/container.app.gpu-memory.request") == ("app", "gpu-memory.request")
    assert split_container_key("nvidia.com/container.app") == ("app", "")
    assert split_container_key("nvidia.com/gpu") is None
    assert split_container_key("gpu-fraction") is None


def test_gpufrac_s_own_suffixes_are_keyed_under_gpufrac_io() -> None:
    assert container_key("app", keys.COMPUTE_PERCENTAGE) == "gpufrac.io/container.app.compute-percentage"
    assert split_container_key("gpufrac.io/container.app.compute-percentage") == ("app", "compute-percentage")
    assert split_container_key("gpufrac.io/env-configmap") is None


def test_only_nvidia_s_devices_key_grants_gpus() -> None:
    assert keys.is_devices_key("nvidia.com/container.app.gpus.devices")
    assert not keys.is_devices_key("gpufrac.io/container.app.gpus.devices")
    assert not is_scheduler_owned("gpufrac.io/container.app.gpus.devices")


@pytest.mark.parametrize(
    "key",
    ["nvidia.com/container.app.gpus.devices", "nvidia.com/container.trainer-0.gpus.devices"],
)
def test_devices_are_scheduler_owned(key: str) -> None:
    assert is_scheduler_owned(key)
    assert is_contract_key(key)


def test_the_bound_uid_marker_is_scheduler_owned() -> None:
    assert is_scheduler_owned(keys.BOUND_UID_ANNOTATION)


@pytest.mark.parametrize(
    "key",
    [
        # Tenants ask for memory with these; the resolved values share the names, and are guarded by rules.
        "nvidia.com/container.app.gpu-memory.request",
        "nvidia.com/container.app.gpu-memory.limit",
        "nvidia.com/container.app.gpu-compute.mode",
        "gpufrac.io/container.app.compute-percentage",
        "gpu-fraction",
        "gpu-fraction.limit",
        "gpu-memory",
        "gpu-memory.limit",
        "gpu-fraction-num-devices",
        "gpu-fraction-container-name",
    ],
)
def test_tenant_keys_are_contract_keys_but_not_scheduler_owned(key: str) -> None:
    assert is_contract_key(key)
    assert not is_scheduler_owned(key)


@pytest.mark.parametrize(
    "key",
    ["nvidia.com/gpu", "app.kubernetes.io/name", "gpus.devices", "gpu-fractions", "gpufrac.io/env-configmap"],
)
def test_other_keys_are_not_the_contract_s(key: str) -> None:
    assert not is_contract_key(key)
    assert not is_scheduler_owned(key)
