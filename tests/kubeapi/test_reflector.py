"""List, watch, relist on 410, reconnect on errors: against a scripted client, with sleeps recorded."""

from __future__ import annotations

import asyncio
import contextlib
import types
from collections.abc import Iterator
from typing import Any

import lightkube
import msgspec
import pytest
from lightkube.core.exceptions import NotReadyError
from lightkube.resources.core_v1 import Node, Pod

from gpufrac.kubeapi import reflector

from .apiobjects import node, pod
from .fakeapi import SILENT, ScriptedWatchClient, Step, api_error, transport_error


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """The reflector's backoff sleeps, recorded; each only yields to the event loop."""
    recorded: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        recorded.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(reflector, "asyncio", types.SimpleNamespace(sleep=sleep, timeout=asyncio.timeout))
    yield recorded


def versioned(obj: dict[str, Any], version: str) -> dict[str, Any]:
    obj["metadata"]["resourceVersion"] = version
    return obj


class Recorder:
    def __init__(self) -> None:
        self.lists: list[list[dict[str, Any]]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []

    def on_list(self, objects: list[dict[str, Any]]) -> None:
        self.lists.append(objects)

    def on_event(self, event: str, body: dict[str, Any]) -> None:
        self.events.append((event, body))


async def play(
    lists: list[list[dict[str, Any]] | Exception],
    watches: list[list[Step]],
    *,
    resource: type[Any] = Pod,
    max_backoff: float = 30.0,
    watch_seconds: float = reflector.WATCH_SECONDS,
) -> tuple[ScriptedWatchClient, Recorder]:
    """Run the reflector through the script, then cancel it as the scheduler does on shutdown."""
    client = ScriptedWatchClient(lists, watches)
    seen = Recorder()
    task = asyncio.create_task(
        reflector.reflect(
            client,
            resource,
            on_list=seen.on_list,
            on_event=seen.on_event,
            namespaced=resource is Pod,
            max_backoff=max_backoff,
            watch_seconds=watch_seconds,
        )
    )
    done = asyncio.create_task(client.done.wait())
    finished, _ = await asyncio.wait([task, done], timeout=5, return_when=asyncio.FIRST_COMPLETED)
    assert task not in finished, f"the reflector stopped: {task.exception() if task.done() else ''}"
    assert done in finished, "the script was not played to its end"
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()
    return client, seen


async def test_lists_then_watches_from_the_lists_version_and_passes_dicts(sleeps: list[float]) -> None:
    first, second = pod("a"), pod("b")
    changed = versioned(pod("a", annotations={"note": "x"}), "12")
    client, seen = await play(
        [[first, second]], [[("MODIFIED", changed), ("DELETED", versioned(pod("b"), "13"))]]
    )
    assert client.list_calls == [lightkube.ALL_NS]
    assert seen.lists == [[first, second]]
    assert seen.events == [("MODIFIED", changed), ("DELETED", versioned(pod("b"), "13"))]
    assert all(type(body) is dict for _, body in seen.events)
    # The stream ended (as the apiserver ends watches): the next one resumes where the last event left off.
    assert client.watch_versions[:2] == ["list-1", "13"]


async def test_a_watch_gone_silent_is_cut_and_made_again_from_its_last_version(sleeps: list[float]) -> None:
    """A connection that died without a word (lightkube reads a watch with no timeout) must not keep the
    cache stale for ever: the event sent after it is seen on the next watch."""
    client, seen = await play(
        [[pod("a")]],
        [[("ADDED", versioned(pod("b"), "5")), SILENT], [("DELETED", versioned(pod("a"), "6"))]],
        watch_seconds=0.01,
    )
    assert client.watch_versions[:2] == ["list-1", "5"]
    assert len(client.list_calls) == 1  # nothing was lost: no need to list again
    assert [(event, body["metadata"]["name"]) for event, body in seen.events] == [
        ("ADDED", "b"),
        ("DELETED", "a"),
    ]


async def test_cluster_scoped_resources_are_listed_without_namespace(sleeps: list[float]) -> None:
    client, seen = await play([[node("n1")]], [[("ADDED", versioned(node("n2"), "4"))]], resource=Node)
    assert client.list_calls == [None]
    assert [body["metadata"]["name"] for _, body in seen.events] == ["n2"]


async def test_errors_are_retried_from_the_last_version_and_410_relists(sleeps: list[float]) -> None:
    client, seen = await play(
        [[pod("a")], [pod("b")]],
        [
            [("ADDED", versioned(pod("b"), "5")), ("MODIFIED", versioned(pod("b"), "6"))],
            [transport_error()],
            [api_error(500, "InternalError")],
            [api_error(403, "Forbidden")],
            [("DELETED", versioned(pod("a"), "7")), api_error(410, "Expired")],
        ],
    )
    assert client.watch_versions == ["list-1", "6", "6", "6", "6", "list-2"]
    assert len(client.list_calls) == 2
    assert [[body["metadata"]["name"] for body in listed] for listed in seen.lists] == [["a"], ["b"]]
    assert [(event, body["metadata"]["resourceVersion"]) for event, body in seen.events] == [
        ("ADDED", "5"),
        ("MODIFIED", "6"),
        ("DELETED", "7"),
    ]
    # A stream that ends waits briefly; each error in a row waits twice as long; a 410 relists at once.
    assert sleeps == [0.2, 0.4, 0.8, 1.6]


async def test_a_watch_expired_straight_after_its_list_backs_off_before_listing_again(
    sleeps: list[float],
) -> None:
    """A server whose watch cache lags its lists answers 410 to the list's own version: relisting at once
    each time would pull every object in a loop."""
    client, _ = await play(
        [[pod("a")], [pod("a")], [pod("a")]],
        [[api_error(410, "Expired")], [api_error(410, "Expired")], [("ADDED", versioned(pod("b"), "9"))]],
    )
    assert len(client.list_calls) == 3
    assert sleeps[:2] == [0.4, 0.8]  # as any error in a row


async def test_a_failed_list_is_retried(sleeps: list[float]) -> None:
    client, seen = await play([transport_error(), api_error(503, "ServiceUnavailable"), [pod("a")]], [[]])
    assert len(client.list_calls) == 3
    assert [[body["metadata"]["name"] for body in listed] for listed in seen.lists] == [["a"]]
    assert client.watch_versions[0] == "list-3"
    assert sleeps[:2] == [0.4, 0.8]


async def test_backoff_is_capped_and_reset_by_an_event(sleeps: list[float]) -> None:
    errors: list[list[Step]] = [[transport_error()] for _ in range(5)]
    client, _ = await play(
        [[]],
        [*errors, [("ADDED", versioned(pod("a"), "9")), transport_error()], [transport_error()]],
        max_backoff=1.0,
    )
    assert sleeps == [0.4, 0.8, 1.0, 1.0, 1.0, 0.4, 0.8]
    assert client.watch_versions[-1] == "9"


async def test_an_event_the_handler_fails_on_is_not_dropped_the_reflector_lists_again(
    sleeps: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    """A DELETED event lost to a failing handler would leave the pod's memory held for good: the relist
    that follows states the pod is gone, and the list handler rebuilds from it."""
    client = ScriptedWatchClient(
        [[pod("bad"), pod("kept")], [pod("kept")]],
        [[("DELETED", versioned(pod("bad"), "5")), ("ADDED", versioned(pod("never"), "6"))], []],
    )
    lists: list[list[str]] = []
    handled: list[str] = []

    def on_event(event: str, body: dict[str, Any]) -> None:
        if body["metadata"]["name"] == "bad":
            raise ValueError("cannot digest this one")
        handled.append(body["metadata"]["name"])

    task = asyncio.create_task(
        reflector.reflect(
            client,
            Pod,
            on_list=lambda objects: lists.append([o["metadata"]["name"] for o in objects]),
            on_event=on_event,
            namespaced=True,
        )
    )
    await asyncio.wait_for(client.done.wait(), timeout=5)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert lists == [["bad", "kept"], ["kept"]]
    assert handled == []  # the rest of the broken stream is not read: the list replaces it
    assert client.watch_versions[:2] == ["list-1", "list-2"]
    assert sleeps[0] == 0.4  # a backoff, so a handler that always fails cannot spin the API server
    assert "Pod DELETED bad: handling the event failed; relisting" in caplog.text


async def test_a_list_the_handler_fails_on_is_listed_again(
    sleeps: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    client = ScriptedWatchClient([[pod("a")], [pod("a")]], [[("ADDED", versioned(pod("b"), "5"))]])
    lists: list[list[dict[str, Any]]] = []

    def on_list(objects: list[dict[str, Any]]) -> None:
        lists.append(objects)
        if len(lists) == 1:
            raise ValueError("cannot digest this list")

    task = asyncio.create_task(
        reflector.reflect(client, Pod, on_list=on_list, on_event=lambda event, body: None, namespaced=True)
    )
    await asyncio.wait_for(client.done.wait(), timeout=5)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert len(lists) == 2 and len(client.list_calls) == 2
    assert "Pod list: handling it failed; listing again" in caplog.text


async def test_an_answer_that_cannot_be_decoded_is_listed_again_not_raised(
    sleeps: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    """What lightkube raises on JSON it cannot read as the object asked for (a truncated watch line from a
    proxy, an object without metadata) and on a list without a resourceVersion: the reflector lists again
    (where the broken stream stood is unknown) instead of stopping, and the scheduler with it."""
    client, seen = await play(
        [
            NotReadyError("resourceVersion", "only available after the iteration started"),
            [pod("a")],
            [pod("b")],
            [pod("c")],
        ],
        [
            [
                ("ADDED", versioned(pod("b"), "5")),
                msgspec.DecodeError("JSON is malformed: invalid character"),
            ],
            [AttributeError("'NoneType' object has no attribute 'resourceVersion'")],
        ],
    )
    assert len(client.list_calls) == 4
    assert client.watch_versions[:3] == ["list-2", "list-3", "list-4"]
    assert [[body["metadata"]["name"] for body in listed] for listed in seen.lists] == [["a"], ["b"], ["c"]]
    assert sleeps[:3] == [0.4, 0.4, 0.8]
    assert "Pod watch: an answer that is not Kubernetes API data (JSON is malformed" in caplog.text


async def test_a_day_of_errors_in_a_row_keeps_the_capped_backoff(sleeps: list[float]) -> None:
    """Doubling without a bound overflowed a float after 1024 failures in a row (eight hours of an API
    server that refuses, at the 30 s cap), and the reflector stopped."""
    await play([[]], [[transport_error()] for _ in range(1100)])
    assert len(sleeps) == 1100 and set(sleeps[10:]) == {30.0}
