"""Required inter-pod affinity and anti-affinity (`scheduler.pod_affinity`), as kube-scheduler's
InterPodAffinity filter judges them: replicas kept apart (binds in flight count), a pod kept from where a
running pod's anti-affinity names it, a pod kept beside the pods it names, the first of a group that keeps
together, namespaces by name and by selector, and specs the API server would refuse."""

from __future__ import annotations

from typing import Any

import pytest

from gpufrac import contract
from gpufrac.scheduler import constraints, pod_affinity
from gpufrac.scheduler.pod_index import PodIndex

from ..kubeapi.apiobjects import bound, key, pod
from .schedulers import pod_nodes
from .test_scheduler_binds import MANAGED, gpu_node, setup, share_pod

HOST, ZONE = "kubernetes.io/hostname", "topology.kubernetes.io/zone"
EVERY_POD = pod_affinity.Selector(())  # an empty selector


def node_in(name: str, zone: str) -> dict[str, Any]:
    made = gpu_node(name)
    made["metadata"]["labels"] = {**MANAGED, HOST: name, ZONE: zone}
    return made


NODES = [node_in("a1", "a"), node_in("a2", "a"), node_in("b1", "b")]


def labelled(body: dict[str, Any], namespace: str = "team", **labels: str) -> dict[str, Any]:
    body["metadata"]["labels"] = labels
    body["metadata"]["namespace"] = namespace
    return body


def term(key: str = HOST, **selector: Any) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": selector.pop("match", {})}, "topologyKey": key, **selector}


def with_terms(body: dict[str, Any], kind: str, *terms: dict[str, Any]) -> dict[str, Any]:
    body["spec"]["affinity"] = {kind: {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}}
    return body


def replica(name: str) -> dict[str, Any]:
    return with_terms(labelled(share_pod(name), app="infer"), "podAntiAffinity", term(match={"app": "infer"}))


def running(name: str, node: str, **labels: str) -> dict[str, Any]:
    return labelled(bound(pod(name, scheduler="default-scheduler"), node, {}), **labels)


async def decided(pods: list[dict[str, Any]], namespaces: list[dict[str, Any]] = ()) -> tuple[Any, list[str]]:
    """Pods placed after one round (binds in flight included), and the messages of those that wait."""
    made, client, _ = setup(NODES, pods)
    made.on_namespaces_listed(list(namespaces))
    await made.schedule_pending()
    await made.wait_for_binds()
    messages = [call.body["status"]["conditions"][0]["message"] for call in client.made("patch", "PodStatus")]
    return pod_nodes(made), messages


async def test_replicas_that_keep_apart_take_a_node_each_and_the_one_too_many_waits() -> None:
    placed, messages = await decided([replica(f"r{i}") for i in range(4)])
    nodes = [placed[key(f"r{i}")] for i in range(3)]
    assert sorted(nodes) == ["a1", "a2", "b1"] and key("r3") not in placed
    assert any("3 node(s) didn't match pod anti-affinity rules" in message for message in messages)


async def test_a_pod_keeps_off_the_node_whose_running_pod_shuns_it() -> None:
    """The running pod's anti-affinity names `noisy` pods by zone: zone a is closed to them, not to others."""
    quiet = with_terms(
        running("quiet", "a1", app="db"), "podAntiAffinity", term(ZONE, match={"app": "noisy"})
    )
    noisy = [labelled(share_pod(f"noisy{i}"), app="noisy") for i in range(2)]
    placed, _ = await decided([quiet, *noisy, share_pod("calm")])
    assert [placed[key(f"noisy{i}")] for i in range(2)] == ["b1", "b1"] and key("calm") in placed
    alone = with_terms(
        running("alone", "b1", app="db"), "podAntiAffinity", term(ZONE, match={"app": "noisy"})
    )
    placed, messages = await decided([quiet, alone, *noisy])
    assert placed == {key("quiet"): "a1", key("alone"): "b1"}
    assert any("3 node(s) didn't satisfy existing pods anti-affinity rules" in m for m in messages)


async def test_a_pod_goes_beside_the_pods_it_names_and_the_first_of_its_group_anywhere() -> None:
    db = running("db", "b1", app="db")
    beside = with_terms(labelled(share_pod("cache")), "podAffinity", term(ZONE, match={"app": "db"}))
    lonely = with_terms(labelled(share_pod("lonely")), "podAffinity", term(match={"app": "nowhere"}))
    first = with_terms(labelled(share_pod("first"), app="group"), "podAffinity", term(match={"app": "group"}))
    placed, messages = await decided([db, beside, lonely, first])
    assert placed[key("cache")] == "b1" and key("first") in placed and key("lonely") not in placed
    assert any("3 node(s) didn't match pod affinity rules" in message for message in messages)


async def test_terms_name_pods_of_their_namespaces_by_name_or_selector() -> None:
    """A pod of team `other` on a1, labelled alike: the default term (own namespace) does not name it, a term
    listing `other` or selecting namespaces by label does."""
    others = running("neighbour", "a1", namespace="other", app="infer")
    own = with_terms(labelled(share_pod("own"), app="x"), "podAffinity", term(match={"app": "infer"}))
    listed = with_terms(
        labelled(share_pod("listed")), "podAffinity", term(match={"app": "infer"}, namespaces=["other"])
    )
    chosen = with_terms(
        labelled(share_pod("chosen")),
        "podAffinity",
        term(match={"app": "infer"}, namespaceSelector={"matchLabels": {"tier": "serving"}}),
    )
    namespaces = [{"metadata": {"name": "other", "labels": {"tier": "serving"}}}]
    placed, _ = await decided([others, own, listed, chosen], namespaces)
    assert key("own") not in placed and placed[key("listed")] == "a1" and placed[key("chosen")] == "a1"


async def test_match_label_keys_keep_apart_only_pods_of_the_same_revision() -> None:
    def revision(name: str, value: str) -> dict[str, Any]:
        shunning = term(match={"app": "infer"}, matchLabelKeys=["rev"])
        return with_terms(labelled(share_pod(name), app="infer", rev=value), "podAntiAffinity", shunning)

    old = [running(f"old{i}", node, app="infer", rev="1") for i, node in enumerate(("a1", "a2"))]
    placed, _ = await decided([*old, revision("new", "2"), revision("stale", "1")])
    assert key("new") in placed and placed[key("stale")] == "b1"


@pytest.mark.parametrize(
    ("terms", "complaint"),
    [
        ([{"labelSelector": {}}], "must name a node label"),
        ([term(match={"app": 1})], "must be a string"),
        (
            [
                {
                    **term(),
                    "labelSelector": {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]},
                }
            ],
            "must be one of",
        ),
        ([term()] * 300, "at most 256 terms and requirements"),
        ([{**term(), "namespaces": ["n"] * 5000}], "of 4096 values"),
        (
            [
                {
                    **term(),
                    "labelSelector": {"matchExpressions": [{"key": "a", "operator": "In", "values": 7}]},
                }
            ],
            "list of strings",
        ),
    ],
)
def test_terms_the_api_server_would_refuse_are_refused(terms: list[dict[str, Any]], complaint: str) -> None:
    body = with_terms(share_pod("p"), "podAntiAffinity", *terms)
    with pytest.raises(contract.ContractError, match=complaint):
        pod_affinity.facts_of(body)
    why = constraints.refusal(body)
    assert why is not None and why.startswith("unreadable placement constraints")


async def test_a_pod_gone_leaves_no_trace_in_the_namespace_and_anti_affinity_indices() -> None:
    made, _, _ = setup(NODES, [replica("r0"), running("quiet", "a1", app="db")])
    await made.schedule_pending()
    await made.wait_for_binds()
    assert set(made.cache.pods.named(["team"], EVERY_POD)) == {key("r0"), key("quiet")}
    assert list(made.cache.pods.repelling.values()) == [{key("r0")}]
    for name in ("r0", "quiet"):
        made.cache.remove_pod(key(name))
    assert not list(made.cache.pods.named(["team"], EVERY_POD)) and not made.cache.pods.repelling
    assert made.cache.pods.facts == {}


async def test_a_running_pod_counts_for_the_affinity_only_if_every_term_names_it() -> None:
    """As kube-scheduler counts: a db pod on a1 and a cache pod in zone a do not make a1 a node for a pod
    that wants both beside it, since neither pod matches both terms; and a pod that names itself by two
    terms is the first of its group while no pod matches both, though one matches one."""
    both = with_terms(
        labelled(share_pod("both")),
        "podAffinity",
        term(match={"app": "db"}),
        term(ZONE, match={"app": "cache"}),
    )
    first = with_terms(
        labelled(share_pod("first"), app="web", tier="front"),
        "podAffinity",
        term(match={"app": "web"}),
        term(match={"tier": "front"}),
    )
    existing = [
        running("db", "a1", app="db"),
        running("cache", "a2", app="cache"),
        running("web", "b1", app="web"),
    ]
    placed, _ = await decided([*existing, both, first])
    assert key("both") not in placed and key("first") in placed


async def test_a_placed_pod_with_labels_the_api_server_would_refuse_breaks_no_decision() -> None:
    odd = running("odd", "a1", app="infer")
    odd["metadata"]["labels"] = {"app": ["infer"], "rev": 2}
    placed, _ = await decided(
        [
            odd,
            replica("r0"),
            with_terms(
                labelled(share_pod("w")), "podAffinity", term(match={"app": "infer"}, matchLabelKeys=["app"])
            ),
        ]
    )
    assert key("r0") in placed


def test_the_index_finds_pods_by_the_label_a_selector_pins_and_follows_label_changes() -> None:
    index = PodIndex()
    index.know("a", running("a", "a1", app="infer"))
    index.know("b", running("b", "a1", app="db"))
    index.know("c", running("c", "a1", namespace="other", app="infer"))
    pinned = pod_affinity.selector({"matchLabels": {"app": "infer"}}, "s")
    loose = pod_affinity.selector({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, "s")
    assert set(index.named(["team"], pinned)) == {"a"} and set(index.named(["team"], loose)) == {"a", "b"}
    assert set(index.named(["team"], None)) == set()
    index.know("a", running("a", "a1", app="web"))  # relabelled while it runs
    assert set(index.named(["team", "other"], pinned)) == {"c"}
    for uid in ("a", "b", "c"):
        index.forget(uid)
    assert (
        index.facts == {}
        and not list(index.named(["team"], EVERY_POD))
        and not list(index.named(["other"], loose))
    )


def test_a_selector_across_many_namespaces_reads_the_pods_with_its_values_not_each_namespace() -> None:
    """A term of `namespaceSelector: {}` and thousands of values cost a look-up per namespace and value
    (3,000 namespaces: 1.28 s a try); the pods with each value are read once, whatever their namespace."""
    index = PodIndex()
    index.know("a", running("a", "a1", app="v7"))
    index.know("b", running("b", "a1", namespace="ns-9", app="v7"))
    index.know("c", running("c", "a1", namespace="elsewhere", app="v7"))
    values = [f"v{i}" for i in range(400)]
    pinned = pod_affinity.selector(
        {"matchExpressions": [{"key": "app", "operator": "In", "values": values}]}, "s"
    )
    namespaces = ["team", *(f"ns-{i}" for i in range(300))]
    looked: list[object] = []

    class Counted(dict):  # type: ignore[type-arg]
        def get(self, key: object, default: object = None) -> object:
            looked.append(key)
            return super().get(key, default)

    index._labelled = Counted(index._labelled)
    index._labelled_anywhere = Counted(index._labelled_anywhere)
    assert set(index.named(namespaces, pinned)) == {"a", "b"}
    assert len(looked) == len(values)
