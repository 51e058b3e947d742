"""A throwaway PKI for TLS tests, made with openssl: a CA, a server certificate and a client certificate."""
from __future__ import annotations

import subprocess
from pathlib import Path


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(folder: Path, server_subject: str, server_san: str) -> Path:
    """`folder` with ca.pem, server.pem/.key (subjectAltName `server_san`, e.g. "IP:127.0.0.1") and
    client.pem/.key (CN ops-laptop, for client auth), all signed by the CA (ca.key)."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-keyout", str(folder / "ca.key"), "-out", str(folder / "ca.pem"))
    for name, subject, ext in (("server", server_subject, f"subjectAltName={server_san}"),
                               ("client", "/CN=ops-laptop", "extendedKeyUsage=clientAuth")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", str(folder / f"{name}.key"),
                "-out", str(folder / f"{name}.csr"))
        (folder / f"{name}.ext").write_text(ext + "\n")
        openssl("x509", "-req", "-in", str(folder / f"{name}.csr"), "-CA", str(folder / "ca.pem"), "-CAkey",
                str(folder / "ca.key"), "-CAcreateserial", "-days", "2", "-extfile", str(folder / f"{name}.ext"),
                "-out", str(folder / f"{name}.pem"))
    return folder
