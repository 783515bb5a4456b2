"""Stand-ins for lightkube's async client, and API errors built the way lightkube builds them."""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import httpx2
from lightkube import ApiError


def api_error(code: int, reason: str = "Failure", message: str = "") -> ApiError:
    """An ApiError as lightkube raises it: from a response whose body is a Status."""
    request = httpx2.Request("GET", "https://apiserver.test/api/v1")
    status = {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "reason": reason,
        "code": code,
        "message": message or f"{reason} ({code})",
    }
    return ApiError(request=request, response=httpx2.Response(code, json=status, request=request))


def transport_error() -> httpx2.TransportError:
    return httpx2.ConnectError("connection refused")


@dataclass
class Call:
    verb: str
    kind: str  # the class name of what was written or read: ConfigMap, Binding, Event, Pod, PodStatus
    name: str | None
    body: Any = None
    dry_run: bool = False  # only asked: the API server answers as it would, and changes nothing


@dataclass
class RecordingClient:
    """Records every call the scheduler makes; `fail` maps a call ("create Binding") to the error it raises;
    `gate`, when set, holds a Binding until it is opened; `held` are the Bindings that reached it."""

    calls: list[Call] = field(default_factory=list)
    fail: dict[str, Exception] = field(default_factory=dict)
    gate: asyncio.Event | None = None
    held: list[Any] = field(default_factory=list)

    async def _at_gate(self, kind: str, obj: Any) -> None:
        if kind == "Binding" and self.gate is not None:
            self.held.append(obj)
            await self.gate.wait()

    def _record(self, verb: str, kind: str, name: str | None, body: Any, *, dry_run: bool = False) -> None:
        self.calls.append(Call(verb, kind, name, body, dry_run))
        error = self.fail.get(f"{verb} {kind}")
        if error is not None:
            raise error

    async def create(
        self, obj: Any, name: str | None = None, *, namespace: str | None = None, dry_run: bool = False
    ) -> Any:
        kind = obj.kind or type(obj).__name__
        await self._at_gate(kind, obj)
        self._record("create", kind, obj.metadata.name if obj.metadata else name, obj, dry_run=dry_run)
        return obj

    async def patch(self, resource: type[Any], name: str, obj: Any, **_: Any) -> None:
        self._record("patch", resource.__name__, name, obj)

    async def get(self, resource: type[Any], name: str, **_: Any) -> Any:
        self._record("get", resource.__name__, name, None)

    async def delete(self, resource: type[Any], name: str, **_: Any) -> None:
        self._record("delete", resource.__name__, name, None)

    def made(self, verb: str, kind: str) -> list[Call]:
        return [call for call in self.calls if (call.verb, call.kind) == (verb, kind) and not call.dry_run]


Hook = Callable[[], Awaitable[None]]


@dataclass
class Mishaps:
    """What can go wrong on the way to an API server: `lose` lists calls ("create Binding") whose next
    occurrence loses its reply ("reply": applied, then a timeout) or its request ("request": a timeout,
    nothing applied); `before` runs a hook just before a call is applied (e.g. to delete and recreate the
    pod while its bind runs)."""

    lose: list[tuple[str, str]] = field(default_factory=list)
    before: dict[str, Hook] = field(default_factory=dict)

    async def _step(self, call: str) -> str | None:
        """Run the hook for `call`; raise if its request is lost; 'reply' when its reply is to be lost."""
        hook = self.before.pop(call, None)
        if hook is not None:
            await hook()
        for index, (lost, how) in enumerate(self.lose):
            if lost == call:
                del self.lose[index]
                if how == "request":
                    raise httpx2.ReadTimeout("timed out before the request was sent")
                return how
        return None


class LossyClient(Mishaps):
    """A real client behind `Mishaps`, for tests against a real API server. `sent` counts the calls made
    ("create Binding"), lost ones included."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.sent: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def _call(self, call: str, send: Callable[[], Awaitable[Any]]) -> Any:
        self.sent[call] += 1
        lost = await self._step(call)
        result = await send()
        if lost == "reply":
            raise httpx2.ReadTimeout("the reply was lost")
        return result

    async def create(
        self, obj: Any, name: str | None = None, *, namespace: str | None = None, dry_run: bool = False
    ) -> Any:
        kind = obj.kind or type(obj).__name__
        return await self._call(
            f"create {kind}", lambda: self.inner.create(obj, name, namespace=namespace, dry_run=dry_run)
        )

    async def get(self, resource: type[Any], name: str, *, namespace: str | None = None) -> Any:
        call = f"get {resource.__name__}"
        return await self._call(call, lambda: self.inner.get(resource, name, namespace=namespace))


@dataclass
class FakeApi(RecordingClient, Mishaps):
    """A RecordingClient that keeps pods and ConfigMaps and answers as kube-apiserver v1.20.2 does:

    - a Binding sets `nodeName` and copies its annotations onto the pod in one step, ignores its UID (so
      it binds whichever pod has the name now), and is refused with 409 when the pod is bound or being
      deleted, 404 when there is none;
    - creating a ConfigMap that exists is 409 AlreadyExists; a delete with a UID precondition that no
      longer holds is 409 Conflict.

    `Mishaps` lose requests or replies, and run hooks before a call.
    """

    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    _made: int = 0

    def put(self, obj: Mapping[str, Any]) -> None:
        """Store `obj` (a Pod or a ConfigMap, as plain API data) as the API server holds it."""
        meta = obj["metadata"]
        self.objects[obj["kind"], meta.get("namespace", ""), meta["name"]] = copy.deepcopy(dict(obj))

    def stored(self, kind: str, name: str, namespace: str = "team") -> dict[str, Any] | None:
        return self.objects.get((kind, namespace, name))

    async def create(
        self, obj: Any, name: str | None = None, *, namespace: str | None = None, dry_run: bool = False
    ) -> Any:
        kind = obj.kind or type(obj).__name__
        await self._at_gate(kind, obj)
        self._record("create", kind, obj.metadata.name if obj.metadata else name, obj, dry_run=dry_run)
        if dry_run:
            return obj
        lost = await self._step(f"create {kind}")
        namespace = namespace or (obj.metadata.namespace if obj.metadata else None) or ""
        if kind == "Binding":
            self._bind(namespace, obj.metadata.name, obj.target["name"], obj.metadata.annotations or {})
        elif kind == "ConfigMap":
            key = ("ConfigMap", namespace, obj.metadata.name)
            if key in self.objects:
                raise api_error(409, "AlreadyExists", f"configmaps {obj.metadata.name!r} already exists")
            self._made += 1
            body = obj.to_dict()
            body["metadata"]["uid"] = f"cm-uid-{self._made}"
            self.objects[key] = body
        elif kind == "Pod":
            self._made += 1
            body = obj.to_dict()
            body["metadata"]["uid"] = f"pod-uid-{self._made}"
            body.setdefault("status", {"phase": "Pending"})
            self.objects["Pod", namespace, obj.metadata.name] = body
            return Item(body)
        if lost == "reply":
            raise httpx2.ReadTimeout("the reply was lost")
        return obj

    def _bind(self, namespace: str, name: str, node: str, annotations: Mapping[str, str]) -> None:
        pod = self.objects.get(("Pod", namespace, name))
        if pod is None:
            raise api_error(404, "NotFound", f'pods "{name}" not found')
        if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
            raise api_error(409, "Conflict", f"pod {name} is already assigned to node")
        pod["spec"]["nodeName"] = node
        pod["metadata"].setdefault("annotations", {}).update(annotations)

    async def get(self, resource: type[Any], name: str, *, namespace: str | None = None, **_: Any) -> Any:
        self._record("get", resource.__name__, name, None)
        lost = await self._step(f"get {resource.__name__}")
        found = self.objects.get((resource.__name__, namespace or "", name))
        if lost == "reply":
            raise httpx2.ReadTimeout("the reply was lost")
        if found is None:
            raise api_error(404, "NotFound", f"{name} not found")
        return Item(found)

    async def patch(
        self, resource: type[Any], name: str, obj: Any, *, namespace: str | None = None, **_: Any
    ) -> None:
        """A merge patch of a stored object (a PersistentVolumeClaim's annotations); recorded only for the
        kinds not stored (a pod's status)."""
        self._record("patch", resource.__name__, name, obj)
        found = self.objects.get((resource.__name__, namespace or "", name))
        if found is not None and isinstance(obj, Mapping):
            _merge(found, obj)

    async def delete(self, resource: type[Any], name: str, *, namespace: str | None = None, **_: Any) -> None:
        await self._delete(resource.__name__, name, namespace or "", uid=None)

    async def _delete(self, kind: str, name: str, namespace: str, *, uid: str | None) -> None:
        self._record("delete", kind, name, {"uid": uid} if uid else None)
        lost = await self._step(f"delete {kind}")
        found = self.objects.get((kind, namespace, name))
        if found is None:
            raise api_error(404, "NotFound", f"{name} not found")
        if uid is not None and found["metadata"].get("uid") != uid:
            raise api_error(409, "Conflict", "Precondition failed: UID in precondition does not match")
        del self.objects[kind, namespace, name]
        if lost == "reply":
            raise httpx2.ReadTimeout("the reply was lost")

    @property
    def _client(self) -> _GenericClient:
        """What `kubeapi.client.delete_exactly` reaches for: lightkube's generic client."""
        return _GenericClient(self)


@dataclass
class _GenericClient:
    api: FakeApi

    def prepare_request(self, method: str, resource: type[Any], *, name: str, namespace: str) -> Any:
        return SimpleNamespace(kind=resource.__name__, name=name, namespace=namespace, data=None)

    def build_adapter_request(self, request: Any) -> Any:
        return request

    async def send(self, request: Any) -> None:
        await self.api._delete(
            request.kind, request.name, request.namespace, uid=request.data["preconditions"]["uid"]
        )

    def handle_response(self, method: str, response: Any, request: Any) -> None:
        return None


def _merge(target: dict[str, Any], change: Mapping[str, Any]) -> None:
    for key, value in change.items():
        if isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class Item:
    """An object as lightkube yields it: something with `to_dict()`."""

    def __init__(self, body: Mapping[str, Any]) -> None:
        self._body = copy.deepcopy(dict(body))

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._body)


class Listing:
    """What `AsyncClient.list` returns: an async iterable whose `resourceVersion` is known once read."""

    def __init__(self, items: Sequence[Mapping[str, Any]] | Exception, version: str) -> None:
        self._items = items
        self._version = version
        self.resourceVersion: str | None = None

    def __aiter__(self) -> AsyncIterator[Item]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Item]:
        if isinstance(self._items, Exception):
            raise self._items
        for body in self._items:
            yield Item(body)
        self.resourceVersion = self._version


Step = tuple[str, Mapping[str, Any]] | Exception
# A step after which the stream neither ends nor sends another byte: a connection that died without a word.
SILENT: Step = ("SILENT", {})


class ScriptedWatchClient:
    """`list` answers the next of `lists` (objects, or an error to raise), `watch` plays the next of
    `watches`: events, then the stream ends, or an exception is raised. With the script used up, `done` is
    set and the next watch hangs."""

    def __init__(
        self, lists: Sequence[Sequence[Mapping[str, Any]] | Exception], watches: Sequence[Sequence[Step]]
    ) -> None:
        self._lists = list(lists)
        self._watches = list(watches)
        self.list_calls: list[str | None] = []
        self.watch_versions: list[str | None] = []
        self.done = asyncio.Event()

    def list(self, resource: type[Any], *, namespace: str | None = None) -> Listing:
        self.list_calls.append(namespace)
        items = self._lists.pop(0)
        return Listing(items, f"list-{len(self.list_calls)}")

    def watch(
        self, resource: type[Any], *, namespace: str | None = None, resource_version: str | None = None
    ) -> AsyncIterator[tuple[str, Item]]:
        self.watch_versions.append(resource_version)
        return self._play(self._watches.pop(0) if self._watches else None)

    async def _play(self, steps: Sequence[Step] | None) -> AsyncIterator[tuple[str, Item]]:
        if steps is None:
            self.done.set()
            await asyncio.Event().wait()
            return
        for step in steps:
            if isinstance(step, Exception):
                raise step
            if step is SILENT:
                await asyncio.Event().wait()
            event, body = step
            yield event, Item(body)


class FakeClock:
    """Seconds that pass only when a test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def until(condition: Callable[[], bool], *, step: Callable[[], Awaitable[None]] | None = None) -> None:
    """Yield to the event loop until `condition` holds (a bounded number of times)."""
    for _ in range(1000):
        if condition():
            return
        await (step() if step else asyncio.sleep(0))
    raise AssertionError("condition never held")
