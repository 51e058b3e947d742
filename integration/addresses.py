"""host:port and URLs built from a host that may be an IPv6 literal, which must be bracketed ("[::1]:30000",
"http://[::1]:30000"): `--host ::1` used to give the admin sidecar an SGLang URL it could not reach. The one
place that joins or splits them, for dspark serve, the admin plane and replica discovery alike.
"""
from __future__ import annotations

import ipaddress

from dspark.models.errors import ConfigError, shown


def join_host_port(host: str, port: int) -> str:
    """"h:p", bracketing an IPv6 literal (given bare or already bracketed)."""
    host = host.strip("[]")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_host_port(address: str) -> tuple[str, int]:
    """("::1", 50051) from "[::1]:50051"; a ConfigError for anything that is not host:port."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"{shown(address)} is not host:port")
    return host.strip("[]"), int(port)


def http_url(host: str, port: int, scheme: str = "http") -> str:
    return f"{scheme}://{join_host_port(host, port)}"


def is_loopback(host: str) -> bool:
    """Whether `host` ("localhost", an IPv4 or IPv6 literal, bracketed or not) is this machine only."""
    host = host.strip("[]")
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
