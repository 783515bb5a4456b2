"""Building an async lightkube client, with the one-line errors a person can act on.

A missing or broken kubeconfig, and a missing in-cluster service account, become `UserError`s that name
the file and the fix; this is the only place that knows how gpufrac finds its credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx2
import lightkube
from lightkube.core.exceptions import ConfigError, NotReadyError
from lightkube.resources.core_v1 import Node, Pod

from gpufrac import reading
from gpufrac.errors import UserError

R = TypeVar("R")

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_KUBECONFIG_BYTES = 4 * reading.MIB  # a kubeconfig with certificates inline for a hundred clusters


def load_config(kubeconfig: Path | None) -> lightkube.KubeConfig:
    """The kubeconfig `find_kubeconfig` finds (its files merged as kubectl merges them), or the pod's
    in-cluster service account; either way one whose current context names a cluster, so that a broken
    file is one line here, not a traceback in the first request."""
    found = find_kubeconfig(kubeconfig)
    source = str(SERVICE_ACCOUNT_DIR)
    try:
        if found is not None:
            paths, what = found
            source = f"{what} {os.pathsep.join(map(str, paths))}".strip()
            data, named = merge_kubeconfigs([(path, _read_kubeconfig(path, what)) for path in paths])
            config = lightkube.KubeConfig.from_dict(data, fname=named)
        else:
            config = lightkube.KubeConfig.from_service_account(SERVICE_ACCOUNT_DIR)
        if config.current_context is None:
            raise UserError(f"{source}: no current-context; pick one with `kubectl config use-context NAME`")
        _check_context(config.get(), source)
    except KeyError as error:
        raise UserError(f"{source}: its context names {error}, which it does not define; fix it") from None
    except (ConfigError, OSError, ValueError, TypeError, AttributeError) as error:
        raise UserError(f"{source}: not a usable kubeconfig ({error}); fix or replace it") from None
    return config


def _read_kubeconfig(path: Path, what: str) -> dict[str, Any]:
    source = f"{what} {path}".strip()
    if not path.exists():
        raise UserError(f"{source}: no such file; pass a readable kubeconfig")
    text = reading.read_text(path, limit=MAX_KUBECONFIG_BYTES, what=what)
    try:
        data = reading.load_yaml(text, name=source)
    except UserError as error:
        raise UserError(f"{error}; not a usable kubeconfig: fix or replace it") from None
    if not isinstance(data, dict):
        raise UserError(f"{source}: not a kubeconfig (expected a mapping with clusters and contexts)")
    return data


# The entries a kubeconfig defines by name, and the fields of each that name a file: kubectl reads those
# relative to the folder of the file that defines the entry, and so does `merge_kubeconfigs`.
_ENTRIES = {
    "clusters": ("cluster", ("certificate-authority",)),
    "contexts": ("context", ()),
    "users": ("user", ("client-certificate", "client-key", "tokenFile")),
}


def merge_kubeconfigs(files: list[tuple[Path, dict[str, Any]]]) -> tuple[dict[str, Any], Path]:
    """Several kubeconfig files as one, by kubectl's rules: the first file to define a cluster, context or
    user of a name, or to set current-context, wins; each file's relative paths are relative to its own
    folder. Also the file to name when the server cannot be reached: the one that defines the current
    context's cluster (else the first)."""
    merged: dict[str, Any] = {kind: [] for kind in _ENTRIES}
    defined_in: dict[tuple[str, Any], Path] = {}
    for path, data in files:
        for kind, entries in merged.items():
            listed = data.get(kind) or []
            if not isinstance(listed, list) or not all(
                isinstance(entry, dict) and isinstance(entry.get("name"), str) for entry in listed
            ):
                raise UserError(f"{path}: its {kind} are not a list of mappings each with a name; fix it")
            for entry in listed:
                if (kind, entry.get("name")) not in defined_in:
                    defined_in[kind, entry.get("name")] = path
                    entries.append(_with_paths_resolved(kind, entry, path.absolute().parent))
    current = next((data["current-context"] for _, data in files if data.get("current-context")), None)
    if current is not None:
        merged["current-context"] = current
    context = next(
        (entry.get("context") for entry in merged["contexts"] if entry.get("name") == current), None
    )
    cluster = context.get("cluster") if isinstance(context, dict) else None
    return merged, defined_in.get(("clusters", cluster), files[0][0])


def _with_paths_resolved(kind: str, entry: dict[str, Any], folder: Path) -> dict[str, Any]:
    """`entry` with its relative file paths made absolute, from `folder`; an exec plugin's command too
    where it has a folder in it (a bare name is looked up on PATH)."""
    field, path_fields = _ENTRIES[kind]
    body = entry.get(field)
    if not isinstance(body, dict):
        return entry
    body = dict(body)
    for name in path_fields:
        if isinstance(body.get(name), str) and body[name]:
            body[name] = str(folder / body[name])  # an absolute path stays as it is
    plugin = body.get("exec")
    if isinstance(plugin, dict) and isinstance(plugin.get("command"), str) and "/" in plugin["command"]:
        body["exec"] = plugin | {"command": str(folder / plugin["command"])}
    return entry | {field: body}


def find_kubeconfig(given: Path | None) -> tuple[list[Path], str] | None:
    """The kubeconfig files to read, and what errors call them (`--kubeconfig`, `$KUBECONFIG`, or "" for the
    home directory's), found as kubectl finds them: `--kubeconfig`, else every file of `$KUBECONFIG` that
    exists (`merge_kubeconfigs` makes them one), else, in a pod, none (its service account is used), else
    `~/.kube/config`. A person at a terminal then needs no flag, and a component in a pod still takes its
    own service account's rights, not those of a file someone left in its image."""
    if given is not None:
        return [given], "--kubeconfig"
    listed = [Path(part) for part in os.environ.get("KUBECONFIG", "").split(os.pathsep) if part]
    if listed:
        existing = [path for path in listed if _there(path, "$KUBECONFIG")]
        if existing:
            return existing, "$KUBECONFIG"
        raise UserError(
            f"$KUBECONFIG names {os.pathsep.join(map(str, listed))}, and none of it exists; fix it or pass "
            "--kubeconfig PATH"
        )
    if _there(SERVICE_ACCOUNT_DIR, "the service account folder", folder=True):
        return None
    with contextlib.suppress(RuntimeError):  # no home directory to look in
        home = Path.home() / ".kube" / "config"
        if _there(home, ""):
            return [home], ""
    raise UserError(
        "no kubeconfig: no --kubeconfig given, $KUBECONFIG unset, no ~/.kube/config, and not running in a "
        f"pod (no service account token under {SERVICE_ACCOUNT_DIR}); pass --kubeconfig PATH"
    )


def _there(path: Path, what: str, *, folder: bool = False) -> bool:
    """Whether `path` exists (as a folder, with `folder`). One that cannot even be looked at (a name too
    long, a folder this user may not enter) is one line naming it, not a traceback."""
    try:
        return path.is_dir() if folder else path.exists()
    except OSError as error:
        reason = error.strerror or error
        raise UserError(
            f"{what} {path}".strip() + f": cannot be looked at ({reason}); fix it or pass --kubeconfig PATH"
        ) from None


MAX_TOKEN_FILE_BYTES = 1 * reading.MIB  # a bearer token is a few KiB


def _check_context(single: Any, source: str) -> None:
    """What the first request would otherwise fail on, with a traceback or for ever: a context without a
    user, a server that is not a URL, an exec plugin that is not there, a token file that never ends."""
    if single.user is None:
        raise UserError(f"{source}: its current context names no user; add one to the context")
    try:
        httpx2.URL(single.cluster.server)
    except (httpx2.InvalidURL, TypeError) as error:
        raise UserError(
            f"{source}: its server {single.cluster.server!r} is not a URL ({error}); fix it"
        ) from None
    plugin = single.user.exec
    if plugin is not None and shutil.which(plugin.command) is None:
        raise UserError(f"{source}: its credential plugin {plugin.command!r} is not on PATH; install it")
    for field, path in (
        ("certificate-authority", single.cluster.certificate_auth),
        ("client-certificate", single.user.client_cert),
        ("client-key", single.user.client_key),
    ):
        if path is not None and not Path(path).is_file():  # made absolute as the files were merged
            raise UserError(f"{source}: its {field} {path} is not a file; fix the path")
    if single.user.token_file is not None:
        token = Path(single.user.token_file)
        if not token.is_file() or token.stat().st_size > MAX_TOKEN_FILE_BYTES:
            raise UserError(f"{source}: its tokenFile {token} is not a token file; fix the path")


def async_client(config: lightkube.KubeConfig, *, field_manager: str = "gpufrac") -> lightkube.AsyncClient:
    """A client for `config`; the certificates it names are read here, so a bad one is a `UserError`."""
    try:
        client = lightkube.AsyncClient(config=config, field_manager=field_manager)
    except (ConfigError, OSError, ValueError) as error:  # ssl.SSLError is an OSError
        source = config.fname or SERVICE_ACCOUNT_DIR
        raise UserError(f"{source}: cannot use its credentials ({error}); fix the paths it names") from None
    client._client._client.event_hooks["response"].append(_must_be_kubernetes)
    return client


class NotKubernetes(httpx2.RemoteProtocolError):
    """An answer no Kubernetes API server gives: the server URL points at something else."""


async def _must_be_kubernetes(response: httpx2.Response) -> None:
    """Refuse an answer that is not JSON before lightkube reads it: it would fail with a KeyError (no
    Content-Type), an HTTPStatusError (an HTML error page) or a DecodeError (a 200 page), tracebacks all.
    As a transport error it is what every caller already handles: one line, or a retry in a long loop."""
    content_type = response.headers.get("content-type", "")
    if "json" not in content_type:
        answer = f"{response.status_code} {response.reason_phrase}".strip()
        raise NotKubernetes(
            f"it answered {answer} with {content_type or 'no Content-Type'}: not a Kubernetes API server",
            request=response.request,
        )


def unreachable(error: Exception, config: lightkube.KubeConfig) -> UserError:
    """The message for an API server that cannot be reached at all, or answers what no API server sends (JSON
    of another service: an `UNREADABLE_ANSWERS` error). A timeout's error says nothing: its kind is named."""
    single = config.get()
    server = f" at {single.cluster.server}" if single is not None else ""
    reason = str(error) or type(error).__name__
    # Named by its file: with $KUBECONFIG and ~/.kube/config found on their own, which one was read is news.
    kubeconfig = f"the kubeconfig {config.fname}" if config.fname else "the kubeconfig"
    if isinstance(error, ConfigError):
        return UserError(
            f"cannot sign in to the Kubernetes API server{server}: the kubeconfig's credential plugin failed "
            f"({reason}); log in again, or fix the user in {kubeconfig}"
        )
    if isinstance(error, UNREADABLE_ANSWERS):
        reason = f"it answered JSON that is not Kubernetes API data ({reason}): not a Kubernetes API server"
    return UserError(
        f"cannot reach the Kubernetes API server{server} ({reason}); check {kubeconfig} and network"
    )


def refused(error: lightkube.ApiError, config: lightkube.KubeConfig, what: str) -> UserError:
    """The message for a request the API server refused (`what` it was asked to do). Credentials it does
    not accept (401: a token expired or revoked, a certificate it does not trust) are named with their
    source and the fix: a long-running program would otherwise retry them for ever, never ready."""
    if error.status.code != 401:
        return UserError(f"the API server refused to {what}: {error.status.message}")
    single = config.get()
    server = f" at {single.cluster.server}" if single is not None else ""
    source = (
        f"the kubeconfig {config.fname}"
        if config.fname
        else f"the service account under {SERVICE_ACCOUNT_DIR}"
    )
    return UserError(
        f"the Kubernetes API server{server} does not accept the credentials of {source} (401 Unauthorized: "
        "a token expired or revoked, or a certificate it does not trust); log in again, or fix the user there"
    )


@contextlib.asynccontextmanager
async def answered_within(config: lightkube.KubeConfig, seconds: float | None = None) -> AsyncIterator[None]:
    """Whatever the block asks of the API server done within `seconds` (default `ONE_SHOT_SECONDS`), or
    `unreachable` with the time waited."""
    seconds = ONE_SHOT_SECONDS if seconds is None else seconds
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise unreachable(TimeoutError(f"no whole answer within {seconds:g}s"), config) from None


# What a dropped or refused connection raises through lightkube's transport; and a credential plugin that
# fails when a request needs a token (an expired cloud login: lightkube runs it then, not at load).
TRANSPORT_ERRORS = (httpx2.TransportError, ConfigError)
# The transport errors by which a request certainly never reached the API server (no connection made, or
# its credential never obtained); after any other, a request that changes something may have been done, the
# answer alone lost.
NOT_SENT = (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout, ConfigError)
# The most a command that reads the cluster once waits for the API server in all: lightkube's 10 s limit is
# per read, so an answer trickled a byte at a time, or a credential plugin that never ends, would hold it
# for ever.
ONE_SHOT_SECONDS = 120.0
# Everything a request can fail with: the API server's answer, or no answer at all.
API_ERRORS = (lightkube.ApiError, *TRANSPORT_ERRORS)
# What lightkube raises on JSON it cannot read as the objects asked for: malformed or of the wrong shape
# (msgspec's DecodeError, a ValueError), an object without metadata in a watch (AttributeError), a list
# without a resourceVersion (NotReadyError). No API server sends these; a proxy that cuts a stream does.
UNREADABLE_ANSWERS = (ValueError, AttributeError, NotReadyError)
# What shows that no Kubernetes API server answered: no answer at all, or one no API server sends.
NO_API_SERVER = (*TRANSPORT_ERRORS, *UNREADABLE_ANSWERS)
# Everything reading objects can fail with: `API_ERRORS`, or an answer that cannot be read as them.
READ_ERRORS = (*API_ERRORS, *UNREADABLE_ANSWERS)


async def list_nodes_and_pods(kubeconfig: Path | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every Node and every Pod as plain API data, for the commands that read the cluster once (`gpufrac
    top`, `gpufrac report`); an API server that cannot be reached or refuses is a `UserError`."""
    config = load_config(kubeconfig)
    client = async_client(config)
    try:
        async with answered_within(config):
            nodes = [node.to_dict() async for node in client.list(Node)]
            pods = [pod.to_dict() async for pod in client.list(Pod, namespace=lightkube.ALL_NS)]
    except NO_API_SERVER as error:
        raise unreachable(error, config) from None
    except lightkube.ApiError as error:
        raise refused(error, config, "list nodes and pods") from None
    finally:
        await client.close()
    return nodes, pods


async def list_objects(kubeconfig: Path | None, resource: type[Any]) -> list[dict[str, Any]]:
    """Every object of a cluster-scoped `resource`, as plain API data, for a command that reads the cluster
    once; a resource the API server does not serve (its CRD not installed) is a `UserError` saying so."""
    config = load_config(kubeconfig)
    client = async_client(config)
    try:
        async with answered_within(config):
            return [item.to_dict() async for item in client.list(resource)]
    except NO_API_SERVER as error:
        raise unreachable(error, config) from None
    except lightkube.ApiError as error:
        name = resource._api_info.plural
        if error.status.code == 404:
            raise UserError(
                f"the API server does not serve {name}: install the gpufrac chart's CRDs"
            ) from None
        raise refused(error, config, f"list {name}") from None
    finally:
        await client.close()


def build(resource: type[R], body: Mapping[str, Any]) -> R:
    """A typed lightkube object from plain API data: requests are written as data, as the API documents
    them, and converted once here."""
    return cast(R, resource.from_dict(dict(body)))  # type: ignore[attr-defined]


async def delete_exactly(
    client: lightkube.AsyncClient, resource: type[Any], name: str, *, namespace: str, uid: str
) -> None:
    """Delete the object named `name` only if it is still the one with `uid`: the API server answers 409
    Conflict when the name now belongs to another object, which is then left alone.

    lightkube's `delete` sends no body, and the API server reads `DeleteOptions.preconditions` only from one
    (not from query parameters), so the request is built through lightkube's generic client.
    """
    generic = client._client
    request = generic.prepare_request("delete", resource, name=name, namespace=namespace)
    request.data = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
    response = await generic.send(generic.build_adapter_request(request))
    generic.handle_response("delete", response, request)
