"""The real node of the tests in this folder: started the first time one of them asks for it, and gone,
Node object included, once they are done, so the other tests of the session never see it (a scheduler
counting nodes, say). A node that cannot start fails these tests with the reason; it never skips them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .. import controlplane
from . import realnode


@pytest.fixture(scope="package")
def real_node(
    request: pytest.FixtureRequest, control_plane: controlplane.ControlPlane
) -> Iterator[realnode.RealNode]:
    """A real node (containerd, runc, kubelet) in the session's cluster; see realnode.py."""
    node = controlplane.started(lambda: realnode.start(control_plane), "the real-node tests need a node")
    request.config.stash.setdefault(controlplane.START_SECONDS, {})["real node"] = node.start_seconds
    yield node
    realnode.stop(control_plane)
