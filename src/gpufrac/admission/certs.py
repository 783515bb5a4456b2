"""The webhook's TLS: a self-signed CA and a serving certificate, made with `openssl`, and kept in a Secret.

The apiserver calls admission webhooks over HTTPS only, trusting the CA bundle in their configuration.
Where cert-manager is installed the Helm chart lets it do this; elsewhere a one-shot Job runs
`gpufrac webhook --generate-certs`, which `install`s a CA and certificate into a Secret and the CA into the
webhook configurations. The `openssl` command (in every Debian-based image, since ca-certificates needs it)
does the cryptography, so gpufrac carries no crypto library of its own. The CA's key is thrown away once
the certificate is signed: nothing else is ever signed with it, and a key that is not kept cannot leak.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import lightkube
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import (
    MutatingWebhookConfiguration,
    ValidatingWebhookConfiguration,
)
from lightkube.resources.core_v1 import Secret
from lightkube.types import PatchType

from gpufrac import writing
from gpufrac.errors import UserError

DEFAULT_DAYS = 3650
# A Secret whose certificate has less left than this is made anew when the Job runs again.
RENEW_DAYS = 90
# The TLS Secret's keys for a Bundle's fields, in their order.
SECRET_KEYS = ("ca.crt", "tls.crt", "tls.key")
# A host name the certificate may name: dot-separated labels of letters, digits and inner hyphens (the first
# may be `*`), 253 characters at most. Hosts go into openssl's config file, so nothing else may pass.
_LABEL = r"[A-Za-z0-9](?:[-A-Za-z0-9]{0,61}[A-Za-z0-9])?"
_DNS_NAME = re.compile(rf"(?=.{{1,253}}$)(?:\*|{_LABEL})(?:\.{_LABEL})*")


@dataclass(frozen=True)
class Bundle:
    """PEM bytes: the CA certificate (the webhook configurations' caBundle), the serving certificate and
    its key."""

    ca: bytes
    cert: bytes
    key: bytes


def service_hosts(service: str, namespace: str) -> list[str]:
    """The names the apiserver may use for a Service: `svc`, `svc.ns`, `svc.ns.svc`, and the full one."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def generate(hosts: Sequence[str], *, days: int = DEFAULT_DAYS) -> Bundle:
    """A new CA and a serving certificate for `hosts` (DNS names or IP addresses), both EC P-256."""
    if not hosts:
        raise UserError("a serving certificate needs at least one host name or IP address")
    for host in hosts:
        if not (_is_ip(host) or _DNS_NAME.fullmatch(host)):
            raise UserError(
                f"--hosts {host!r}: not a DNS name or an IP address; give names such as "
                "gpufrac-webhook.gpufrac-system.svc, separated by commas"
            )
    with tempfile.TemporaryDirectory(prefix="gpufrac-certs-") as folder:
        work = Path(folder)
        config = work / "openssl.cnf"
        config.write_text(_config(hosts))
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        config_args = ["-config", str(config)]
        ca_args = [
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            str(days),
            "-subj",
            "/CN=gpufrac-webhook-ca",
        ]
        _openssl(["req", "-x509", "-new", *config_args, "-extensions", "ca", *ec, *ca_args], work)
        csr_args = ["-keyout", "tls.key", "-out", "tls.csr", "-subj", f"/CN={hosts[0]}"]
        _openssl(["req", "-new", *config_args, *ec, *csr_args], work)
        signing = ["-CA", "ca.crt", "-CAkey", "ca.key", "-set_serial", f"0x{secrets.token_hex(16)}"]
        leaf = ["-days", str(days), "-extfile", str(config), "-extensions", "leaf", "-out", "tls.crt"]
        _openssl(["x509", "-req", "-in", "tls.csr", *signing, *leaf], work)
        return Bundle(
            ca=(work / "ca.crt").read_bytes(),
            cert=(work / "tls.crt").read_bytes(),
            key=(work / "tls.key").read_bytes(),
        )


def still_valid(bundle: Bundle, hosts: Sequence[str], *, min_days: int = RENEW_DAYS) -> bool:
    """Whether `bundle`'s certificate chains to its CA, names every host and has `min_days` left."""
    with tempfile.TemporaryDirectory(prefix="gpufrac-certs-") as folder:
        work = Path(folder)
        (work / "ca.crt").write_bytes(bundle.ca)
        (work / "tls.crt").write_bytes(bundle.cert)
        try:
            _openssl(["verify", "-CAfile", "ca.crt", "tls.crt"], work)
            _openssl(["x509", "-in", "tls.crt", "-noout", "-checkend", str(min_days * 86400)], work)
            for host in hosts:
                check = "-checkip" if _is_ip(host) else "-checkhost"
                out = _openssl(["x509", "-in", "tls.crt", "-noout", check, host], work)
                if "does NOT match" in out:
                    return False
        except UserError:
            return False
    return True


def write(bundle: Bundle, *, cert: Path, key: Path, ca: Path | None = None) -> None:
    """Write the bundle's files, all or none (`writing.write_all`): a failure leaves no new certificate
    without its key, which a webhook restarted on them could not load. The key is readable by its owner only,
    from its first byte, even where an old key file was readable by all."""
    files: list[tuple[Path, bytes, int | None]] = [(cert, bundle.cert, 0o644), (key, bundle.key, 0o600)]
    files += [(ca, bundle.ca, 0o644)] if ca is not None else []
    writing.write_all(files)


async def install(
    client: lightkube.AsyncClient,
    *,
    namespace: str,
    secret: str,
    hosts: Sequence[str],
    webhook_configurations: Sequence[str],
) -> Bundle:
    """Keep a valid bundle in the TLS Secret `namespace/secret` (reusing one that still serves `hosts`),
    then set its CA as the caBundle of every webhook in the Mutating- and ValidatingWebhookConfigurations
    named `webhook_configurations`. Safe to run again: a Helm upgrade resets the caBundles it patches."""
    bundle = None
    try:
        found = await client.get(Secret, secret, namespace=namespace)
    except lightkube.ApiError as error:
        if error.status.code != 404:
            raise
        found = None
    if found is not None and found.data:
        parts = [found.data.get(name) for name in SECRET_KEYS]
        if all(parts):
            candidate = Bundle(*(base64.b64decode(part or "") for part in parts))
            if still_valid(candidate, hosts):
                bundle = candidate
    if bundle is None:
        bundle = generate(hosts)
        fields = (bundle.ca, bundle.cert, bundle.key)
        data = {name: base64.b64encode(part).decode() for name, part in zip(SECRET_KEYS, fields, strict=True)}
        if found is None:
            await client.create(
                Secret(
                    metadata=ObjectMeta(name=secret, namespace=namespace), type="kubernetes.io/tls", data=data
                )
            )
        else:
            await client.patch(
                Secret, secret, {"data": data}, namespace=namespace, patch_type=PatchType.MERGE
            )
    ca_bundle = base64.b64encode(bundle.ca).decode()
    patched = 0
    for kind in (MutatingWebhookConfiguration, ValidatingWebhookConfiguration):
        for name in webhook_configurations:
            try:
                configuration = await client.get(kind, name)
            except lightkube.ApiError as error:
                if error.status.code == 404:
                    continue
                raise
            ops = [
                {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": ca_bundle}
                for i in range(len(getattr(configuration, "webhooks", None) or []))
            ]
            if ops:
                await client.patch(kind, name, ops, patch_type=PatchType.JSON)
                patched += 1
    if webhook_configurations and not patched:
        raise UserError(
            f"no Mutating- or ValidatingWebhookConfiguration named {', '.join(webhook_configurations)}; "
            "install the chart's webhook configurations first"
        )
    return bundle


def _config(hosts: Sequence[str]) -> str:
    names = ", ".join(f"IP:{host}" if _is_ip(host) else f"DNS:{host}" for host in hosts)
    return (
        "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = gpufrac-webhook\n"
        "[ca]\nbasicConstraints = critical, CA:TRUE\nkeyUsage = critical, keyCertSign, cRLSign\n"
        "subjectKeyIdentifier = hash\n"
        "[leaf]\nbasicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature\n"
        f"extendedKeyUsage = serverAuth\nsubjectAltName = {names}\nauthorityKeyIdentifier = keyid\n"
    )


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _openssl(arguments: list[str], work: Path) -> str:
    program = shutil.which("openssl")
    if program is None:
        raise UserError(
            "the openssl command is needed to make certificates; install it (apt-get install openssl)"
        )
    done = subprocess.run(
        [program, *arguments], cwd=work, capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise UserError(f"openssl {arguments[0]} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def run(
    *,
    hosts: Sequence[str],
    tls_cert: Path | None,
    tls_key: Path | None,
    ca_cert: Path | None,
    secret: str,
    webhook_configurations: Sequence[str],
    kubeconfig: Path | None,
) -> None:
    """`gpufrac webhook --generate-certs`: into files (`--tls-cert`, `--tls-key`, `--ca-cert`), or into
    the Secret `--secret NAMESPACE/NAME` and the caBundle of `--webhook-configurations` (the chart's Job)."""
    if bool(secret) == bool(tls_cert or tls_key):
        raise UserError(
            "--generate-certs needs either --secret NAMESPACE/NAME (in a cluster) or --tls-cert and "
            "--tls-key (files), not both"
        )
    if not secret:
        if tls_cert is None or tls_key is None:
            raise UserError("--generate-certs into files needs both --tls-cert and --tls-key")
        named = {"--tls-cert": tls_cert, "--tls-key": tls_key, "--ca-cert": ca_cert}
        seen: dict[Path, str] = {}
        for flag, path in named.items():
            if path is not None and (other := seen.setdefault(_resolved(path), flag)) != flag:
                raise UserError(f"{other} and {flag} name the same file {path}; give each its own")
        try:
            write(generate(hosts), cert=tls_cert, key=tls_key, ca=ca_cert)
        except OSError as error:
            raise UserError(f"cannot write the certificate files: {error}") from None
        return
    namespace, slash, name = secret.partition("/")
    if not slash or not namespace or not name:
        raise UserError(f"--secret {secret}: expected NAMESPACE/NAME")

    async def main() -> None:
        from gpufrac.kubeapi import client as kube_client

        config = kube_client.load_config(kubeconfig)
        try:
            async with (
                kube_client.async_client(config, field_manager="gpufrac-webhook-certs") as api,
                kube_client.answered_within(config),
            ):
                await install(
                    api,
                    namespace=namespace,
                    secret=name,
                    hosts=hosts,
                    webhook_configurations=webhook_configurations,
                )
        except kube_client.NO_API_SERVER as error:
            raise kube_client.unreachable(error, config) from None
        except lightkube.ApiError as error:
            raise kube_client.refused(error, config, "install the certificates") from None

    asyncio.run(main())


def _resolved(path: Path) -> Path:
    """`path` with its links followed, or as it is where they loop (writing it then fails, saying so)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop, on Python 3.11
        return path.absolute()
