"""`gpufrac webhook` as a person runs it: certificates into files, serving HTTPS, one-line errors."""

from __future__ import annotations

import inspect
import json
import os
import signal
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from gpufrac import cli, contract
from gpufrac.admission import certs, settings

from .reviews import pod, review

GPUFRAC = [sys.executable, "-m", "gpufrac.cli"]


def gpufrac(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUFRAC, *args], capture_output=True, text=True, timeout=60, check=False)


def test_the_flags_defaults_are_the_policys() -> None:
    defaults = {name: p.default for name, p in inspect.signature(cli.webhook).parameters.items()}
    assert defaults["scheduler_identity"] == settings.DEFAULT_SCHEDULER_IDENTITY
    assert defaults["scheduler_name"] == settings.DEFAULT_SCHEDULER_NAME
    assert defaults["exempt_namespaces"] == ",".join(settings.DEFAULT_EXEMPT_NAMESPACES)
    assert defaults["mps_host_directory"] == contract.DEFAULT_MPS_PIPE_DIRECTORY


def test_generate_certs_into_files(tmp_path: Path) -> None:
    done = gpufrac(
        "webhook",
        "--generate-certs",
        "--hosts",
        "127.0.0.1, localhost",
        "--tls-cert",
        str(tmp_path / "tls.crt"),
        "--tls-key",
        str(tmp_path / "tls.key"),
        "--ca-cert",
        str(tmp_path / "ca.crt"),
    )
    assert done.returncode == 0, done.stderr
    bundle = certs.Bundle(*((tmp_path / name).read_bytes() for name in ("ca.crt", "tls.crt", "tls.key")))
    assert certs.still_valid(bundle, ["127.0.0.1", "localhost"])
    assert not certs.still_valid(bundle, ["gpufrac-webhook.gpufrac-system.svc"])
    assert (tmp_path / "tls.key").stat().st_mode & 0o777 == 0o600


def test_generate_certs_writes_all_files_or_none(tmp_path: Path) -> None:
    """A key that cannot be written must not leave a new certificate without it (a webhook restarted on the
    pair would fail to load it), and a key file that was world-readable must not receive the new key."""
    (tmp_path / "tls.crt").write_text("old certificate\n")
    under_a_file = tmp_path / "tls.crt" / "tls.key"
    failed = gpufrac(
        "webhook",
        "--generate-certs",
        "--hosts",
        "x",
        "--tls-cert",
        str(tmp_path / "new.crt"),
        "--tls-key",
        str(under_a_file),
    )
    assert failed.returncode == 2 and failed.stderr.startswith("gpufrac: cannot write the certificate files")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tls.crt"]
    key = tmp_path / "tls.key"
    key.write_text("old key\n")
    key.chmod(0o644)
    done = gpufrac(
        "webhook",
        "--generate-certs",
        "--hosts",
        "x",
        "--tls-cert",
        str(tmp_path / "tls.crt"),
        "--tls-key",
        str(key),
    )
    assert done.returncode == 0, done.stderr
    assert key.read_bytes().startswith(b"-----BEGIN") and key.stat().st_mode & 0o777 == 0o600
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tls.crt", "tls.key"]


def test_one_line_errors() -> None:
    for args, message in [
        ((), "gpufrac: the webhook serves HTTPS only: pass --tls-cert and --tls-key (or --generate-certs)\n"),
        (
            ("--generate-certs", "--hosts", "x"),
            "gpufrac: --generate-certs needs either --secret NAMESPACE/NAME (in a cluster) or --tls-cert and "
            "--tls-key (files), not both\n",
        ),
        (
            ("--generate-certs", "--tls-cert", "a", "--tls-key", "b"),
            "gpufrac: a serving certificate needs at least one host name or IP address\n",
        ),
        (
            ("--generate-certs", "--secret", "nameonly", "--hosts", "x"),
            "gpufrac: --secret nameonly: expected NAMESPACE/NAME\n",
        ),
        (
            ("--tls-cert", "/nonexistent/tls.crt", "--tls-key", "/nonexistent/tls.key"),
            "gpufrac: --tls-cert /nonexistent/tls.crt / --tls-key /nonexistent/tls.key: cannot load them",
        ),
        (  # refused before the certificates are read: it would be mounted into tenants' pods
            ("--tls-cert", "a", "--tls-key", "b", "--mps-host-directory", "/run"),
            "gpufrac: --mps-host-directory '/run': sm-sharing pods mount the MPS pipe directory read-write",
        ),
    ]:
        done = gpufrac("webhook", *args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith(message), done.stderr


def test_serves_https_until_sigterm(tmp_path: Path) -> None:
    certs.write(
        certs.generate(["127.0.0.1"]),
        cert=tmp_path / "tls.crt",
        key=tmp_path / "tls.key",
        ca=tmp_path / "ca.crt",
    )
    args = ["webhook", "--port", "0", "--host", "127.0.0.1", "--tls-cert", str(tmp_path / "tls.crt")]
    server = subprocess.Popen(
        [*GPUFRAC, *args, "--tls-key", str(tmp_path / "tls.key"), "--exempt-namespaces", ""],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("gpufrac webhook: serving on https://127.0.0.1:"), line
        url = line.split()[-1]
        trust = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        with urllib.request.urlopen(f"{url}/healthz", context=trust, timeout=10) as response:
            assert response.read() == b"ok\n"
        # --exempt-namespaces "" guards kube-system too.
        forged = pod({"nvidia.com/container.app.gpus.devices": "GPU-1"})
        body = json.dumps(review(forged, namespace="kube-system")).encode()
        ask = urllib.request.Request(
            f"{url}/validate", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(ask, context=trust, timeout=10) as response:
            assert json.loads(response.read())["response"]["allowed"] is False
    finally:
        server.send_signal(signal.SIGTERM)
        _, stderr = server.communicate(timeout=30)
    assert server.returncode == 0, stderr
    assert "validate denied CREATE pods kube-system/p for user 'tenant' (rule scheduler-owned)" in stderr


def test_an_address_it_cannot_listen_on_is_one_line_naming_host_and_port(tmp_path: Path) -> None:
    """A mistyped --host is not a busy port: the line names both."""
    files = {name: str(tmp_path / name) for name in ("tls.crt", "tls.key", "ca.crt")}
    made = gpufrac(
        "webhook",
        "--generate-certs",
        "--hosts",
        "localhost",
        "--tls-cert",
        files["tls.crt"],
        "--tls-key",
        files["tls.key"],
        "--ca-cert",
        files["ca.crt"],
    )
    assert made.returncode == 0, made.stderr
    failed = gpufrac(
        "webhook",
        "--host",
        "192.0.2.1",
        "--port",
        "0",
        "--tls-cert",
        files["tls.crt"],
        "--tls-key",
        files["tls.key"],
    )
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    line = failed.stderr.strip().splitlines()[-1]
    assert line.startswith("gpufrac: --host 192.0.2.1 --port 0: cannot listen") and "free port" in line


@pytest.mark.parametrize(
    "host", ["bad host!!", "-leading.svc", "a..b", "x\nsubjectAltName = DNS:evil", "a" * 254]
)
def test_a_host_that_is_no_dns_name_or_ip_is_one_line_and_nothing_is_written(
    tmp_path: Path, host: str
) -> None:
    """Hosts go into openssl's config file: only DNS names and IP addresses pass."""
    failed = gpufrac(
        "webhook",
        "--generate-certs",
        "--hosts",
        host,
        "--tls-cert",
        str(tmp_path / "tls.crt"),
        "--tls-key",
        str(tmp_path / "tls.key"),
    )
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert failed.stderr.strip().splitlines() == [
        f"gpufrac: --hosts {host!r}: not a DNS name or an IP address; give names such as "
        "gpufrac-webhook.gpufrac-system.svc, separated by commas"
    ]
    assert list(tmp_path.iterdir()) == []
