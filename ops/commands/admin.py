"""`dspark admin`: read and change the live DSpark settings of one replica or a whole fleet over gRPC.

    dspark admin get     --replica 127.0.0.1:50051 --token-file reader
    dspark admin set     --dns dspark-admin.ns.svc:50051 --token-file admin --policy threshold --threshold 0.4
    dspark admin set     --k8s-service prod/dspark-admin --canary 1 --canary-wait 60 --max-verify-length null
    dspark admin watch   --replica A --replica B --interval 2 --duration 30
    dspark admin rollback | history | profile-sps | calibrate   (same addressing)
    dspark admin restart --k8s-service prod/dspark-admin --token-file admin   # rolling, one replica at a time
    dspark admin load-drafter --k8s-service prod/dspark-admin --path /models/drafter-v2 --canary 1 --canary-wait 300

Replicas: --replica (repeatable), --dns, --k8s-service (ops/admin/discovery.py); a token is not sent in
plaintext to an address --k8s-service lists off loopback (any pod the EndpointSlice names would read it) unless
--tls-ca or --admin-insecure is given. `set` is the two-phase
fleet change of ops/admin/fleet.py; the exit status is 0 only when every replica converged. `restart` drains
and restarts each replica's SGLang in place, keeping its live settings (ops/admin/restart.py). `load-drafter`
swaps a drafter in live, promoted from the canaries only when their tau beats the rest's
(ops/admin/drafter_rollout.py). Tables by default, JSON with --json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import grpc

from dspark.integration.refit import MIN_SAMPLES_MAX
from dspark.models.errors import ConfigError
from dspark.ops.admin import discovery
from dspark.ops.admin.client import AdminClient, Credentials
from dspark.ops.admin.drafter_rollout import roll_out_drafter
from dspark.ops.admin.convert import message_to_settings
from dspark.ops.admin.fleet import describe, fleet_update, in_parallel, rolling_restart
from dspark.ops.admin.security import read_secret
from dspark.ops.admin.service import DEFAULT_CALIBRATION_SAMPLES, DEFAULT_SPS_SAMPLES
from dspark.ops.admin.restart import DEFAULT_RESTART_TIMEOUT_S, MAX_RESTART_TIMEOUT_S
from dspark.ops.admin.streams import INTERVAL_MAX_S, INTERVAL_MIN_S
from dspark.ops.arg_types import float_in, int_in
from dspark.ops.commands.settings_args import add_settings_patch_args, settings_patch

ACTIONS = ("get", "set", "watch", "rollback", "history", "profile-sps", "calibrate", "restart", "load-drafter")

DAY_S = 86400.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("admin", help="live settings of one replica or a fleet (gRPC admin)",
                                   description=__doc__.splitlines()[0])
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action in ACTIONS:
        sub = actions.add_parser(action)
        add_target_args(sub)
        if action in ("set", "load-drafter"):
            sub.add_argument("--canary", type=int_in(0, 10_000), default=0, help="apply to this many replicas first")
            sub.add_argument("--canary-wait", type=float_in(0, DAY_S), default=30.0,
                             help="seconds the canary must hold (load-drafter: one window of the comparison)")
        if action == "set":
            add_settings_patch_args(sub, "settings to change (models/decoding/settings.py)")
            sub.add_argument("--canary-min-tau", type=float_in(0, 1000), default=None, help="tau the canary must keep")
        if action == "load-drafter":
            sub.add_argument("--path", required=True, help="the drafter folder, absolute, as the replicas see it")
            sub.add_argument("--canary-margin", type=float_in(0, 1000), default=0.1,
                             help="the canary is rolled back once its tau is this far below the fleet's")
            sub.add_argument("--canary-windows", type=int_in(1, 1000), default=4,
                             help="windows to watch before a canary that is not better is rolled back")
        if action == "watch":
            sub.add_argument("--interval", type=float_in(INTERVAL_MIN_S, INTERVAL_MAX_S), default=1.0,
                             help="seconds between stats")
            sub.add_argument("--duration", type=float_in(0.1, 7 * DAY_S), default=10.0,
                             help="stop after this many seconds")
        if action == "rollback":
            sub.add_argument("--to-version", type=int_in(0, 2**63 - 1), default=None,
                             help="default: the previous version")
        if action == "calibrate":
            sub.add_argument("--min-samples", type=int_in(0, MIN_SAMPLES_MAX["refit_sts"]), default=0,
                             help="labelled request-rounds the live window must hold "
                                  f"(0: the default, {DEFAULT_CALIBRATION_SAMPLES})")
        if action == "profile-sps":
            sub.add_argument("--from-traffic", action="store_true",
                             help="fit the table to the round times measured on live traffic instead of profiling")
            sub.add_argument("--min-samples", type=int_in(0, MIN_SAMPLES_MAX["refit_sps"]), default=0,
                             help="--from-traffic: measured rounds the live window must hold "
                                  f"(0: the default, {DEFAULT_SPS_SAMPLES})")
        if action == "restart":
            sub.add_argument("--restart-timeout", type=float_in(0, MAX_RESTART_TIMEOUT_S), default=0.0,
                             help=f"seconds each replica gets to serve again (0: {DEFAULT_RESTART_TIMEOUT_S:g})")
        sub.set_defaults(func=run)


def add_target_args(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("replicas")
    where.add_argument("--replica", action="append", default=[], help="host:port of an admin server (repeatable)")
    where.add_argument("--dns", default=None, help="name:port whose every A record is a replica")
    where.add_argument("--k8s-service", default=None, help="[namespace/]service whose ready endpoints are replicas")
    where.add_argument("--k8s-port-name", default="admin", help="the Service port to use (default: admin)")
    where.add_argument("--kubeconfig", type=Path, default=None, help="default: in-cluster, else $KUBECONFIG")
    auth = parser.add_argument_group("credentials")
    auth.add_argument("--token-file", type=Path, default=None, help="file with the bearer token")
    auth.add_argument("--tls-ca", type=Path, default=None, help="CA to verify the servers (enables TLS)")
    auth.add_argument("--tls-cert", type=Path, default=None, help="client certificate (mTLS)")
    auth.add_argument("--tls-key", type=Path, default=None, help="client key (mTLS)")
    auth.add_argument("--tls-server-name", default=None, help="TLS name to verify instead of the host")
    auth.add_argument("--admin-insecure", action="store_true",
                      help="send the token in plaintext to non-loopback addresses --k8s-service lists")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--timeout", type=float_in(0.1, 3600), default=30.0, help="seconds per call")


def replicas(args: argparse.Namespace) -> list[str]:
    found = discovery.from_list(args.replica)
    if args.dns:
        found += discovery.from_dns(args.dns)
    if args.k8s_service:
        api = discovery.kube_api(args.kubeconfig)
        listed = discovery.from_kubernetes(args.k8s_service, args.k8s_port_name, api)
        if args.token_file is not None and args.tls_ca is None and not args.admin_insecure:
            discovery.refuse_plaintext_off_loopback(listed, "--k8s-service")
        found += listed
    if not found:
        raise ConfigError("no replicas: give --replica, --dns or --k8s-service (and check that they are ready)")
    return list(dict.fromkeys(found))


def clients(args: argparse.Namespace) -> list[AdminClient]:
    token = read_secret(args.token_file, "token file") if args.token_file else None
    credentials = Credentials(token, args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name)
    return [AdminClient(address, credentials, args.timeout) for address in replicas(args)]


def run(args: argparse.Namespace) -> int:
    fleet = clients(args)
    try:
        return ACTION_RUNNERS[args.action](args, fleet)
    finally:
        for client in fleet:
            client.close()


def run_get(args, fleet) -> int:
    states = in_parallel(fleet, lambda c: c.get())
    rows = [{"replica": c.address, **({"error": describe(s)} if isinstance(s, Exception) else
                                      {"version": s.version, "gamma": s.gamma, **message_to_settings(s.settings)})}
            for c, s in zip(fleet, states)]
    emit(args, rows)
    return int(any("error" in r for r in rows))


def run_set(args, fleet) -> int:
    changes = settings_patch(args)
    if not changes:
        raise ConfigError("nothing to set: give at least one setting flag (see `dspark admin set --help`)")
    log = (lambda line: print(line, file=sys.stderr)) if not args.json else (lambda _: None)
    result = fleet_update(fleet, changes, args.canary, args.canary_wait, args.canary_min_tau, log)
    emit(args, [o.to_dict() for o in result.outcomes], summary=result.summary)
    return 0 if result.converged else 1


def run_load_drafter(args, fleet) -> int:
    log = (lambda line: print(line, file=sys.stderr)) if not args.json else (lambda _: None)
    result = roll_out_drafter(fleet, args.path, args.canary, args.canary_wait, args.canary_margin,
                              args.canary_windows, log)
    emit(args, [o.to_dict() for o in result.outcomes], summary=result.summary)
    return 0 if result.converged else 1


def run_rollback(args, fleet) -> int:
    replies = in_parallel(fleet, lambda c: c.rollback(args.to_version))
    rows = [{"replica": c.address, **({"error": describe(r)} if isinstance(r, Exception) else
                                      {"version": r.state.version, **message_to_settings(r.state.settings)})}
            for c, r in zip(fleet, replies)]
    emit(args, rows)
    return int(any("error" in r for r in rows))


def run_history(args, fleet) -> int:
    replies = in_parallel(fleet, lambda c: c.history())
    rows = []
    for client, reply in zip(fleet, replies):
        if isinstance(reply, Exception):
            rows.append({"replica": client.address, "error": describe(reply)})
            continue
        rows += [{"replica": client.address, "version": e.version, "caller": e.caller, "action": e.action,
                  "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(e.time_unix_s)),
                  **message_to_settings(e.settings)} for e in reply.entries]
    emit(args, rows)
    return int(any("error" in r for r in rows))


def run_watch(args, fleet) -> int:
    def stream(client):
        rows, deadline = [], time.monotonic() + args.duration
        try:
            for event in client.watch(args.interval, timeout_s=args.duration + args.timeout):
                if event.HasField("stats"):
                    s = event.stats
                    row = {"replica": client.address, "version": s.state_version, "rounds": s.rounds,
                           "tau": round(s.tau, 3), "verify_budget": round(s.verify_budget_per_request, 3),
                           "drafts": s.drafts_verified, "goodput_tok_s": round(s.goodput_tok_s, 1),
                           "step_overhead_ms": round(1e3 * s.step_overhead_s, 2),
                           "ece": [None if e != e else round(e, 3) for e in s.ece_by_position],
                           "probe_rounds": s.probe_rounds,
                           "sps_error": None if s.sps_table_error_ratio != s.sps_table_error_ratio
                           else round(s.sps_table_error_ratio, 3)}
                    rows.append(row)
                    print(json.dumps(row) if args.json else "  ".join(f"{k}={v}" for k, v in row.items()),
                          flush=True)
                if time.monotonic() >= deadline:
                    break
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
        return rows
    results = in_parallel(fleet, stream)
    failed = [(c.address, r) for c, r in zip(fleet, results) if isinstance(r, Exception)]
    for address, err in failed:
        print(f"{address}: {describe(err)}", file=sys.stderr)
    return int(bool(failed))


def run_profile_sps(args, fleet) -> int:
    replies = in_parallel(fleet, lambda c: c.profile_sps(args.from_traffic, args.min_samples))
    rows = [{"replica": c.address, **({"error": describe(r)} if isinstance(r, Exception) else
                                      {"version": r.state.version, "sps_table": r.sps_table,
                                       "probes": len(r.sample_batch_tokens)})}
            for c, r in zip(fleet, replies)]
    emit(args, rows)
    return int(any("error" in r for r in rows))


def run_calibrate(args, fleet) -> int:
    replies = in_parallel(fleet, lambda c: c.calibrate(args.min_samples))
    rows = [{"replica": c.address, **({"error": describe(r)} if isinstance(r, Exception) else
                                      {"version": r.state.version, "samples": r.samples,
                                       "ece_before": [round(e, 4) for e in r.ece_before],
                                       "sts_temperatures": list(r.state.settings.sts_temperatures)})}
            for c, r in zip(fleet, replies)]
    emit(args, rows)
    return int(any("error" in r for r in rows))


def run_restart(args, fleet) -> int:
    log = (lambda line: print(line, file=sys.stderr)) if not args.json else (lambda _: None)
    result = rolling_restart(fleet, args.restart_timeout, log)
    emit(args, [o.to_dict() for o in result.outcomes], summary=result.summary)
    return 0 if result.converged else 1


def emit(args, rows: list[dict], summary: str = "") -> None:
    if args.json:
        print(json.dumps({"replicas": rows, **({"summary": summary} if summary else {})}, indent=1))
        return
    columns = list(dict.fromkeys(k for row in rows for k in row))
    cells = [[format_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
    if summary:
        print(summary)


def format_cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


ACTION_RUNNERS = {"get": run_get, "set": run_set, "watch": run_watch, "rollback": run_rollback,
                  "history": run_history, "profile-sps": run_profile_sps, "calibrate": run_calibrate,
                  "restart": run_restart, "load-drafter": run_load_drafter}
