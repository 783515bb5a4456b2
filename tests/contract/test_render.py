"""Resolving shares onto GPUs, rendering what bind writes, and reading a bound pod back."""

from __future__ import annotations

from fractions import Fraction

import pytest

from gpufrac.contract import (
    DEFAULT_MPS_PIPE_DIRECTORY,
    ComputeMode,
    ContractError,
    Mebibytes,
    PodPlacement,
    Portion,
    SharePlacement,
    ShareRequest,
    WholeGpuPlacement,
    parse_placement,
    render_annotations,
    render_env,
    resolve_memory,
    resolve_share,
)

from .pods import make_pod

N = "nvidia.com/container."


@pytest.mark.parametrize(
    ("portion", "gpu_mib", "mib"),
    [
        (Fraction(1, 4), 81920, 20480),
        (Fraction(1, 3), 81559, 27186),
        (Fraction(1, 1000), 1000, 1),
        (Fraction(1), 7, 7),
    ],
)
def test_a_portion_resolves_to_floor_of_p_times_m(portion: Fraction, gpu_mib: int, mib: int) -> None:
    assert resolve_memory(Portion(portion), gpu_mib=gpu_mib, key="gpu-fraction") == mib


def test_an_absolute_amount_resolves_to_itself_on_any_gpu() -> None:
    assert resolve_memory(Mebibytes(20480), gpu_mib=16384, key="gpu-memory") == 20480


def test_a_portion_that_resolves_to_zero_is_an_error() -> None:
    with pytest.raises(ContractError) as caught:
        resolve_memory(Portion(Fraction(1, 1000)), gpu_mib=999, key="gpu-fraction")
    assert str(caught.value) == 'gpu-fraction="0.001": resolves to 0 MiB on a GPU of 999 MiB'


def test_resolve_share_names_the_key_of_the_request() -> None:
    share = ShareRequest("app", Portion(Fraction(1, 10000)), Portion(Fraction(1, 2)))
    with pytest.raises(ContractError) as caught:
        resolve_share(share, devices=["GPU-0"], gpu_mib=4096)
    assert caught.value.key == "gpu-fraction"


def test_resolve_share() -> None:
    share = ShareRequest("app", Portion(Fraction(1, 4)), Portion(Fraction(1, 2)), ComputeMode.SM_SHARING, 2)
    assert resolve_share(share, devices=["GPU-a", "GPU-b"], gpu_mib=40960) == SharePlacement(
        "app", ("GPU-a", "GPU-b"), 10240, 20480, ComputeMode.SM_SHARING
    )


@pytest.mark.parametrize("devices", [["GPU-a"], ["GPU-a", "GPU-a"], ["GPU-a", "GPU-b", "GPU-c"]])
def test_resolve_share_needs_exactly_num_devices_distinct_gpus(devices: list[str]) -> None:
    share = ShareRequest("app", Mebibytes(1024), Mebibytes(1024), num_devices=2)
    with pytest.raises(ValueError, match="needs 2 distinct GPUs"):
        resolve_share(share, devices=devices, gpu_mib=40960)


PLACEMENT = PodPlacement(
    shares=(
        SharePlacement("infer", ("GPU-a",), 20480, 40960, ComputeMode.TIME_SLICING),
        SharePlacement("embed", ("GPU-b", "GPU-c"), 8192, 8192, ComputeMode.SM_SHARING),
    ),
    whole=(WholeGpuPlacement("train", ("GPU-d", "GPU-e")),),
)


def test_render_annotations() -> None:
    assert render_annotations(PLACEMENT) == {
        f"{N}infer.gpu-memory.request": "20480Mi",
        f"{N}infer.gpu-memory.limit": "40960Mi",
        f"{N}infer.gpu-compute.mode": "time-slicing",
        f"{N}infer.gpus.devices": "GPU-a",
        f"{N}embed.gpu-memory.request": "8192Mi",
        f"{N}embed.gpu-memory.limit": "8192Mi",
        f"{N}embed.gpu-compute.mode": "sm-sharing",
        f"{N}embed.gpus.devices": "GPU-b,GPU-c",
        f"{N}train.gpus.devices": "GPU-d,GPU-e",
    }


def test_render_env() -> None:
    assert render_env(PLACEMENT) == {
        "infer": {
            "NVIDIA_VISIBLE_DEVICES": "GPU-a",
            "NVIDIA_GPU_MEMORY_REQUEST": "20480",
            "NVIDIA_GPU_MEMORY_LIMIT": "40960",
        },
        "embed": {
            "NVIDIA_VISIBLE_DEVICES": "GPU-b,GPU-c",
            "NVIDIA_GPU_MEMORY_REQUEST": "8192",
            "NVIDIA_GPU_MEMORY_LIMIT": "8192",
            "CUDA_MPS_PIPE_DIRECTORY": DEFAULT_MPS_PIPE_DIRECTORY,
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M,1=8192M",
        },
        "train": {"NVIDIA_VISIBLE_DEVICES": "GPU-d,GPU-e"},
    }


def test_render_env_takes_the_node_s_mps_pipe_directory() -> None:
    env = render_env(PLACEMENT, mps_pipe_directory="/var/run/mps")
    assert env["embed"]["CUDA_MPS_PIPE_DIRECTORY"] == "/var/run/mps"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in env["infer"]


def test_an_sm_sharing_limit_pins_the_share_s_limit_not_its_request() -> None:
    placement = PodPlacement(shares=(SharePlacement("a", ("0",), 1024, 4096, ComputeMode.SM_SHARING),))
    assert render_env(placement)["a"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"


def test_parse_placement_reads_back_what_bind_wrote() -> None:
    asked = {
        "gpu-fraction": "0.5",
        "gpu-fraction-container-name": "infer",
        f"{N}embed.gpu-memory.request": "8Gi",
        f"{N}embed.gpu-compute.mode": "sm-sharing",
    }
    placement = PodPlacement(
        shares=(
            SharePlacement("infer", ("GPU-a",), 40779, 40779, ComputeMode.TIME_SLICING),
            SharePlacement("embed", ("GPU-b",), 8192, 8192, ComputeMode.SM_SHARING),
        )
    )
    pod = make_pod({**asked, **render_annotations(placement)}, ["infer", "embed"])
    assert parse_placement(pod) == placement


def test_parse_placement_of_a_whole_gpu_container() -> None:
    placement = PodPlacement(whole=(WholeGpuPlacement("train", ("0", "1")),))
    pod = make_pod(render_annotations(placement), ["train"], limits={"train": 2})
    assert parse_placement(pod) == placement


def test_an_unbound_pod_has_no_placement() -> None:
    assert parse_placement(make_pod({"gpu-fraction": "0.5"})) is None


@pytest.mark.parametrize(
    ("annotations", "limits", "message"),
    [
        (
            {"gpu-fraction": "0.5", f"{N}app.gpus.devices": "GPU-a"},
            {},
            'nvidia.com/container.app.gpu-memory.request="": is missing: a bound share needs the memory the'
            " scheduler resolved",
        ),
        (
            {f"{N}app.gpu-memory.request": "1Gi", f"{N}app.gpus.devices": "GPU-a,GPU-b"},
            {},
            'nvidia.com/container.app.gpus.devices="GPU-a,GPU-b": names 2 GPUs, but the container asks for 1',
        ),
        (
            {f"{N}app.gpus.devices": "GPU-a"},
            {"helper": 1},
            'nvidia.com/container.helper.gpus.devices="": is missing,'
            " but other containers of this pod are bound",
        ),
        (
            {f"{N}app.gpus.devices": "GPU-a"},
            {},
            'nvidia.com/container.app.gpus.devices="GPU-a": container "app" asks for no GPU',
        ),
        (
            {f"{N}app.gpus.devices": "GPU-a,GPU-a"},
            {"app": 2},
            'nvidia.com/container.app.gpus.devices="GPU-a,GPU-a": names the same GPU twice',
        ),
        (
            {f"{N}app.gpus.devices": "GPU-a,"},
            {"app": 2},
            'nvidia.com/container.app.gpus.devices="GPU-a,": must be a comma-separated list of GPU UUIDs or'
            " indices, with no empty entry",
        ),
    ],
)
def test_a_bound_pod_that_disagrees_with_its_request_is_an_error(
    annotations: dict[str, str], limits: dict[str, object], message: str
) -> None:
    with pytest.raises(ContractError) as caught:
        parse_placement(make_pod(annotations, ["app", "helper"], limits=limits))
    assert str(caught.value) == message


CAPPED = PodPlacement(
    shares=(SharePlacement("a", ("GPU-a",), 1024, 4096, ComputeMode.SM_SHARING, compute_percent=30),)
)


def test_a_compute_cap_is_written_under_gpufrac_s_own_key() -> None:
    annotations = render_annotations(CAPPED)
    assert annotations["gpufrac.io/container.a.compute-percentage"] == "30"
    assert not any(key.startswith(N) and "compute-percentage" in key for key in annotations)


def test_a_compute_cap_reaches_the_mps_client_as_its_active_thread_percentage() -> None:
    assert render_env(CAPPED)["a"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"


def test_a_share_without_a_cap_gets_no_thread_percentage_and_no_cap_key() -> None:
    uncapped = PodPlacement(shares=(SharePlacement("a", ("GPU-a",), 1024, 4096, ComputeMode.SM_SHARING),))
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in render_env(uncapped)["a"]
    assert not any("compute-percentage" in key for key in render_annotations(uncapped))


def test_a_capped_share_reads_back_with_its_cap() -> None:
    asked = {
        f"{N}a.gpu-memory.request": "1Gi",
        f"{N}a.gpu-memory.limit": "4Gi",
        f"{N}a.gpu-compute.mode": "sm-sharing",
        "gpufrac.io/container.a.compute-percentage": "30",
    }
    assert parse_placement(make_pod({**asked, **render_annotations(CAPPED)}, ["a"])) == CAPPED
