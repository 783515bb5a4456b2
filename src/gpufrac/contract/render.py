"""Turn a placement into what bind writes: the annotations, and the environment each GPU container gets.

The two outputs say the same thing to the two delivery paths (NVIDIA's operator reads the annotations,
gpufrac's ConfigMap carries the environment), so both come from one `PodPlacement` and cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, overload

from gpufrac.contract import keys
from gpufrac.contract.errors import ContractError
from gpufrac.contract.model import (
    ComputeMode,
    Mebibytes,
    MemoryAmount,
    PodPlacement,
    Portion,
    SharePlacement,
    ShareRequest,
)
from gpufrac.contract.quantity import format_mib

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

# Where the node agent mounts its MPS control pipes inside an sm-sharing container.
DEFAULT_MPS_PIPE_DIRECTORY = "/run/gpufrac/mps"


@overload
def portion_mib(portion: Fraction, gpu_mib: int | Fraction) -> int: ...
@overload
def portion_mib(portion: Fraction, gpu_mib: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]: ...
def portion_mib(
    portion: Fraction, gpu_mib: int | Fraction | npt.NDArray[np.int64]
) -> int | npt.NDArray[np.int64]:
    """floor(p × M): the MiB a portion p of a GPU of M MiB resolves to, the one rounding rule of the contract.

    Rounding down keeps the sum of resolved portions within the GPU. The arithmetic is exact and works on a
    numpy array of GPU sizes too, so the engine's filters resolve a portion on every GPU at once with this
    same rule, and the planner on a reference GPU of a fractional number of MiB.
    """
    return portion.numerator * gpu_mib // portion.denominator


def resolve_memory(amount: MemoryAmount, *, gpu_mib: int, key: str) -> int:
    """The MiB `amount` means on a GPU of `gpu_mib` MiB (`portion_mib` for a portion).

    A portion that rounds to nothing is a `ContractError` on `key` (the annotation it came from) rather
    than a share with no memory.
    """
    match amount:
        case Mebibytes(value):
            return value
        case Portion(value):
            mib = portion_mib(value, gpu_mib)
            if mib < 1:
                raise ContractError(key, str(float(value)), f"resolves to 0 MiB on a GPU of {gpu_mib} MiB")
            return mib


def resolve_share(share: ShareRequest, *, devices: Sequence[str], gpu_mib: int) -> SharePlacement:
    """Put `share` on `devices` (GPU UUIDs, or indices), resolving portions against `gpu_mib`.

    A multi-device share has one request and one limit for all its GPUs, so on GPUs of different sizes pass
    the smallest: the share then fits on each.
    """
    if len(devices) != share.num_devices or len(set(devices)) != len(devices):
        raise ValueError(
            f"the share of {share.container!r} needs {share.num_devices} distinct GPUs, got {devices}"
        )
    return SharePlacement(
        container=share.container,
        devices=tuple(devices),
        request_mib=resolve_memory(share.request, gpu_mib=gpu_mib, key=keys.GPU_FRACTION),
        limit_mib=resolve_memory(share.limit, gpu_mib=gpu_mib, key=keys.GPU_FRACTION_LIMIT),
        mode=share.mode,
        compute_percent=share.compute_percent,
    )


def render_annotations(placement: PodPlacement) -> dict[str, str]:
    """The annotations bind writes: per share container the resolved request and limit as `<n>Mi`, the mode,
    the compute cap where it has one, and the devices; per whole-GPU container the devices it holds
    exclusively."""
    annotations: dict[str, str] = {}
    for share in placement.shares:
        annotations[keys.container_key(share.container, keys.MEMORY_REQUEST)] = format_mib(share.request_mib)
        annotations[keys.container_key(share.container, keys.MEMORY_LIMIT)] = format_mib(share.limit_mib)
        annotations[keys.container_key(share.container, keys.COMPUTE_MODE)] = share.mode.value
        if share.compute_percent is not None:
            key = keys.container_key(share.container, keys.COMPUTE_PERCENTAGE)
            annotations[key] = str(share.compute_percent)
        annotations[keys.container_key(share.container, keys.DEVICES)] = ",".join(share.devices)
    for whole in placement.whole:
        annotations[keys.container_key(whole.container, keys.DEVICES)] = ",".join(whole.devices)
    return annotations


def render_env(
    placement: PodPlacement, *, mps_pipe_directory: str = DEFAULT_MPS_PIPE_DIRECTORY
) -> dict[str, dict[str, str]]:
    """The environment of each GPU container, by container name, as gpufrac's ConfigMap delivers it.

    Memory is integer MiB per GPU. An sm-sharing container also gets the MPS pipe directory and a pinned
    memory limit for each of its GPUs (`<ordinal>=<n>M`, numbered as the container sees them); that is the
    share's limit, since MPS enforces it as a hard ceiling. Its compute cap, if any, becomes MPS's per-client
    active thread percentage, which MPS holds the client's kernels to.
    """
    env: dict[str, dict[str, str]] = {}
    for share in placement.shares:
        variables = {
            keys.ENV_VISIBLE_DEVICES: ",".join(share.devices),
            keys.ENV_MEMORY_REQUEST: str(share.request_mib),
            keys.ENV_MEMORY_LIMIT: str(share.limit_mib),
        }
        if share.mode is ComputeMode.SM_SHARING:
            variables[keys.ENV_MPS_PIPE_DIRECTORY] = mps_pipe_directory
            variables[keys.ENV_MPS_MEMORY_LIMIT] = ",".join(
                f"{ordinal}={share.limit_mib}M" for ordinal in range(len(share.devices))
            )
            if share.compute_percent is not None:
                variables[keys.ENV_MPS_THREAD_PERCENTAGE] = str(share.compute_percent)
        env[share.container] = variables
    for whole in placement.whole:
        env[whole.container] = {keys.ENV_VISIBLE_DEVICES: ",".join(whole.devices)}
    return env
