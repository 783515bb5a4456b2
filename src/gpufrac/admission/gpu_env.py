"""The environment variables that grant or bound GPUs, and which routes into a container can set them.

A container must see exactly what gpufrac gives it: the NVIDIA runtime takes the GPUs it exposes from
`NVIDIA_VISIBLE_DEVICES` (and the MIG control devices from `NVIDIA_MIG_*_DEVICES`), and the limits are
variables too. What the kubelet puts in a container's environment, in order, later winning:
- each `envFrom` source, every key as `prefix + key` (a key that then is not a valid name is skipped);
- each `env` entry, literal or `valueFrom`.

So a reserved name can arrive as an `env` name (any source of value), or as `prefix + key` through
`envFrom`. The webhook sees names and prefixes but not the keys of a tenant's ConfigMaps and Secrets (it
has no API access, and they can change after admission), so its rule is: no reserved `env` name, and no
`envFrom` prefix that, followed by some key, spells a reserved name (`NVIDIA_` + `VISIBLE_DEVICES`).
What is left, a tenant source without such a prefix, is closed by the mutation, not here: gpufrac's own
source is the last `envFrom` of each GPU container, so it overrides every variable it sets, and each
container without a GPU gets `NVIDIA_VISIBLE_DEVICES=void` in `env`, which overrides every `envFrom` and
the image's own environment.

Two variables only ever narrow what a container has, and are allowed: `NVIDIA_VISIBLE_DEVICES=void` as a
literal (the runtime then exposes no GPU), and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` from any source, which
MPS applies only below the control daemon's own setting ("if the control daemon has a lower setting, the
control daemon setting will be obeyed", NVIDIA's MPS guide).
"""

from __future__ import annotations

from gpufrac.contract import keys

RESERVED_NAMES = frozenset(
    keys.ENV_KEYS | {"CUDA_VISIBLE_DEVICES", "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES"}
)
RESERVED_PREFIXES = ("NVIDIA_GPU_MEMORY_", "CUDA_MPS_")
NARROWING_NAMES = frozenset({keys.ENV_MPS_THREAD_PERCENTAGE})
# The value of NVIDIA_VISIBLE_DEVICES with which the NVIDIA runtime exposes no GPU (it acts as runc).
NO_GPU = "void"


def is_reserved(name: str) -> bool:
    """Whether a variable of this name could grant GPUs or loosen a limit."""
    return name not in NARROWING_NAMES and (name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES))


def is_narrowing(name: str, value: object) -> bool:
    """Whether an `env` entry with this name and literal `value` only takes GPUs away."""
    return name == keys.ENV_VISIBLE_DEVICES and value == NO_GPU


def spelled_with_prefix(prefix: str) -> str | None:
    """A reserved name that `prefix` followed by some (non-empty) ConfigMap key spells, or None.

    None for an empty prefix: then the names are the keys themselves, which the webhook cannot see.
    """
    if not prefix:
        return None
    for name in sorted(RESERVED_NAMES):
        if name.startswith(prefix) and name != prefix:
            return name
    for reserved in RESERVED_PREFIXES:
        if reserved.startswith(prefix):
            return f"{reserved}..."
        if prefix.startswith(reserved):
            return f"{prefix}..."
    return None
