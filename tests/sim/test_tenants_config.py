"""The tenant replay's config file: a good one read whole, and every kind of mistake a one-line `UserError`
naming the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufrac.contract.queues import Entitlement, Resource
from gpufrac.errors import UserError
from gpufrac.sim.tenants import config

GOOD = """
[cluster]
gpus = 8

[eviction]
minRuntimeSeconds = 60
graceSeconds = 5
maxVictims = 2

[gangs]
fraction = 0.1
size = 3
scheduleTimeoutSeconds = 120

[[queues]]
name = "org"
resources.gpus = {quota = 6}
resources.gpuMemory = {quota = "64000Mi"}

[[queues]]
name = "prod"
parentQueue = "org"
traffic = [1, 3]
resources.gpus = {quota = 4, overQuotaWeight = 2, limit = 6}
resources.gpuMemory = {quota = "32000Mi"}

[[queues]]
name = "batch"
traffic = 2
priority = 50
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tenants.toml"
    path.write_text(text)
    return path


def test_a_good_file_is_read_whole(tmp_path: Path) -> None:
    read = config.load(write(tmp_path, GOOD))
    assert read.cluster_gpus == 8
    assert read.eviction == config.Eviction(min_runtime=60, grace=5, max_victims=2)
    assert read.gangs == config.Gangs(fraction=0.1, size=3, timeout=120)
    assert list(read.queues) == ["org", "prod", "batch"]
    assert read.queues["prod"].parent == "org"
    assert read.queues["prod"].entitlement(Resource.GPUS) == Entitlement(4, 2.0, 6)
    assert read.queues["prod"].entitlement(Resource.GPU_MEMORY).quota == 32000  # MiB, as the CRD reads it
    assert read.leaves == ["prod", "batch"]  # pods join leaves only
    assert (read.queues["batch"].priority, read.queues["prod"].priority) == (50, 100)  # 100: KAI's default
    assert read.traffic == {"prod": (1.0, 3.0), "batch": (2.0, 2.0)}  # one weight serves every phase


def test_as_many_queues_as_allowed_are_read(tmp_path: Path) -> None:
    text = "".join(f'[[queues]]\nname = "q{i}"\n' for i in range(config.MAX_QUEUES))
    assert len(config.load(write(tmp_path, text)).leaves) == config.MAX_QUEUES


def test_defaults_for_everything_but_the_queues(tmp_path: Path) -> None:
    read = config.load(write(tmp_path, '[[queues]]\nname = "a"\n'))
    assert (read.cluster_gpus, read.eviction, read.gangs) == (None, config.Eviction(), config.Gangs())
    assert read.eviction == config.Eviction(min_runtime=600, grace=30, max_victims=3)
    assert read.traffic == {"a": (1.0,)}


MISTAKES = {
    # name: (file text, fragments the message must hold)
    "bad TOML": ("[[queues]\nname = 1", ["not valid TOML", "fix the syntax"]),
    "no queues": ("[cluster]\ngpus = 4\n", ["queues = None", "at least one [[queues]]"]),
    "unknown top-level table": ('[cluter]\ngpus = 4\n[[queues]]\nname = "a"\n', ["cluter", "unknown field"]),
    "unknown queue field": ('[[queues]]\nname = "a"\nquota = 4\n', ["queues.a.quota", "known: name"]),
    "negative quota": (
        '[[queues]]\nname = "a"\nresources.gpus = {quota = -1}\n',
        ["queues.a.resources.gpus.quota", "must be 0 or more"],
    ),
    "unknown resource field": (
        '[[queues]]\nname = "a"\nresources.gpus = {quote = 1}\n',
        ["queues.a.resources.gpus.quote", "unknown field"],
    ),
    "unknown parent": (
        '[[queues]]\nname = "a"\nparentQueue = "lab"\n',
        ["parentQueue = 'lab'", "queue a: no such Queue"],
    ),
    "children promised more than the parent": (
        '[[queues]]\nname = "p"\n[[queues]]\nname = "a"\nparentQueue = "p"\nresources.gpus = {quota = 1}\n',
        ["queues: resources.gpus.quota", "queue p's children are promised more than its quota (0)"],
    ),
    "a queue twice": ('[[queues]]\nname = "a"\n[[queues]]\nname = "a"\n', ["queues.a", "named twice"]),
    "traffic on a parent": (
        '[[queues]]\nname = "p"\ntraffic = 1\n[[queues]]\nname = "a"\nparentQueue = "p"\n',
        ["queues.p.traffic", "leaf queues only"],
    ),
    "negative traffic": ('[[queues]]\nname = "a"\ntraffic = -1\n', ["queues.a.traffic", "from 0"]),
    "phases of different lengths": (
        '[[queues]]\nname = "a"\ntraffic = [1, 2]\n[[queues]]\nname = "b"\ntraffic = [1, 2, 3]\n',
        ["queues.*.traffic", "as long"],
    ),
    "a phase with no traffic": (
        '[[queues]]\nname = "a"\ntraffic = [1, 0]\n[[queues]]\nname = "b"\ntraffic = [1, 0]\n',
        ["queues.*.traffic = 1", "no queue gets pods"],
    ),
    "a gang of one": ('[gangs]\nsize = 1\n[[queues]]\nname = "a"\n', ["gangs.size = 1", "from 2 to 64"]),
    "a fraction over 1": ('[gangs]\nfraction = 1.5\n[[queues]]\nname = "a"\n', ["gangs.fraction"]),
    "a negative grace": (
        '[eviction]\ngraceSeconds = -1\n[[queues]]\nname = "a"\n',
        ["eviction.graceSeconds"],
    ),
    "fractional GPUs": ('[cluster]\ngpus = 2.5\n[[queues]]\nname = "a"\n', ["cluster.gpus", "whole number"]),
    # Names a Queue cannot have, which would be read as markup by the table or as TeX by the plots.
    "markup in a name": ('[[queues]]\nname = "[/b]"\n', ["queues[0].name = '[/b]'", "not a Queue name"]),
    "TeX in a name": ('[[queues]]\nname = "$\\\\x$"\n', ["queues[0].name", "not a Queue name"]),
    "a newline in a name": ('[[queues]]\nname = "a\\nb"\n', ["queues[0].name = 'a\\nb'", "not a Queue name"]),
    "a name too long": (f'[[queues]]\nname = "{"a" * 64}"\n', ["queues[0].name", "at most 63"]),
    # Every round of the replay looks at every queue: 2,000 of them ran 48 s on 200 pods.
    "thousands of queues": (
        "".join(f'[[queues]]\nname = "q{i}"\n' for i in range(2000)),
        ["2,000 [[queues]] tables, at most 256", "merge queues"],
    ),
    "nested too deeply": ("x = " + "[" * 10_000 + "]" * 10_000 + "\n", ["nested too deeply"]),
    "an integer of 5,000 digits": (
        '[[queues]]\nname = "a"\ntraffic = ' + "9" * 5000 + "\n",
        ["thousands of digits", "write it shorter"],
    ),
}


@pytest.mark.parametrize("text, fragments", MISTAKES.values(), ids=MISTAKES.keys())
def test_each_mistake_is_one_line_naming_the_file_and_the_field(
    tmp_path: Path, text: str, fragments: list[str]
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(UserError) as raised:
        config.load(path)
    message = str(raised.value)
    assert message.startswith(f"--tenants {path}: ") and "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"--tenants .*nowhere\.toml: no such file"):
        config.load(tmp_path / "nowhere.toml")
