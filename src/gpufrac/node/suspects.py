"""When a GPU process without a contract has waited long enough to be acted on.

The wait is for the kubelet: a container that just started may run before the kubelet reports its ID in
the pod's status, and until then its processes look like processes in no pod. So a process in no pod on the
node is acted on only once its container (or, for processes in no container, the host) has been seen
running one in `SEEN` of the last `WINDOW` intervals. One in a container a pod's status names waits for
nothing: its contract is known, and a wait would let a tenant run one interval in `WINDOW` for ever.

What waits is the container, not the process nor the GPU: the kubelet's delay does not change with either,
and a wait per process or per GPU would let a tenant run without a contract for ever by starting a new
process, or moving to another GPU, each interval. Nor does one interval without it reset the wait, or a
tenant could run every other interval.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufrac.node.watchdog import Finding, Kind

WINDOW = 3
SEEN = 2
HOST = "-"  # what waits for processes in no container


def waits(finding: Finding) -> bool:
    """Whether `finding` waits before it is acted on: a process without a contract in no pod on the node."""
    return finding.kind is Kind.NO_CONTRACT and finding.container is None


def key(finding: Finding) -> str:
    """What waits for `finding`: its processes' container, or `HOST`."""
    return ",".join(sorted({process.container_id or HOST for process in finding.processes}))


class Suspects:
    """The containers seen running GPU processes without a contract in the last `WINDOW` intervals."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}  # key -> one bit per interval it was seen in, the newest lowest

    def ready(self, keys: Iterable[str]) -> set[str]:
        """Record one interval's keys; those among them seen in `SEEN` of the last `WINDOW` intervals.
        Keys not seen for `WINDOW` intervals are forgotten, so the memory stays bounded."""
        now = set(keys)
        window = (1 << WINDOW) - 1
        seen = {k: ((self._seen.get(k, 0) << 1) | (k in now)) & window for k in now | self._seen.keys()}
        self._seen = {k: bits for k, bits in seen.items() if bits}
        return {k for k in now if seen[k].bit_count() >= SEEN}
