"""Running many independent replays: in this process, or in a pool of worker processes.

The data every job reads (a trace, prepared inputs) is sent to each worker once, when it starts, instead of
with every job; results come back in the order the jobs were given, so reports do not depend on timing.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

from gpufrac.errors import UserError

S = TypeVar("S")
J = TypeVar("J")
R = TypeVar("R")

_shared: Any = None
_work: Callable[[Any, Any], Any] | None = None


def _install(shared: Any, work: Callable[[Any, Any], Any]) -> None:
    global _shared, _work
    _shared, _work = shared, work
    _keep_out_of_collections()


def _keep_out_of_collections() -> None:
    """Let the garbage collector's full collections skip every object alive now: the shared data (every
    trace of a sweep, some 400,000 objects) lives as long as the jobs, and walking it again at each full
    collection took 5% of a sweep's time."""
    gc.freeze()


def _call(job: Any) -> Any:
    assert _work is not None
    return _work(_shared, job)


# Workers allowed beyond the CPUs, so that a script written for a small machine (`--workers 2`) runs on a
# smaller one. Past the CPUs a worker only waits: each is a process holding its own copy of the traces (a
# few hundred MB at openb's size), so thousands of them would exhaust memory, not finish sooner.
MIN_WORKER_LIMIT = 8


def worker_limit() -> int:
    """The most `--workers` allowed here: one per CPU this process may run on, and at least
    `MIN_WORKER_LIMIT`."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        cpus = os.cpu_count() or 1
    return max(cpus, MIN_WORKER_LIMIT)


def check_workers(requested: int | None) -> None:
    """Refuse a bad `--workers` before any long work starts; None asks for one per CPU."""
    if requested is not None and requested < 1:
        raise UserError(f"--workers {requested}: must be at least 1")
    if requested is not None and requested > (limit := worker_limit()):
        raise UserError(
            f"--workers {requested}: at most {limit} here (one per CPU, at least {MIN_WORKER_LIMIT}); more "
            "only wait for a CPU and each holds its own copy of the trace: give fewer, or leave it out for "
            "one per CPU"
        )


def worker_count(requested: int | None, jobs: int) -> int:
    """One per CPU unless told otherwise, never more than there are jobs, at least one."""
    return max(1, min(requested or os.cpu_count() or 1, jobs))


def run_jobs(
    shared: S, work: Callable[[S, J], R], jobs: Sequence[J], *, workers: int | None
) -> Iterator[tuple[J, R]]:
    """`work(shared, job)` for every job, yielded with its job as each finishes in turn.

    `work` must be a module-level function, so that worker processes can import it.
    """
    count = worker_count(workers, len(jobs))
    if count == 1:
        _keep_out_of_collections()
        try:
            for job in jobs:
                yield job, work(shared, job)
        finally:
            gc.unfreeze()
        return
    with ProcessPoolExecutor(count, initializer=_install, initargs=(shared, work)) as pool:
        futures = [pool.submit(_call, job) for job in jobs]
        for job, future in zip(jobs, futures, strict=True):
            yield job, future.result()
