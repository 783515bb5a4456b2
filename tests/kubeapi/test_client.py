"""The one-line messages for an API server that cannot be reached."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import httpx2
import lightkube
import pytest

from gpufrac.errors import UserError
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


@pytest.fixture
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A machine with no kubeconfig anywhere and no service account: each test adds what it needs."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(client, "SERVICE_ACCOUNT_DIR", tmp_path / "serviceaccount")
    return tmp_path


def kubeconfig_at(path: Path, server: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(CONFIG | {"clusters": [{"name": "c", "cluster": {"server": server}}]}))
    return path


def test_the_flag_wins_over_kubeconfig_and_home(nowhere: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kubeconfig_at(nowhere / "home/.kube/config", "https://home.test")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_at(nowhere / "env", "https://env.test")))
    flag = kubeconfig_at(nowhere / "flag", "https://flag.test")
    assert client.load_config(flag).get().cluster.server == "https://flag.test"
    assert client.load_config(None).get().cluster.server == "https://env.test"


def test_the_existing_files_of_kubeconfig_are_read(nowhere: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    second = kubeconfig_at(nowhere / "second", "https://second.test")
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(nowhere / "missing"), str(second)]))
    assert client.find_kubeconfig(None) == ([second], "$KUBECONFIG")
    assert client.load_config(None).get().cluster.server == "https://second.test"


def test_kubeconfig_files_merge_as_kubectl_merges_them(
    nowhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usual split: one file picks the context, others define clusters and users, each with
    certificates beside it. The first to define a name or current-context wins, and a file's relative paths
    are read from its own folder, not the first file's or the working directory's."""
    picks = nowhere / "picks.yaml"
    picks.write_text(json.dumps({"current-context": "prod", "contexts": []}))
    (nowhere / "teams/a").mkdir(parents=True)
    (nowhere / "teams/a/ca.crt").write_text("a")
    team = nowhere / "teams/a/config"
    team.write_text(
        json.dumps(
            {
                "current-context": "ignored",
                "clusters": [
                    {
                        "name": "prod",
                        "cluster": {"server": "https://prod.test", "certificate-authority": "ca.crt"},
                    }
                ],
                "users": [{"name": "me", "user": {"token": "t"}}],
                "contexts": [{"name": "prod", "context": {"cluster": "prod", "user": "me"}}],
            }
        )
    )
    later = kubeconfig_at(nowhere / "later", "https://later.test")
    later.write_text(later.read_text().replace('"name": "c"', '"name": "prod"'))  # defined first in `team`
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join(map(str, (picks, team, later))))
    config = client.load_config(None)
    single = config.get()
    assert (single.context_name, single.cluster.server) == ("prod", "https://prod.test")
    assert single.cluster.certificate_auth == str(nowhere / "teams/a/ca.crt")
    message = str(client.unreachable(httpx2.ConnectError("refused"), config))
    assert message.endswith(f"check the kubeconfig {team} and network")  # the file that defines the server
    (nowhere / "teams/a/ca.crt").unlink()
    with pytest.raises(
        UserError,
        match=r"^\$KUBECONFIG .*picks.yaml:.*: its certificate-authority .*teams/a/ca.crt is not a file",
    ):
        client.load_config(None)


def test_a_kubeconfig_entry_without_a_name_is_one_line(
    nowhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = nowhere / "broken"
    broken.write_text(json.dumps(CONFIG | {"users": [{"user": {"token": "t"}}]}))
    with pytest.raises(
        UserError, match=rf"^{re.escape(str(broken))}: its users are not a list of mappings each with a name"
    ):
        client.load_config(broken)


def test_a_kubeconfig_naming_no_file_is_one_line(nowhere: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kubeconfig_at(nowhere / "home/.kube/config", "https://home.test")  # not a fallback: $KUBECONFIG is wrong
    monkeypatch.setenv("KUBECONFIG", str(nowhere / "missing"))
    with pytest.raises(UserError, match=r"^\$KUBECONFIG names .*missing, and none of it exists; fix it"):
        client.load_config(None)


def test_a_broken_kubeconfig_file_is_named_as_kubeconfig(
    nowhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = nowhere / "broken"
    broken.write_text("clusters: [")
    monkeypatch.setenv("KUBECONFIG", str(broken))
    with pytest.raises(
        UserError, match=rf"^\$KUBECONFIG {re.escape(str(broken))}:2: not valid YAML.*not a usable kubeconfig"
    ):
        client.load_config(None)


def test_a_pod_uses_its_service_account_before_the_home_kubeconfig(nowhere: Path) -> None:
    kubeconfig_at(nowhere / "home/.kube/config", "https://home.test")
    assert client.find_kubeconfig(None) == ([nowhere / "home/.kube/config"], "")
    (nowhere / "serviceaccount").mkdir()
    assert client.find_kubeconfig(None) is None


def test_no_kubeconfig_anywhere_is_one_line_naming_every_place(nowhere: Path) -> None:
    with pytest.raises(UserError) as raised:
        client.load_config(None)
    message = str(raised.value)
    assert "\n" not in message
    for place in ("--kubeconfig", "$KUBECONFIG", "~/.kube/config", "service account"):
        assert place in message


def test_an_unreachable_server_names_the_kubeconfig_that_was_read(nowhere: Path) -> None:
    """Found on its own (here ~/.kube/config), the file a person must fix is named in the error."""
    home = kubeconfig_at(nowhere / "home/.kube/config", "https://home.test")
    message = str(client.unreachable(httpx2.ConnectError("refused"), client.load_config(None)))
    assert message.endswith(f"(refused); check the kubeconfig {home} and network")


def test_a_kubeconfig_path_that_cannot_be_looked_at_is_one_line(
    nowhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name longer than the file system takes makes `stat` fail, not answer "no such file"."""
    monkeypatch.setenv("KUBECONFIG", "k" * 5000)
    with pytest.raises(UserError, match=r"^\$KUBECONFIG k+: cannot be looked at \(File name too long\)"):
        client.load_config(None)
