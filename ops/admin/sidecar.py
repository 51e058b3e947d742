"""The admin sidecar's command line: its flags, shared by `dspark admin-server` and `dspark serve --admin-port`
(which passes them on), their checks, and how a parent stops the sidecar process.

Here rather than in either command, so that neither command imports the other.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from dspark.models.errors import ConfigError
from dspark.ops.admin.security import AUDIT_KEEP, AUDIT_MAX_BYTES, TlsFiles, TokenBook, check_listen_address
from dspark.ops.arg_types import finite_float, int_in, output_file

DEFAULT_UPDATE_RATE, DEFAULT_UPDATE_BURST = 5.0, 20
AUDIT_MIN_BYTES = 1 << 16  # room for many lines of at most ~4 KB
SIDECAR_STOP_TIMEOUT_S = 15.0  # stop_sidecar: the sidecar's own stop bound (grace + exit deadline) and a margin
OTLP_PROTOCOLS = ("grpc", "http/protobuf")


def add_admin_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("gRPC admin (dspark.admin.v1; docs/admin.md)")
    group.add_argument("--admin-port", type=int, default=None, help="serve the admin API on this port (0: any free)")
    group.add_argument("--admin-host", default="127.0.0.1", help="admin listen address (non-loopback needs TLS "
                                                                  "or --admin-insecure)")
    group.add_argument("--admin-token-file", type=Path, action="append", default=[],
                       help="a file holding one admin bearer token, named by the file name (repeatable)")
    group.add_argument("--reader-token-file", type=Path, action="append", default=[],
                       help="a file holding one read-only bearer token (repeatable)")
    group.add_argument("--admin-tls-cert", type=Path, default=None, help="server certificate (PEM)")
    group.add_argument("--admin-tls-key", type=Path, default=None, help="server private key (PEM)")
    group.add_argument("--admin-tls-client-ca", type=Path, default=None,
                       help="CA of client certificates: mTLS, every client must present one")
    group.add_argument("--admin-insecure", action="store_true",
                       help="allow a plaintext admin port on a non-loopback address")
    group.add_argument("--admin-audit-log", type=output_file, default=None,
                       help="append every update attempt here as JSON lines (default: $DSPARK_CACHE/admin/audit-PORT.jsonl)")
    group.add_argument("--admin-audit-max-bytes", type=int, default=AUDIT_MAX_BYTES,
                       help=f"rotate the audit log past this size (default {AUDIT_MAX_BYTES}: 10 MiB)")
    group.add_argument("--admin-audit-keep", type=int_in(0, 1000), default=AUDIT_KEEP,
                       help=f"rotated audit logs kept: PATH.1 (newest) .. PATH.N (default {AUDIT_KEEP})")
    group.add_argument("--admin-update-rate", type=finite_float, default=DEFAULT_UPDATE_RATE,
                       help="updates per second per caller (token bucket)")
    group.add_argument("--admin-update-burst", type=int, default=DEFAULT_UPDATE_BURST, help="update burst per caller")
    group.add_argument("--admin-metrics-port", type=int_in(0, 65535), default=None,
                       help="Prometheus /metrics of the admin server (update attempts by result)")


def add_otlp_args(parser: argparse.ArgumentParser) -> None:
    """Where traces go (defaults from the standard OTEL_* variables)."""
    env = os.environ.get
    group = parser.add_argument_group("tracing (OpenTelemetry)")
    group.add_argument("--otlp-endpoint", default=env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or
                       env("OTEL_EXPORTER_OTLP_ENDPOINT"), help="OTLP collector: host:port for grpc, a URL for "
                       "http/protobuf (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; unset: no tracing)")
    group.add_argument("--otlp-protocol", choices=OTLP_PROTOCOLS, default=env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or
                       env("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc")
    group.add_argument("--otlp-service-name", default=env("OTEL_SERVICE_NAME") or "dspark",
                       help="service.name of the spans (the admin sidecar adds -admin)")


def admin_arg_list(args: argparse.Namespace) -> list[str]:
    """The --admin-* flags of `args` as a command line (dspark serve passes them on to the sidecar). Paths are made
    absolute but not resolved: Kubernetes mounts Secret files through a symlink it swaps on rotation, and a
    resolved path would point at the old, deleted copy."""
    out = ["--admin-port", str(args.admin_port), "--admin-host", args.admin_host,
           "--admin-update-rate", str(args.admin_update_rate), "--admin-update-burst", str(args.admin_update_burst),
           "--admin-audit-max-bytes", str(args.admin_audit_max_bytes), "--admin-audit-keep", str(args.admin_audit_keep)]
    for flag, paths in (("--admin-token-file", args.admin_token_file), ("--reader-token-file", args.reader_token_file)):
        for path in paths:
            out += [flag, str(Path(path).absolute())]
    for flag, value in (("--admin-tls-cert", args.admin_tls_cert), ("--admin-tls-key", args.admin_tls_key),
                        ("--admin-tls-client-ca", args.admin_tls_client_ca), ("--admin-audit-log", args.admin_audit_log)):
        if value is not None:
            out += [flag, str(Path(value).absolute())]
    if args.admin_metrics_port is not None:
        out += ["--admin-metrics-port", str(args.admin_metrics_port)]
    if args.otlp_endpoint:
        out += ["--otlp-endpoint", args.otlp_endpoint, "--otlp-protocol", args.otlp_protocol,
                "--otlp-service-name", args.otlp_service_name]
    return out + (["--admin-insecure"] if args.admin_insecure else [])


def check_admin_args(args: argparse.Namespace) -> TokenBook:
    """Validate the admin flags before anything starts; the token book they configure."""
    if args.admin_port is None or not 0 <= args.admin_port < 65536:
        raise ConfigError(f"--admin-port must be in 0..65535, got {args.admin_port}")
    if args.admin_update_rate <= 0 or args.admin_update_burst < 1:
        raise ConfigError(f"--admin-update-rate must be > 0 and --admin-update-burst >= 1, got "
                          f"{args.admin_update_rate:g} and {args.admin_update_burst}")
    if args.admin_audit_max_bytes < AUDIT_MIN_BYTES:
        raise ConfigError(f"--admin-audit-max-bytes must be >= {AUDIT_MIN_BYTES}, got {args.admin_audit_max_bytes}")
    book = TokenBook.from_files(args.admin_token_file, args.reader_token_file)
    tls = TlsFiles(args.admin_tls_cert, args.admin_tls_key, args.admin_tls_client_ca)
    if not book.tokens and tls.client_ca is None:
        raise ConfigError("the admin API needs credentials: --admin-token-file (and --reader-token-file), or "
                          "--admin-tls-client-ca for client certificates")
    check_listen_address(args.admin_host, tls.cert is not None, args.admin_insecure)
    return book



def stop_sidecar(process: subprocess.Popen, timeout_s: float = SIDECAR_STOP_TIMEOUT_S) -> int:
    """Stop an admin-server child: SIGTERM, at most `timeout_s` for it to exit (it bounds its own stop well
    within that), then SIGKILL. Its exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            print(f"dspark: the admin sidecar still runs {timeout_s:g} s after SIGTERM; killing it", file=sys.stderr)
            process.kill()
    return process.wait()
