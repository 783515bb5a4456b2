"""The one-line messages for an API server that cannot be reached."""

from __future__ import annotations

import httpx2
import lightkube

from gpufrac.kubeapi import client

CONFIG = {
    "clusters": [{"name": "c", "cluster": {"server": "https://apiserver.test"}}],
    "users": [{"name": "u", "user": {"token": "t"}}],
    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    "current-context": "c",
}


def test_an_error_that_says_nothing_is_named_by_its_kind() -> None:
    """httpx's timeouts carry no message: the line said `()` where the reason belongs."""
    message = str(client.unreachable(httpx2.ReadTimeout(""), lightkube.KubeConfig.from_dict(CONFIG)))
    assert message == (
        "cannot reach the Kubernetes API server at https://apiserver.test (ReadTimeout); "
        "check the kubeconfig and network"
    )
