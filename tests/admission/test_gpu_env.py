"""Which variables are GPU variables, and which `envFrom` prefixes can spell one (issue 11)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufrac.admission import gpu_env

# Names as the apiserver lets `env` and prefixes have them, and keys as ConfigMaps and Secrets may.
NAME_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz0123456789"
KEY_CHARS = NAME_CHARS + "-."
RESERVED = sorted(gpu_env.RESERVED_NAMES) + [f"{p}X" for p in gpu_env.RESERVED_PREFIXES]


@st.composite
def near_reserved(draw: st.DrawFn) -> str:
    """A piece of a reserved name, with a few characters of anything after it."""
    name = draw(st.sampled_from(RESERVED))
    return name[: draw(st.integers(0, len(name)))] + draw(st.text(NAME_CHARS, max_size=3))


@given(
    prefix=near_reserved() | st.text(NAME_CHARS, max_size=8),
    key=near_reserved() | st.text(KEY_CHARS, min_size=1, max_size=8),
)
def test_a_prefix_that_with_any_key_spells_a_gpu_variable_is_caught(prefix: str, key: str) -> None:
    if prefix and gpu_env.is_reserved(prefix + key):
        assert gpu_env.spelled_with_prefix(prefix) is not None, (prefix, key)


@pytest.mark.parametrize(
    ("prefix", "spelled"),
    [
        ("NVIDIA_", "NVIDIA_GPU_MEMORY_LIMIT"),
        ("NVIDIA_VISIBLE_", "NVIDIA_VISIBLE_DEVICES"),
        ("N", "NVIDIA_GPU_MEMORY_LIMIT"),
        ("CUDA_", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
        ("CUDA_MPS", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
        ("CUDA_MPS_X_", "CUDA_MPS_X_..."),
        ("NVIDIA_GPU_MEMORY_", "NVIDIA_GPU_MEMORY_LIMIT"),
        ("NVIDIA_GPU_MEMORY_LIMIT_", "NVIDIA_GPU_MEMORY_LIMIT_..."),
        ("NVIDIA_MIG_", "NVIDIA_MIG_CONFIG_DEVICES"),
    ],
)
def test_prefixes_that_spell_a_gpu_variable(prefix: str, spelled: str) -> None:
    assert gpu_env.spelled_with_prefix(prefix) == spelled


@pytest.mark.parametrize(
    "prefix", ["", "APP_", "nvidia_", "NVIDIA_DRIVER_", "NVIDIA_VISIBLE_DEVICES", "CUDA_HOME"]
)
def test_prefixes_that_spell_none(prefix: str) -> None:
    assert gpu_env.spelled_with_prefix(prefix) is None


def test_only_narrowing_settings_are_allowed() -> None:
    assert not gpu_env.is_reserved("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    assert gpu_env.is_reserved("CUDA_MPS_CLIENT_PRIORITY")
    assert gpu_env.is_narrowing("NVIDIA_VISIBLE_DEVICES", "void")
    for value in ("all", "none", "0", "", None, "VOID"):
        assert not gpu_env.is_narrowing("NVIDIA_VISIBLE_DEVICES", value)
    assert not gpu_env.is_narrowing("CUDA_VISIBLE_DEVICES", "void")
