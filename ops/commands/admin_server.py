"""`dspark admin-server`: the gRPC admin API (dspark.admin.v1) for one SGLang replica, as a sidecar process.

    dspark admin-server --sglang-url http://127.0.0.1:30000 --sglang-admin-key-file KEY \\
        --admin-port 50051 --admin-token-file /etc/dspark/tokens/admin --reader-token-file /etc/dspark/tokens/reader

`dspark serve --admin-port P` starts it with the same --admin-* flags (ops/admin/sidecar.py), so the Helm chart
can run either. It stops on SIGTERM/SIGINT within a bound: streams and Restart waits wake at once, calls still
running get server.STOP_GRACE_S, and if anything still holds the process EXIT_DEADLINE_S later it exits
anyway; a second signal exits at once. `sidecar.stop_sidecar` is how a parent (`dspark serve`) stops it:
SIGTERM, a bounded wait, then SIGKILL.
"""
from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path

from dspark.integration.addresses import join_host_port
from dspark.models.cache import cache_root
from dspark.models.errors import ConfigError
from dspark.ops.admin import server, tracing
from dspark.ops.admin.backend import SGLangBackend
from dspark.ops.admin.restart import RestartChannel
from dspark.ops.admin.security import AuditLog, RateLimiter, TlsFiles, read_secret
from dspark.ops.admin.service import AdminService
from dspark.ops.admin.sidecar import add_admin_args, add_otlp_args, check_admin_args
from dspark.ops.arg_types import http_url

EXIT_DEADLINE_S = 5.0  # after the server stopped, what may still hold the process (a profile, a backend call)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("admin-server", help="the gRPC admin API beside one SGLang replica (sidecar)",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--sglang-url", type=http_url, required=True,
                        help="the replica's HTTP address, e.g. http://127.0.0.1:30000")
    parser.add_argument("--sglang-admin-key-file", type=Path, default=None,
                        help="file with SGLang's --admin-api-key (needed for /set_internal_state)")
    parser.add_argument("--supervisor-pid", type=int, default=None,
                        help="(set by `dspark serve`) the process that restarts SGLang on the Restart RPC")
    parser.add_argument("--supervisor-folder", type=Path, default=None,
                        help="(set by `dspark serve`) its private folder, where a restart hands the settings over")
    add_admin_args(parser)
    add_otlp_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    book = check_admin_args(args)
    if args.otlp_endpoint:
        tracing.init(args.otlp_endpoint, f"{args.otlp_service_name}-admin", args.otlp_protocol)
    key = read_secret(args.sglang_admin_key_file, "--sglang-admin-key-file") if args.sglang_admin_key_file else None
    backend = SGLangBackend(args.sglang_url.rstrip("/"), key)
    audit = AuditLog(args.admin_audit_log or cache_root() / "admin" / f"audit-{args.admin_port}.jsonl",
                     args.admin_audit_max_bytes, args.admin_audit_keep)
    if (args.supervisor_pid is None) != (args.supervisor_folder is None):
        raise ConfigError("--supervisor-pid and --supervisor-folder go together")
    if args.supervisor_pid is not None and args.supervisor_pid != os.getppid():
        # the Restart RPC signals this pid: only the `dspark serve` that started this sidecar may receive it
        raise ConfigError(f"--supervisor-pid must be this process's parent (the `dspark serve` that started it, pid "
                          f"{os.getppid()}), got {args.supervisor_pid}")
    restarts = RestartChannel(args.supervisor_folder, args.supervisor_pid) if args.supervisor_pid else None
    service = AdminService(backend, book, RateLimiter(args.admin_update_rate, args.admin_update_burst), audit,
                           restarts=restarts)
    tls = TlsFiles(args.admin_tls_cert, args.admin_tls_key, args.admin_tls_client_ca)
    running = server.start(service, args.admin_host, args.admin_port, tls, args.admin_insecure)
    if args.admin_metrics_port is not None:
        server.metrics_server(audit, args.admin_host, args.admin_metrics_port)
    print(f"dspark admin-server: dspark.admin.v1 on {join_host_port(args.admin_host, running.port)} for "
          f"{args.sglang_url}", flush=True)
    stop = threading.Event()

    def on_signal(number, _frame):
        if stop.is_set():  # the second signal: now
            os._exit(128 + number)
        stop.set()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    stop.wait()
    running.stop()
    # The server's worker threads are joined at exit; one still in a profile or a backend call must not hold it.
    deadline = threading.Timer(EXIT_DEADLINE_S, os._exit, (0,))
    deadline.daemon = True
    deadline.start()
    return 0
