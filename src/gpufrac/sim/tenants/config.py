"""The tenant replay's config file (TOML): the queues, how the trace's pods are dealt to them, gangs, and
the eviction rules.

A queue reads as the `Queue` custom resource does (`contract.queues.parse_queue`: `parentQueue`, `priority`,
and per resource `quota`, `overQuotaWeight`, `limit` with the CRD's units and names), so a config's queues and
a cluster's mean the same; `traffic` is the replay's own: how many of the trace's pods the queue gets,
relative to the others (`tenants.deal`). Anything wrong is a `UserError` naming the file, the field and the
fix, before the replay starts.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpufrac import reading
from gpufrac.contract.errors import ContractError
from gpufrac.contract.queues import QueueSpec, check_tree, parse_queue
from gpufrac.errors import UserError

MAX_CONFIG_BYTES = reading.MIB  # a config lists a few queues: a megabyte is not one
MAX_PHASES = 1000
# Every round of the replay looks at every queue (fair shares, the queue furthest below its share, reclaim),
# so its work is rounds x queues: 256 queues take about 4 minutes on the bundled 8,369-pod trace (26 s on
# its first 1,000 pods, against 2 s for the example's 3), 2,000 took 48 s on 200 pods. Teams, and their
# departments above them, are dozens.
MAX_QUEUES = 256
MAX_GANG_SIZE = 64
MAX_SECONDS = 30 * 86400  # a rule measured in months is a typo
# A Queue's name as the API server takes it (a DNS subdomain) and as pods name it in a label (at most 63
# characters). It is printed in a terminal table, drawn in plots and written in a page, so a name the
# cluster could never hold (markup, a `$`, a newline) is refused here rather than garbling those.
QUEUE_NAME = re.compile(r"[a-z0-9]([-.a-z0-9]{0,61}[a-z0-9])?")

QUEUE_FIELDS = ("name", "parentQueue", "priority", "traffic", "resources")
TABLES = {
    "cluster": ("gpus",),
    "eviction": ("minRuntimeSeconds", "graceSeconds", "maxVictims"),
    "gangs": ("fraction", "size", "scheduleTimeoutSeconds"),
}


@dataclass(frozen=True)
class Gangs:
    """Which pods become gangs: each GPU pod with probability `fraction`, as `size` identical members that
    run all together or not at all; members held longer than `timeout` seconds give their room back."""

    fraction: float = 0.0
    size: int = 2
    timeout: float = 300.0  # the PodGroup's scheduleTimeoutSeconds, and its default


@dataclass(frozen=True)
class Eviction:
    """The scheduler's eviction rules: a pod younger than `min_runtime` seconds is never evicted, an evicted
    pod holds its room `grace` seconds more while it terminates, and one reclaim evicts at most
    `max_victims` pods (a gang's other members go with it beyond that). Defaults: the scheduler's
    `--min-runtime` and `--max-moves`, and Kubernetes' terminationGracePeriodSeconds."""

    min_runtime: float = 600.0
    grace: float = 30.0
    max_victims: int = 3


@dataclass(frozen=True, slots=True)
class TenantsConfig:
    path: Path
    queues: Mapping[str, QueueSpec]  # in the file's order
    traffic: Mapping[str, tuple[float, ...]]  # leaf queues only, one weight per phase, as many phases each
    gangs: Gangs
    eviction: Eviction
    cluster_gpus: int | None  # replay on part of the trace's cluster; None: all of it

    @property
    def leaves(self) -> list[str]:
        """The queues pods join: those no queue names as its parent, in the file's order."""
        return list(self.traffic)


def load(path: Path) -> TenantsConfig:
    text = reading.read_text(path, limit=MAX_CONFIG_BYTES, what="--tenants")
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise UserError(f"--tenants {path}: not valid TOML ({error}); fix the syntax") from None
    except ValueError:  # tomllib's int() refuses an integer of more than 4,300 digits
        raise UserError(f"--tenants {path}: a number with thousands of digits; write it shorter") from None
    except RecursionError:  # tomllib recurses into nested arrays and inline tables
        raise UserError(f"--tenants {path}: arrays or tables nested too deeply; nest a few levels") from None
    return parse(document, path)


def parse(document: Mapping[str, object], path: Path) -> TenantsConfig:
    fields = _Fields(path)
    fields.known(document, "", ("queues", *TABLES))
    tables = {name: fields.table(document.get(name, {}), name) for name in TABLES}
    for name, table in tables.items():
        fields.known(table, f"{name}.", TABLES[name])
    gpus = tables["cluster"].get("gpus")
    cluster_gpus = None if gpus is None else int(fields.number(gpus, "cluster.gpus", 1, 10**7, whole=True))
    eviction = tables["eviction"]
    gangs = tables["gangs"]
    queues, traffic = _queues(fields, document.get("queues"))
    return TenantsConfig(
        path=path,
        queues=queues,
        traffic=traffic,
        gangs=Gangs(
            fraction=fields.option(gangs, "gangs.fraction", Gangs.fraction, 0, 1),
            size=int(fields.option(gangs, "gangs.size", Gangs.size, 2, MAX_GANG_SIZE, whole=True)),
            timeout=fields.option(gangs, "gangs.scheduleTimeoutSeconds", Gangs.timeout, 1, MAX_SECONDS),
        ),
        eviction=Eviction(
            min_runtime=fields.option(
                eviction, "eviction.minRuntimeSeconds", Eviction.min_runtime, 0, MAX_SECONDS
            ),
            grace=fields.option(eviction, "eviction.graceSeconds", Eviction.grace, 0, MAX_SECONDS),
            max_victims=int(
                fields.option(eviction, "eviction.maxVictims", Eviction.max_victims, 1, 10, whole=True)
            ),
        ),
        cluster_gpus=cluster_gpus,
    )


def _queues(fields: _Fields, entries: object) -> tuple[dict[str, QueueSpec], dict[str, tuple[float, ...]]]:
    if not isinstance(entries, list) or not entries:
        raise fields.error("queues", entries, 'needs at least one [[queues]] table with a name = "..."')
    if len(entries) > MAX_QUEUES:
        raise UserError(
            f"--tenants {fields.path}: {len(entries):,} [[queues]] tables, at most {MAX_QUEUES} (every round "
            "of the replay looks at every queue); merge queues, or replay a part of them"
        )
    queues: dict[str, QueueSpec] = {}
    weights: dict[str, object] = {}
    for at, entry in enumerate(entries):
        table = fields.table(entry, f"queues[{at}]")
        name = table.get("name")
        if not isinstance(name, str) or not name:
            raise fields.error(f"queues[{at}].name", name, "each queue needs a name")
        if not QUEUE_NAME.fullmatch(name):
            rule = "not a Queue name: lowercase letters, digits, '-' and '.', at most 63"
            raise fields.error(f"queues[{at}].name", name, rule)
        if name in queues:
            raise fields.error(f"queues.{name}", name, "named twice; give each queue its own name")
        fields.known(table, f"queues.{name}.", QUEUE_FIELDS)
        spec = {key: table[key] for key in ("parentQueue", "priority", "resources") if key in table}
        try:
            queues[name] = parse_queue({"metadata": {"name": name}, "spec": spec})
        except ContractError as error:
            raise fields.contract(name, error) from None
        weights[name] = table.get("traffic")
    try:
        check_tree(queues)
    except ContractError as error:
        raise fields.contract(None, error) from None
    parents = {spec.parent for spec in queues.values() if spec.parent is not None}
    for name in parents & weights.keys():
        if weights[name] is not None:
            raise fields.error(f"queues.{name}.traffic", weights[name], "pods join leaf queues only; drop it")
    traffic = {
        name: fields.weights(weight, f"queues.{name}.traffic")
        for name, weight in weights.items()
        if name not in parents
    }
    phases = {len(weight) for weight in traffic.values()} - {1}
    if len(phases) > 1:
        raise fields.error("queues.*.traffic", sorted(phases), "lists of weights must all be as long")
    count = phases.pop() if phases else 1
    traffic = {name: weight * count if len(weight) == 1 else weight for name, weight in traffic.items()}
    for phase in range(count):
        if not any(weight[phase] > 0 for weight in traffic.values()):
            raise fields.error("queues.*.traffic", phase, "in this phase no queue gets pods; raise a weight")
    return queues, traffic


@dataclass(frozen=True, slots=True)
class _Fields:
    """Reads fields of one file, each error naming the file and the field."""

    path: Path

    def error(self, field: str, value: object, rule: str) -> UserError:
        return UserError(f"--tenants {self.path}: {field} = {value!r}: {rule}")

    def contract(self, queue: str | None, error: ContractError) -> UserError:
        """A queue's `ContractError`, its CRD field path (`spec.resources.gpus.quota`) read as the file's."""
        field = error.key.removeprefix("spec.")
        where = f"queues.{queue}.{field}" if queue else f"queues: {field}"
        return UserError(f"--tenants {self.path}: {where} = {error.value!r}: {error.rule}")

    def table(self, value: object, field: str) -> Mapping[str, object]:
        if not isinstance(value, Mapping):
            raise self.error(field, value, f"must be a table, such as [{field}]")
        return value

    def known(self, table: Mapping[str, object], prefix: str, names: tuple[str, ...]) -> None:
        for key in table:
            if key not in names:
                raise self.error(f"{prefix}{key}", table[key], f"unknown field; known: {', '.join(names)}")

    def number(self, value: object, field: str, low: float, high: float, *, whole: bool = False) -> float:
        kind = "a whole number" if whole else "a number"
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or (whole and not isinstance(value, int))
            or not math.isfinite(value)
            or not low <= value <= high
        ):
            raise self.error(field, value, f"must be {kind} from {low:g} to {high:g}")
        return float(value)

    def option(
        self, table: Mapping[str, object], field: str, default: float, low: float, high: float, **kind: bool
    ) -> float:
        key = field.rpartition(".")[2]
        return default if key not in table else self.number(table[key], field, low, high, **kind)

    def weights(self, value: object, field: str) -> tuple[float, ...]:
        """`traffic`: one weight, or one per phase; 1 when left out."""
        if value is None:
            return (1.0,)
        items = value if isinstance(value, list) else [value]
        if not 1 <= len(items) <= MAX_PHASES:
            raise self.error(field, value, f"give one weight, or a list of 1 to {MAX_PHASES} (one per phase)")
        return tuple(self.number(item, field, 0, 1e6) for item in items)
