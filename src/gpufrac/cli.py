"""The `gpufrac` command: one subcommand per job.

Each subcommand lives in the module that owns the job and is imported lazily, so `gpufrac validate` never
pays for matplotlib and a broken optional piece cannot break the others.
"""

from __future__ import annotations

import errno
import os
import re
import sys
from collections.abc import Callable, Sequence
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console

from gpufrac import contract
from gpufrac.admission import settings as admission_settings  # pure, cheap: the webhook's defaults
from gpufrac.contract import memory_resource, node_inventory  # pure, cheap: defaults of agent and webhook
from gpufrac.errors import UserError, one_line
from gpufrac.scheduler.config import DEFAULT_POLICY  # pure, cheap: the scheduler's default policy

try:  # recent Typer carries its own copy of Click
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - older Typer, on Click itself
    from click.exceptions import UsageError  # type: ignore[assignment]

# Where every command that talks to the API server finds its credentials (`kubeapi.client.find_kubeconfig`).
KUBECONFIG_HELP = "Kubeconfig file; default: $KUBECONFIG, in a pod its service account, else ~/.kube/config."

app = typer.Typer(
    name="gpufrac",
    help="Fractional GPUs with enforceable memory boundaries for Kubernetes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
stderr = Console(stderr=True)


@app.callback()
def _commands() -> None:
    """Keeps `gpufrac <command>` a group: without a callback, Typer runs a lone command as the program."""


# What writing the output can fail with, where it goes to a file: the disk or quota full, a file too big, the
# device failing. Nothing else the commands do raises these unhandled (reading is `reading`'s).
OUTPUT_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def one_line_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a UserError into `gpufrac: <message>` on stderr and its exit status, never a traceback; and
    standard output that cannot be written (`> file` on a full disk; `| head` gone) into a failure, not a
    traceback, nor the success a buffered write would otherwise report until its flush at exit."""

    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            try:
                return command(*args, **kwargs)
            finally:
                sys.stdout.flush()
        except BrokenPipeError:  # the reader went (`| head`): nothing more to say, to it or anyone
            _drop_stdout()
            raise typer.Exit(141) from None  # as a shell reports a program a closed pipe stopped
        except OSError as error:
            if error.errno not in OUTPUT_ERRORS:
                raise
            _drop_stdout()
            stderr.print(
                f"gpufrac: cannot write the output ({error.strerror}); free some space or write it elsewhere",
                soft_wrap=True,
            )
            raise typer.Exit(1) from None
        except UserError as error:
            stderr.print(f"gpufrac: {one_line(str(error))}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(error.exit_code) from None
        except KeyboardInterrupt:
            stderr.print("gpufrac: interrupted")
            raise typer.Exit(130) from None

    return wrapper


def _drop_stdout() -> None:
    """Point standard output at /dev/null, so that what is still buffered is not written (and fails
    again, with a traceback) as the interpreter exits."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@app.command()
@one_line_errors
def validate(
    paths: Annotated[
        list[Path], typer.Argument(help="Manifest files, or folders searched for *.yaml and *.yml.")
    ],
    output_format: Annotated[
        Literal["text", "json"], typer.Option("--format", help="text lines or a JSON list.")
    ] = "text",
    strict: Annotated[bool, typer.Option(help="Exit 1 on warnings too.")] = False,
) -> None:
    """Check Kubernetes manifests against the GPU contract: exit 0 clean, 1 on problems, 2 if unreadable."""
    from gpufrac import validate as validation

    raise typer.Exit(validation.run(paths, output_format=output_format, strict=strict))


def _scheduler_name(text: str) -> str:
    """A schedulerName a pod can carry: the API server gives a pod whose schedulerName is empty
    kube-scheduler's, so a scheduler of that name would wait for ever and a webhook write it for nothing."""
    if not text.strip():
        raise typer.BadParameter("empty; name the spec.schedulerName of the pods (default gpufrac)")
    return text


def PortOption(help: str) -> Any:
    """A TCP port option: Click refuses anything outside 0-65535 before the command runs."""
    return typer.Option(min=0, max=65535, help=help)


def _folder(text: str) -> Path:
    """A folder to write a report to. An empty value (an unset variable in a script) would mean this folder,
    a report written where nobody asked for it: refused."""
    if not text.strip():
        raise typer.BadParameter("empty; name the folder for the report (. for this one)")
    return Path(text)


# The options `simulate` and `plan` share, defined once; each command keeps its own defaults.
NodesOption = Annotated[Path | None, typer.Option(help="Node list CSV (openb format); default: bundled.")]
PodsOption = Annotated[Path | None, typer.Option(help="Pod list CSV (openb format); default: bundled.")]
SeedsOption = Annotated[str, typer.Option(help="Seeds: ranges and lists, e.g. 42-51 or 1,5,9.")]
WorkersOption = Annotated[int, typer.Option(help="Worker processes (default: one per CPU).")]
OutOption = Annotated[
    Path | None, typer.Option(parser=_folder, help="Write the results, charts and an HTML report here.")
]
FormatOption = Annotated[Literal["table", "json"], typer.Option("--format")]


@app.command()
@one_line_errors
def simulate(
    nodes: NodesOption = None,
    pods: PodsOption = None,
    traces: Annotated[
        str | None,
        typer.Option(
            help="openb pod lists to replay into one report: all (the paper's 17), or e.g. default,cpu050."
        ),
    ] = None,
    trace_dir: Annotated[
        Path | None,
        typer.Option(
            help="Directory of the openb CSVs that --traces reads; default: bundled (default only)."
        ),
    ] = None,
    tenants: Annotated[
        Path | None,
        typer.Option(
            help="Replay the trace in time as several teams' queues (a TOML file: queues, traffic, gangs, "
            "eviction rules), reporting fair shares, reclaims, evictions and gang waits."
        ),
    ] = None,
    policies: Annotated[
        str | None,
        typer.Option(help="Comma-separated policies (default: all; with --tenants one, default binpack)."),
    ] = None,
    seeds: Annotated[
        str | None,
        typer.Option(
            help="Seeds: ranges and lists, e.g. 42-51 or 1,5,9 (default 42-44; with --tenants one, 42)."
        ),
    ] = None,
    inflation: Annotated[
        float | None, typer.Option(help="Replay until requests reach this × cluster GPUs (default 1.3).")
    ] = None,
    move_budget: Annotated[
        str | None,
        typer.Option(
            help="Defragmentation: pods moved per 100 arrivals to make room or lower fragmentation (shares "
            "and CPU-only pods move); several, e.g. 0,5, compare (default 0)."
        ),
    ] = None,
    whole_gpu_reserve: Annotated[
        str | None,
        typer.Option(
            help="Admission: percent of the cluster's GPUs kept empty for whole-GPU pods, turning away "
            "shares of most of a GPU that would open one; several, e.g. 0,18, compare (default 0)."
        ),
    ] = None,
    workers: WorkersOption = 0,
    out: OutOption = None,
    output_format: FormatOption = "table",
) -> None:
    """Replay a trace through every placement policy, as in the FGD paper (ATC '23), beside an upper bound;
    or, with --tenants, in time as several teams' queues."""
    from gpufrac.sim import simulate as simulation

    simulation.run(
        nodes=nodes,
        pods=pods,
        traces=traces,
        trace_dir=trace_dir,
        tenants=tenants,
        policies=policies,
        seeds=seeds,
        inflation=inflation,
        workers=workers or None,
        out=out,
        output_format=output_format,
        move_budget=move_budget,
        reserve=whole_gpu_reserve,
    )


@app.command()
@one_line_errors
def plan(
    nodes: NodesOption = None,
    pods: PodsOption = None,
    strategies: Annotated[str, typer.Option(help="Comma-separated sharing strategies, or all.")] = "all",
    seeds: SeedsOption = "42",
    price_per_gpu_hour: Annotated[float, typer.Option(help="Price of one GPU for one hour.")] = 2.0,
    gpu_model: Annotated[
        str | None, typer.Option(help="Replace every node's GPUs by this model, e.g. H100-80GB.")
    ] = None,
    reference_gb: Annotated[
        float | None, typer.Option(help="Read each portion as a portion of a GPU of this many GB.")
    ] = None,
    replicas: Annotated[int, typer.Option(help="time-slicing-replicas: replicas per GPU.")] = 4,
    trusted_share: Annotated[float, typer.Option(help="fractions-mixed: portion of pods trusted.")] = 0.5,
    fault_domains: Annotated[
        int, typer.Option(help="fractions-mixed: tenants among the trusted pods, who never share a GPU.")
    ] = 8,
    policy: Annotated[str, typer.Option(help="Engine placement policy.")] = "bestfit",
    timed: Annotated[bool, typer.Option(help="Also replay creation and deletion times.")] = True,
    workers: WorkersOption = 0,
    out: OutOption = None,
    output_format: FormatOption = "table",
) -> None:
    """How many GPUs a workload needs under each sharing strategy, and what that costs."""
    from gpufrac.plan import command as planning

    planning.run(
        nodes=nodes,
        pods=pods,
        strategies=strategies,
        seeds=seeds,
        policy=policy,
        replicas=replicas,
        trusted_share=trusted_share,
        fault_domains=fault_domains,
        price_per_gpu_hour=price_per_gpu_hour,
        gpu_model=gpu_model,
        reference_gb=reference_gb,
        timed=timed,
        workers=workers or None,
        out=out,
        output_format=output_format,
    )


@app.command()
@one_line_errors
def scheduler(
    kubeconfig: Annotated[Path | None, typer.Option(help=KUBECONFIG_HELP)] = None,
    scheduler_name: Annotated[
        str, typer.Option(parser=_scheduler_name, help="Schedule pods with this spec.schedulerName.")
    ] = "gpufrac",
    policy: Annotated[str, typer.Option(help="Placement policy (see `gpufrac simulate`).")] = DEFAULT_POLICY,
    node_selector: Annotated[str, typer.Option(help="Manage only nodes with these labels: k=v,k2=v2.")] = "",
    env_delivery: Annotated[
        contract.EnvDelivery, typer.Option(help="How limits reach the container.")
    ] = contract.EnvDelivery.CONFIGMAP,
    metrics_port: Annotated[int, PortOption("Port for /metrics, /healthz and /readyz.")] = 10260,
    leader_elect: Annotated[
        bool, typer.Option(help="Run several replicas; only the Lease holder binds.")
    ] = False,
    namespace: Annotated[
        str,
        typer.Option(
            help="The scheduler's own namespace: its leader-election Lease and its GPU reservation pods."
        ),
    ] = "gpufrac-system",
    reservation_image: Annotated[
        str, typer.Option(help="Image of the reservation pods that hold shared GPUs from a device plugin.")
    ] = "registry.k8s.io/pause:3.9",
    reservation_idle_seconds: Annotated[
        float,
        typer.Option(help="How long a reservation whose GPU holds no share is kept, 0 to 3600 seconds."),
    ] = 10.0,
    require_ready: Annotated[
        bool,
        typer.Option(help="Place GPU pods only on nodes whose agent set the gpufrac.io/Ready condition."),
    ] = True,
    agent_heartbeat_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds after which a gpufrac.io/Ready condition its agent stopped refreshing counts as "
            "not ready (0: never), 0 to 86400."
        ),
    ] = 300.0,
    fault_domain_label: Annotated[
        str,
        typer.Option(
            help="Namespace label grouping namespaces into one fault domain for sm-sharing (default: each "
            "namespace its own)."
        ),
    ] = "",
    max_moves: Annotated[
        int,
        typer.Option(
            help="Pods evicted at most to make room for one pending pod (moved, preempted or reclaimed), "
            "0 to 10 (0: never evict)."
        ),
    ] = 3,
    min_runtime: Annotated[
        float, typer.Option(help="Seconds a pod runs before the scheduler may evict it, 0 to 86400.")
    ] = 600.0,
    whole_gpu_reserve: Annotated[
        float,
        typer.Option(
            help="Percent of the GPUs kept empty for whole-GPU pods, 0 to 100: a share of 70% of a GPU or "
            "more that would open one of them waits (0: off)."
        ),
    ] = 0.0,
    preemption: Annotated[
        bool,
        typer.Option(
            help="Preempt lower priorities in a pending pod's queue, and reclaim from queues over their fair "
            "share for a queue below its quota (else only pods that opted in are moved)."
        ),
    ] = True,
    protected_priority: Annotated[
        int, typer.Option(help="Pods of this priority or more are never evicted (KAI's non-preemptible).")
    ] = 100,
    queues: Annotated[
        bool,
        typer.Option(
            help="Take pods from the tenant queue furthest below its fair share first (Queue objects, "
            "queues.gpufrac.io: install the chart's CRD)."
        ),
    ] = False,
    gangs: Annotated[
        bool,
        typer.Option(
            help="Bind a pod group's pods together once minMember of them can run (PodGroup objects, "
            "podgroups.gpufrac.io: install the chart's CRD)."
        ),
    ] = False,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Schedule pods that ask for GPU shares: place them with the engine, write the contract, bind."""
    import asyncio

    from gpufrac.placement.framework import POLICIES
    from gpufrac.scheduler import serve
    from gpufrac.scheduler.config import SchedulerConfig

    if policy not in POLICIES:
        raise UserError(f"--policy {policy}: unknown; choose one of {', '.join(POLICIES)}")
    if not 0 <= agent_heartbeat_timeout <= 86400:  # NaN fails both
        raise UserError(f"--agent-heartbeat-timeout {agent_heartbeat_timeout}: must be 0 to 86400 seconds")
    if not 0 <= reservation_idle_seconds <= 3600:  # NaN fails both
        raise UserError(f"--reservation-idle-seconds {reservation_idle_seconds}: must be 0 to 3600")
    if not 0 <= max_moves <= 10:
        raise UserError(f"--max-moves {max_moves}: must be 0 (never evict) to 10")
    if not 0 <= min_runtime <= 86400:  # NaN fails both
        raise UserError(f"--min-runtime {min_runtime}: must be 0 to 86400 seconds")
    if not 0 <= whole_gpu_reserve <= 100:  # NaN fails both
        raise UserError(
            f"--whole-gpu-reserve {whole_gpu_reserve}: must be 0 (off) to 100 percent of the GPUs"
        )
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", namespace):
        raise UserError(f"--namespace {namespace!r}: not a namespace name (lowercase letters, digits, '-')")
    domain_label = fault_domain_label.strip()
    setup_logging(log_level)
    config = SchedulerConfig(
        name=scheduler_name,
        policy=policy,
        node_selector=parse_labels(node_selector, option="--node-selector"),
        env_delivery=env_delivery,
        require_ready=require_ready,
        agent_heartbeat_timeout=agent_heartbeat_timeout,
        namespace=namespace,
        reservation_image=reservation_image,
        reservation_idle_seconds=reservation_idle_seconds,
        fault_domain_label=domain_label and label_key(domain_label, option="--fault-domain-label"),
        max_moves=max_moves,
        min_runtime=min_runtime,
        whole_gpu_reserve=whole_gpu_reserve,
        preemption=preemption,
        protected_priority=protected_priority,
        queues=queues,
        gangs=gangs,
    )
    asyncio.run(
        serve.serve(
            config,
            kubeconfig=kubeconfig,
            metrics_port=metrics_port,
            leader_elect=leader_elect,
        )
    )


@app.command()
@one_line_errors
def top(
    kubeconfig: Annotated[Path | None, typer.Option(help=KUBECONFIG_HELP)] = None,
    output_format: Annotated[Literal["table", "json"], typer.Option("--format")] = "table",
    queues: Annotated[
        bool, typer.Option(help="Show every tenant queue's use and fair share instead of the GPUs.")
    ] = False,
) -> None:
    """Show every GPU: mode, memory requested, limits and free, and its pods; or, --queues, every queue."""
    import asyncio

    from gpufrac.scheduler import top as gpu_top

    rows = asyncio.run(gpu_top.collect(kubeconfig, queues=queues))
    gpu_top.show(rows, output_format=output_format, queues=queues)


@app.command()
@one_line_errors
def report(
    out: Annotated[
        Path, typer.Option(parser=_folder, help="Write report.json, CSV tables, charts and index.html here.")
    ],
    kubeconfig: Annotated[Path | None, typer.Option(help=KUBECONFIG_HELP)] = None,
    metrics: Annotated[
        list[str] | None, typer.Option(help="A node agent's /metrics URL; repeat for each node.")
    ] = None,
    prometheus: Annotated[
        str | None, typer.Option(help="A Prometheus that scrapes the agents (its base URL).")
    ] = None,
) -> None:
    """Compare the GPUs the cluster's pods hold today with what whole GPUs would need: memory requested
    against used per share, bursts and breaches, and who shares each GPU."""
    from gpufrac.report import command as reporting

    reporting.run(kubeconfig=kubeconfig, out=out, metrics=metrics or [], prometheus=prometheus)


def parse_labels(text: str, *, option: str) -> dict[str, str]:
    labels = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise UserError(f'{option} "{text}": expected key=value pairs separated by commas')
        key = label_key(key, option=option)
        if not _LABEL_VALUE.fullmatch(value):
            raise UserError(f"{option}: {value!r} is not a label value (at most 63 {_LABEL_CHARACTERS})")
        labels[key] = value
    return labels


# Kubernetes' label syntax, as the chart's values.schema.json has it: a name, perhaps under a DNS subdomain
# and "/"; a value is a name or empty. A Node or Namespace carries no other, so a selector outside it would
# match nothing, and say nothing.
_LABEL_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]"
_LABEL_KEY = re.compile(rf"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_LABEL_NAME}")
_LABEL_VALUE = re.compile(f"({_LABEL_NAME})?")
_LABEL_CHARACTERS = "letters, digits, '-', '_' and '.', first and last a letter or digit"


def label_key(key: str, *, option: str) -> str:
    """`key`, refused unless a label key (see `_LABEL_KEY`)."""
    if not _LABEL_KEY.fullmatch(key):
        rule = f"[PREFIX/]NAME, the NAME at most 63 {_LABEL_CHARACTERS}"
        raise UserError(f"{option}: {key!r} is not a label key ({rule})")
    return key


# The HTTP client lightkube speaks through, and its transport: quiet below --log-level debug.
HTTP_CLIENT_LOGGERS = ("httpx2", "httpcore2")


def setup_logging(level: str) -> None:
    """One log format for every long-running command, with the level checked before anything starts."""
    import logging

    if level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise UserError(f"--log-level {level}: choose debug, info, warning or error")
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The HTTP client under lightkube logs every request at info, thousands a minute on a busy cluster, which
    # would bury gpufrac's own lines; they stay for --log-level debug.
    if level.upper() != "DEBUG":
        for client in HTTP_CLIENT_LOGGERS:
            logging.getLogger(client).setLevel(logging.WARNING)


# One value for the webhook, which counts fractions in gpufrac.io/gpu-memory, and the agent, which advertises
# each GPU as at least this much of it (`contract.memory_resource`).
# No CUDA context takes more (a few hundred MiB on current GPUs); a larger reserve, a typo, left every GPU
# of the node 1 MiB to share, and said nothing.
MAX_CUDA_CONTEXT_MIB = 16 * 1024
FractionReferenceOption = Annotated[
    int,
    typer.Option(
        min=1,
        max=node_inventory.MAX_GPU_MEMORY_MIB,
        help="MiB of the reference GPU a gpu-fraction counts on in gpufrac.io/gpu-memory: the usable memory "
        "of the largest GPU model.",
    ),
]


@app.command()
@one_line_errors
def agent(
    node_name: Annotated[
        str, typer.Option(envvar="NODE_NAME", help="This node's name (downward API: spec.nodeName).")
    ],
    nvml: Annotated[
        str, typer.Option(help="NVML backend: real, or fake:FILE (a JSON/YAML scenario).")
    ] = "real",
    mode: Annotated[
        Literal["kill", "evict", "report"], typer.Option(help="What the watchdog does about a breach.")
    ] = "kill",
    device_plugin: Annotated[
        Literal["auto", "coexist", "managed", "none"],
        typer.Option(
            help="Who hands out nvidia.com/gpu: coexist (NVIDIA's device plugin), managed (gpufrac's), none; "
            "auto: managed where the Node has nvidia.com/gpu.deploy.device-plugin=false, else coexist."
        ),
    ] = "auto",
    pod_resources_socket: Annotated[Path, typer.Option(help="The kubelet's PodResources API socket.")] = Path(
        "/var/lib/kubelet/pod-resources/kubelet.sock"
    ),
    device_plugin_dir: Annotated[
        Path, typer.Option(help="The kubelet's device-plugin folder (managed mode serves from it).")
    ] = Path("/var/lib/kubelet/device-plugins"),
    cuda_context_mib: Annotated[
        int,
        typer.Option(
            min=0,
            max=MAX_CUDA_CONTEXT_MIB,
            help="MiB of each GPU kept for a CUDA context's own allocations.",
        ),
    ] = 512,
    native_label: Annotated[
        str, typer.Option(help="KEY=VALUE: the Node label that shows NVIDIA's operator enforces limits.")
    ] = f"{node_inventory.NATIVE_LABEL}={node_inventory.NATIVE_LABEL_VALUE}",
    fraction_reference_mib: FractionReferenceOption = memory_resource.DEFAULT_FRACTION_REFERENCE_MIB,
    interval: Annotated[float, typer.Option(help="Seconds between checks.")] = 10.0,
    metrics_port: Annotated[int, PortOption("Port for /metrics; 0 turns it off.")] = 9400,
    once: Annotated[bool, typer.Option(help="Run one check, print a JSON summary, and exit.")] = False,
    kubeconfig: Annotated[Path | None, typer.Option(help=KUBECONFIG_HELP)] = None,
    proc_root: Annotated[Path, typer.Option(help="The host's /proc (the pod runs with hostPID).")] = Path(
        "/proc"
    ),
    mps_control: Annotated[
        str, typer.Option(help="The MPS control program; empty turns MPS off.")
    ] = "nvidia-cuda-mps-control",
    mps_pipe_directory: Annotated[
        Path | None,
        typer.Option(help="The sm-sharing MPS daemon's pipes; default: what sm-sharing pods are given."),
    ] = None,
    mps_log_directory: Annotated[
        Path | None, typer.Option(help="Its logs; default: mps-log beside the pipe directory.")
    ] = None,
    mps_thread_percentage: Annotated[
        int | None, typer.Option(min=1, max=100, help="set_default_active_thread_percentage for the daemon.")
    ] = None,
    mps_pinned_limit_mib: Annotated[
        int | None,
        typer.Option(min=1, help="set_default_device_pinned_mem_limit for clients that set none themselves."),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Run the node agent: GPU inventory, MPS daemons, memory watchdog, /metrics."""
    from gpufrac.node import command
    from gpufrac.node.watchdog import Mode

    setup_logging(log_level)
    raise typer.Exit(
        command.run(
            node_name=node_name,
            nvml_spec=nvml,
            mode=Mode(mode),
            interval=interval,
            metrics_port=metrics_port,
            once=once,
            kubeconfig=kubeconfig,
            proc_root=proc_root,
            mps_control=mps_control,
            mps_pipe_directory=mps_pipe_directory,
            mps_log_directory=mps_log_directory,
            mps_thread_percentage=mps_thread_percentage,
            mps_pinned_limit_mib=mps_pinned_limit_mib,
            device_plugin=device_plugin,
            pod_resources_socket=pod_resources_socket,
            device_plugin_dir=device_plugin_dir,
            cuda_context_mib=cuda_context_mib,
            native_label=native_label,
            fraction_reference_mib=fraction_reference_mib,
        )
    )


@app.command()
@one_line_errors
def webhook(
    tls_cert: Annotated[
        Path | None, typer.Option(help="Serving certificate, PEM; with --generate-certs, written there.")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="Its private key, PEM.")] = None,
    port: Annotated[int, PortOption("HTTPS port; 0 picks a free one and prints it.")] = 8443,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    scheduler_identity: Annotated[
        str, typer.Option(help="The user that alone may write scheduler-owned keys and env ConfigMaps.")
    ] = admission_settings.DEFAULT_SCHEDULER_IDENTITY,
    scheduler_name: Annotated[
        str, typer.Option(parser=_scheduler_name, help="The schedulerName given to share pods.")
    ] = admission_settings.DEFAULT_SCHEDULER_NAME,
    exempt_namespaces: Annotated[
        str, typer.Option(help="Comma-separated namespaces let through unchecked.")
    ] = ",".join(admission_settings.DEFAULT_EXEMPT_NAMESPACES),
    env_delivery: Annotated[
        contract.EnvDelivery,
        typer.Option(
            help="configmap: add each GPU container's env ConfigMap; "
            "annotations-only with a CUDA 13.4 driver and NVIDIA's operator."
        ),
    ] = contract.EnvDelivery.CONFIGMAP,
    mps_host_directory: Annotated[
        str, typer.Option(help="The node's MPS pipe directory, mounted into sm-sharing containers.")
    ] = contract.DEFAULT_MPS_PIPE_DIRECTORY,
    allow_host_paths: Annotated[
        str,
        typer.Option(help="Comma-separated host directories pods may mount (default: none; see README)."),
    ] = "",
    configmap_deleters: Annotated[
        str | None,
        typer.Option(
            help="Users besides the scheduler that may delete env ConfigMaps, comma-separated "
            "(default: the garbage collector and namespace controller)."
        ),
    ] = None,
    untrusted_sm_sharing: Annotated[
        admission_settings.UntrustedSmSharing,
        typer.Option(
            help="sm-sharing asked from a namespace not labelled gpufrac.io/trust=trusted: deny it, or make "
            "it time-slicing."
        ),
    ] = admission_settings.UntrustedSmSharing.DENY,
    fraction_reference_mib: FractionReferenceOption = memory_resource.DEFAULT_FRACTION_REFERENCE_MIB,
    generate_certs: Annotated[
        bool, typer.Option(help="Make a CA and serving certificate, write them, and exit.")
    ] = False,
    hosts: Annotated[
        str, typer.Option(help="--generate-certs: comma-separated DNS names and IPs the certificate is for.")
    ] = "",
    ca_cert: Annotated[Path | None, typer.Option(help="--generate-certs: write the CA here too.")] = None,
    secret: Annotated[
        str, typer.Option(help="--generate-certs: keep them in this TLS Secret, NAMESPACE/NAME, instead.")
    ] = "",
    webhook_configurations: Annotated[
        str,
        typer.Option(
            help="--generate-certs: webhook configurations whose caBundle to set (comma-separated)."
        ),
    ] = "",
    kubeconfig: Annotated[
        Path | None, typer.Option(help=f"For --generate-certs --secret, and --queues. {KUBECONFIG_HELP}")
    ] = None,
    queues: Annotated[
        bool,
        typer.Option(help="Watch Queue objects (queues.gpufrac.io) to check each new one against the rest."),
    ] = False,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Serve the admission webhook over HTTPS: normalize share pods, guard the GPU contract."""

    def names(text: str) -> list[str]:
        return [part.strip() for part in text.split(",") if part.strip()]

    if generate_certs:
        from gpufrac.admission import certs

        certs.run(
            hosts=names(hosts),
            tls_cert=tls_cert,
            tls_key=tls_key,
            ca_cert=ca_cert,
            secret=secret,
            webhook_configurations=names(webhook_configurations),
            kubeconfig=kubeconfig,
        )
        return
    from gpufrac.admission import server

    if tls_cert is None or tls_key is None:
        raise UserError("the webhook serves HTTPS only: pass --tls-cert and --tls-key (or --generate-certs)")
    deleters = (
        admission_settings.DEFAULT_CONFIGMAP_DELETERS
        if configmap_deleters is None
        else names(configmap_deleters)
    )
    policy = admission_settings.Policy(
        scheduler_identity=scheduler_identity,
        scheduler_name=scheduler_name,
        exempt_namespaces=frozenset(names(exempt_namespaces)),
        configmap_deleters=frozenset(deleters),
        env_delivery=env_delivery,
        mps_host_directory=mps_host_directory,
        allowed_host_paths=tuple(names(allow_host_paths)),
        untrusted_sm_sharing=untrusted_sm_sharing,
        fraction_reference_mib=fraction_reference_mib,
    )
    setup_logging(log_level)
    from gpufrac.kubeapi.client import load_config

    queue_config = load_config(kubeconfig) if queues else None
    server.run(policy, tls_cert=tls_cert, tls_key=tls_key, host=host, port=port, queue_config=queue_config)


def main(args: Sequence[str] | None = None) -> None:
    """The `gpufrac` program. A usage error (an unknown flag, a value out of range, a missing argument) is
    one line naming the flag, as a UserError is, instead of Click's boxed usage text; help is as Typer
    shows it."""
    argv = list(sys.argv[1:] if args is None else args)
    if not argv:
        app(prog_name="gpufrac", args=argv)  # no_args_is_help: prints the help and exits
    try:
        code = typer.main.get_command(app).main(args=argv, prog_name="gpufrac", standalone_mode=False)
    except UsageError as error:
        where = error.ctx.command_path if error.ctx is not None else "gpufrac"
        message = " ".join(line.strip() for line in error.format_message().splitlines() if line.strip())
        line = f"gpufrac: {message} (see {where} --help)"
        stderr.print(line, markup=False, highlight=False, soft_wrap=True)
        sys.exit(error.exit_code)
    except typer.Abort:
        stderr.print("gpufrac: aborted")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
