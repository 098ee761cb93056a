"""A real Kubernetes control plane for the chart's tests: etcd and kube-apiserver processes
(built by scripts/install_kube.sh) on loopback ports, RBAC on, an admin client certificate,
and a kubeconfig Helm can use. No kubelet: objects are created and checked, pods never run."""

from __future__ import annotations

import datetime
import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bklib.testing.ports import free_port
from bklib.testing.zkserver import terminate
from tests.cli_helpers import REPO


def binaries() -> Path:
    """The directory holding kube-apiserver and etcd (the script prints it)."""
    out = subprocess.run(
        [str(REPO / "scripts" / "install_kube.sh")], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


def _pki(directory: Path) -> dict[str, Path]:
    """A CA, the API server's serving certificate, an admin client certificate
    (O=system:masters) and the service-account signing key, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def key() -> rsa.RSAPrivateKey:
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def write(name: str, data: bytes) -> Path:
        path = directory / name
        path.write_bytes(data)
        return path

    def pem_key(k: rsa.RSAPrivateKey) -> bytes:
        return k.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )

    ca_key = key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bkaudit test kube CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def issue(name: x509.Name, sans: list[x509.GeneralName]) -> tuple[bytes, bytes]:
        k = key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(ca_name)
            .public_key(k.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), pem_key(k)

    import ipaddress

    server = issue(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    admin = issue(
        x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                x509.NameAttribute(NameOID.COMMON_NAME, "bkaudit-test-admin"),
            ]
        ),
        [],
    )
    sa = key()
    return {
        "ca": write("ca.crt", ca.public_bytes(serialization.Encoding.PEM)),
        "server_crt": write("server.crt", server[0]),
        "server_key": write("server.key", server[1]),
        "admin_crt": write("admin.crt", admin[0]),
        "admin_key": write("admin.key", admin[1]),
        "sa_key": write("sa.key", pem_key(sa)),
        "sa_pub": write(
            "sa.pub",
            sa.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        ),
    }


@dataclass
class KubeApi:
    """A running API server and an admin client for it."""

    url: str
    kubeconfig: Path
    context: ssl.SSLContext

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """A JSON request as the admin; returns the status and the decoded body."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def readyz(self, verbose: bool = False) -> str:
        """``/readyz`` (plain text: ``ok`` when ready); ``verbose`` names each check."""
        try:
            with urllib.request.urlopen(
                self.url + "/readyz" + ("?verbose" if verbose else ""),
                context=self.context,
                timeout=10,
            ) as resp:
                return str(resp.read().decode())
        except urllib.error.HTTPError as exc:
            return str(exc.read().decode())
        except OSError as exc:
            return str(exc)

    def get(self, path: str) -> Any:
        status, body = self.request("GET", path)
        assert status == 200, (path, status, body)
        return body

    def can(self, user: str, groups: list[str], **attributes: str) -> bool:
        """What ``kubectl auth can-i --as USER`` answers: a SubjectAccessReview."""
        status, review = self.request(
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {"user": user, "groups": groups, "resourceAttributes": attributes},
            },
        )
        assert status == 201, review
        return bool(review["status"].get("allowed"))


@contextmanager
def kube_apiserver(work: Path) -> Iterator[KubeApi]:
    """etcd plus kube-apiserver (RBAC) on free loopback ports, stopped afterwards."""
    bins = binaries()
    work.mkdir(parents=True, exist_ok=True)
    pki = _pki(work)
    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    logs = [open(work / "etcd.log", "ab"), open(work / "kube-apiserver.log", "ab")]  # noqa: SIM115
    etcd = subprocess.Popen(
        [str(bins / "etcd"), "--data-dir", str(work / "etcd"),
         "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
         "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
         "--initial-cluster", f"default=http://127.0.0.1:{peer_port}"],
        stdout=logs[0], stderr=subprocess.STDOUT,
    )  # fmt: skip
    api = subprocess.Popen(
        [str(bins / "kube-apiserver"),
         f"--etcd-servers=http://127.0.0.1:{etcd_port}",
         f"--secure-port={api_port}", "--bind-address=127.0.0.1",
         "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
         f"--tls-cert-file={pki['server_crt']}", f"--tls-private-key-file={pki['server_key']}",
         f"--client-ca-file={pki['ca']}",
         "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
         f"--service-account-key-file={pki['sa_pub']}",
         f"--service-account-signing-key-file={pki['sa_key']}",
         "--authorization-mode=RBAC", "--service-cluster-ip-range=10.96.0.0/24",
         f"--cert-dir={work / 'certs'}"],
        stdout=logs[1], stderr=subprocess.STDOUT, env={**os.environ, "GOMAXPROCS": "2"},
    )  # fmt: skip
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    context.load_cert_chain(str(pki["admin_crt"]), str(pki["admin_key"]))
    kubeconfig = work / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "test",
                        "cluster": {
                            "server": f"https://127.0.0.1:{api_port}",
                            "certificate-authority": str(pki["ca"]),
                        },
                    }
                ],
                "users": [
                    {
                        "name": "admin",
                        "user": {
                            "client-certificate": str(pki["admin_crt"]),
                            "client-key": str(pki["admin_key"]),
                        },
                    }
                ],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
                "current-context": "test",
            }
        )
    )
    kube = KubeApi(f"https://127.0.0.1:{api_port}", kubeconfig, context)
    try:
        deadline = time.monotonic() + 180
        while True:
            for proc, log in ((etcd, "etcd.log"), (api, "kube-apiserver.log")):
                if proc.poll() is not None:
                    tail = (work / log).read_text(errors="replace")[-3000:]
                    raise AssertionError(f"{log[:-4]} exited {proc.returncode}:\n{tail}")
            if kube.readyz().strip() == "ok":
                break
            if time.monotonic() > deadline:
                tail = (work / "kube-apiserver.log").read_text(errors="replace")[-3000:]
                raise AssertionError(f"kube-apiserver not ready ({kube.readyz(True)}):\n{tail}")
            time.sleep(0.5)
        yield kube
    finally:
        terminate(api, 20)
        terminate(etcd, 20)
        for f in logs:
            f.close()
