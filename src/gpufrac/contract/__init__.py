"""The annotation contract: keys, Kubernetes quantities, parsing pods into requests, rendering placements.

Pure: no I/O, so the webhook, the scheduler, the simulator and `gpufrac validate` share one reading of it.
Callers import this package and use the names below; the submodules are its layout, not its interface.
"""

from gpufrac.contract.errors import ContractError
from gpufrac.contract.keys import (
    EnvDelivery,
    container_key,
    is_contract_key,
    is_scheduler_owned,
    split_container_key,
)
from gpufrac.contract.model import (
    FULL_COMPUTE,
    ComputeMode,
    Mebibytes,
    MemoryAmount,
    PodGpuRequest,
    PodPlacement,
    Portion,
    SharePlacement,
    ShareRequest,
    WholeGpuPlacement,
    WholeGpuRequest,
)
from gpufrac.contract.mps_directory import check_mps_directory
from gpufrac.contract.parse import granted_to_another, kai_share_container, parse_placement, parse_pod
from gpufrac.contract.quantity import format_mib, kai_memory_mib, parse_decimal, parse_quantity, quantity_mib
from gpufrac.contract.render import (
    DEFAULT_MPS_PIPE_DIRECTORY,
    portion_mib,
    render_annotations,
    render_env,
    resolve_memory,
    resolve_share,
)

__all__ = [
    "DEFAULT_MPS_PIPE_DIRECTORY",
    "FULL_COMPUTE",
    "ComputeMode",
    "ContractError",
    "EnvDelivery",
    "Mebibytes",
    "MemoryAmount",
    "PodGpuRequest",
    "PodPlacement",
    "Portion",
    "SharePlacement",
    "ShareRequest",
    "WholeGpuPlacement",
    "WholeGpuRequest",
    "check_mps_directory",
    "container_key",
    "format_mib",
    "granted_to_another",
    "is_contract_key",
    "is_scheduler_owned",
    "kai_memory_mib",
    "kai_share_container",
    "parse_decimal",
    "parse_placement",
    "parse_pod",
    "parse_quantity",
    "portion_mib",
    "quantity_mib",
    "render_annotations",
    "render_env",
    "resolve_memory",
    "resolve_share",
    "split_container_key",
]
