"""Running `gpufrac webhook` for the integration tests and registering it with the session's apiserver.

The webhook runs as the real command, a subprocess serving HTTPS on loopback with a CA and certificate
made by `gpufrac.admission.certs`. It is registered by URL with that CA, using the Mutating- and
ValidatingWebhookConfiguration the Helm chart renders, so the rules under test are the rules deployed;
only the client config and the namespace selector change. The selector matches one label value, which
only the namespaces of the webhook tests carry: a mutating webhook on a shared apiserver must not touch
the pods of every other test in the session.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightkube
from lightkube import codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import (
    MutatingWebhookConfiguration,
    ValidatingWebhookConfiguration,
)
from lightkube.resources.core_v1 import ConfigMap

from gpufrac.admission import certs
from gpufrac.admission.settings import TRUST_LABEL

from .test_helm_chart import helm_template

# Namespaces the registered webhook serves carry this label with the registration's token.
LABEL = "gpufrac.io/webhook-test"


@dataclass
class RunningWebhook:
    """A `gpufrac webhook` subprocess: its URL, the CA that signed its certificate, and its log file."""

    url: str
    ca_file: Path
    log_file: Path
    process: subprocess.Popen[str]

    def log(self) -> str:
        return self.log_file.read_text()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_webhook(folder: Path, *flags: str) -> RunningWebhook:
    """Start `gpufrac webhook` on a free loopback port with a fresh certificate for 127.0.0.1."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_file, cert, key = folder / "ca.crt", folder / "tls.crt", folder / "tls.key"
    certs.write(certs.generate(["127.0.0.1", "localhost"]), cert=cert, key=key, ca=ca_file)
    log_file = folder / "webhook.log"
    command = [sys.executable, "-m", "gpufrac.cli", "webhook", "--host", "127.0.0.1", "--port", "0"]
    command += ["--tls-cert", str(cert), "--tls-key", str(key), *flags]
    with log_file.open("w") as log:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=log, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1")
        )
    assert process.stdout is not None
    line = process.stdout.readline()  # "gpufrac webhook: serving on https://127.0.0.1:PORT"
    if not line.startswith("gpufrac webhook: serving on "):
        process.kill()
        raise AssertionError(f"gpufrac webhook did not start: {line!r}\n{log_file.read_text()}")
    return RunningWebhook(line.split()[-1], ca_file, log_file, process)


def registrations(webhook: RunningWebhook, *, token: str, values: tuple[str, ...] = ()) -> list[Any]:
    """The chart's webhook configurations (rendered with `values`), calling `webhook` by URL, for namespaces
    labelled `token` (and every cluster-scoped object: a namespace selector never skips those)."""
    ca_bundle = base64.b64encode(webhook.ca_file.read_bytes()).decode()
    found = []
    for document in helm_template(*values):
        if document["kind"] not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            continue
        document["metadata"]["name"] = f"{document['metadata']['name']}-{token}"
        for hook in document["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{webhook.url}{path}", "caBundle": ca_bundle}
            # The token instead of the exempt names (Kubernetes 1.20 sets no kubernetes.io/metadata.name);
            # the trust tier's term stays, so each namespace reaches the entry of its tier only.
            tiers = [
                term
                for term in hook["namespaceSelector"].get("matchExpressions", [])
                if term["key"] == TRUST_LABEL
            ]
            hook["namespaceSelector"] = {"matchLabels": {LABEL: token}, "matchExpressions": tiers}
        found.append(codecs.from_dict(document))
    assert len(found) == 2, "the chart renders one Mutating- and one ValidatingWebhookConfiguration"
    return found


def register(
    client: lightkube.Client, webhook: RunningWebhook, values: tuple[str, ...] = ()
) -> tuple[str, list[str]]:
    """Register `webhook`; return the label value that turns it on for a namespace, and what to delete."""
    token = uuid.uuid4().hex[:10]
    names = []
    for configuration in registrations(webhook, token=token, values=values):
        client.create(configuration)
        names.append(configuration.metadata.name)
    return token, names


@contextlib.contextmanager
def serving(
    client: lightkube.Client, folder: Path, *flags: str, values: tuple[str, ...] = ()
) -> Iterator[tuple[RunningWebhook, str]]:
    """`gpufrac webhook` with ``flags``, registered (as the chart renders it with `values`) while in the
    block: the webhook and the token that turns it on for a namespace (`LABEL`)."""
    running = start_webhook(folder, *flags)
    try:
        token, names = register(client, running, values)
        try:
            yield running, token
        finally:
            unregister(client, names)
    finally:
        running.stop()


def unregister(client: lightkube.Client, names: list[str]) -> None:
    for kind in (MutatingWebhookConfiguration, ValidatingWebhookConfiguration):
        for name in names:
            try:
                client.delete(kind, name)
            except lightkube.ApiError as error:
                if error.status.code != 404:
                    raise


def denied_by_webhook(error: lightkube.ApiError) -> str:
    """The webhook's own message in an apiserver refusal: `admission webhook "..." denied the request: M`."""
    message = error.status.message or ""
    assert "denied the request: " in message, message
    return message.split("denied the request: ", 1)[1]


async def wait_until_guarded(client: lightkube.AsyncClient, namespace: str, *, timeout: float = 30) -> None:
    """Until the apiserver has seen both the webhook configurations and the namespace's label: a dry-run
    create of an env ConfigMap as admin (not the scheduler) is refused by the webhook."""
    probe = ConfigMap(metadata=ObjectMeta(name="gpufrac-env-probe", namespace=namespace), data={})
    deadline = time.monotonic() + timeout
    while True:
        try:
            await client.create(probe, dry_run=True)
        except lightkube.ApiError as error:
            if "denied the request" in (error.status.message or ""):
                return
            raise
        if time.monotonic() > deadline:
            raise AssertionError(f"the webhook did not start guarding {namespace} within {timeout:.0f}s")
        await asyncio.sleep(0.1)
