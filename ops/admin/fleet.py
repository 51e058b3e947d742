"""One settings change across many replicas: all of them, or none.

    1. read     GetState on every replica: its version v_r
    2. validate UpdateState(validate_only, expected_version=v_r) on every replica; any refusal stops here,
                with nothing changed anywhere
    3. apply    UpdateState(expected_version=v_r): first to the --canary replicas, which must then hold for
                --canary-wait seconds (health SERVING, their state still the applied version, and tau over the
                window at least --canary-min-tau when given), then to the rest
    4. undo     if any apply fails (a version conflict, a replica gone) or the canary does not hold, every
                replica already changed is rolled back to v_r, conditional on the version it was given

Each replica's outcome is reported; the change converged only when every replica applied it.

A rolling restart (`rolling_restart`) restarts one replica at a time, each only while every other replica
serves, and stops at the first that does not serve again: at most one replica is ever out.
"""
from __future__ import annotations

import contextvars
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Optional

import grpc

from dspark.ops.admin.client import AdminClient
from dspark.ops.admin.streams import INTERVAL_MIN_S


@dataclass
class ReplicaOutcome:
    address: str
    version_before: Optional[int] = None
    version_after: Optional[int] = None
    result: str = "pending"  # applied | validated | refused | rolled back | not applied | unreachable | restarted
    detail: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class FleetResult:
    outcomes: list[ReplicaOutcome]
    converged: bool
    summary: str = ""


def describe(err: Exception) -> str:
    if isinstance(err, grpc.RpcError):
        return f"{err.code().name}: {err.details()}"
    return f"{type(err).__name__}: {err}"


def in_parallel(clients: list[AdminClient], call: Callable[[AdminClient], object]) -> list:
    """call(client) for every client at once, each in a copy of the caller's context (so its trace reaches
    every replica): the result or the exception, in client order."""
    def guarded(client):
        try:
            return call(client)
        except Exception as err:  # reported per replica
            return err
    contexts = [contextvars.copy_context() for _ in clients]
    with ThreadPoolExecutor(max_workers=max(1, len(clients))) as pool:
        return list(pool.map(lambda pair: pair[0].run(guarded, pair[1]), zip(contexts, clients)))


def fleet_update(clients: list[AdminClient], changes: dict, canary: int = 0, canary_wait_s: float = 0.0,
                 canary_min_tau: Optional[float] = None, log: Callable[[str], None] = lambda _: None) -> FleetResult:
    outcomes = [ReplicaOutcome(c.address) for c in clients]
    states = in_parallel(clients, lambda c: c.get())
    for outcome, state in zip(outcomes, states):
        if isinstance(state, Exception):
            outcome.result, outcome.detail = "unreachable", describe(state)
        else:
            outcome.version_before = state.version
    if any(o.result == "unreachable" for o in outcomes):
        return finish(outcomes, "some replicas did not answer: nothing changed")
    checks = in_parallel(clients, lambda c: c.update(changes, outcomes[clients.index(c)].version_before,
                                                     validate_only=True))
    for outcome, check in zip(outcomes, checks):
        outcome.result, outcome.detail = ("validated", "") if not isinstance(check, Exception) else \
            ("refused", describe(check))
    if any(o.result == "refused" for o in outcomes):
        return finish(outcomes, "validation refused on some replicas: nothing changed")
    waves = [list(range(canary)), list(range(canary, len(clients)))] if 0 < canary < len(clients) else \
        [list(range(len(clients)))]
    for number, wave in enumerate(waves):
        log(f"applying to {', '.join(clients[i].address for i in wave)}")
        applied = in_parallel([clients[i] for i in wave],
                              lambda c: c.update(changes, outcomes[clients.index(c)].version_before))
        failed = False
        for i, reply in zip(wave, applied):
            if isinstance(reply, Exception):
                outcomes[i].result, outcomes[i].detail, failed = "not applied", describe(reply), True
            else:
                outcomes[i].result, outcomes[i].version_after = "applied", reply.state.version
        if not failed and number == 0 and len(waves) == 2:
            failed = not canary_holds(clients, outcomes, wave, canary_wait_s, canary_min_tau, log)
        if failed:
            undo(clients, outcomes)
            return finish(outcomes, "the change failed part-way: every replica that took it was rolled back")
    return finish(outcomes, "")


def canary_holds(clients, outcomes, wave, wait_s: float, min_tau: Optional[float], log) -> bool:
    log(f"canary: watching {len(wave)} replica(s) for {wait_s:g} s")
    taus = in_parallel([clients[i] for i in wave], lambda c: window_tau(c, wait_s))
    holds = True
    for i, tau in zip(wave, taus):
        if isinstance(tau, Exception):
            outcomes[i].detail, holds = f"canary: {describe(tau)}", False
            continue
        state = clients[i].get()
        if state.version != outcomes[i].version_after or not clients[i].serving():
            outcomes[i].detail, holds = f"canary: state moved to version {state.version} or not serving", False
        elif min_tau is not None and tau is not None and tau < min_tau:
            outcomes[i].detail, holds = f"canary: tau {tau:.2f} < {min_tau}", False
    return holds


def window_tau(client: AdminClient, seconds: float) -> Optional[float]:
    """Mean tau of the stats intervals with verify forwards during the next `seconds` (None: no traffic)."""
    taus, deadline = [], time.monotonic() + seconds
    if seconds <= 0:
        return None
    try:
        for event in client.watch(interval_s=min(1.0, max(INTERVAL_MIN_S, seconds)), timeout_s=seconds + 5):
            if event.HasField("stats") and event.stats.tau > 0:
                taus.append(event.stats.tau)
            if time.monotonic() >= deadline:
                break
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            raise
    return sum(taus) / len(taus) if taus else None


def undo(clients: list[AdminClient], outcomes: list[ReplicaOutcome]) -> None:
    for client, outcome in zip(clients, outcomes):
        if outcome.result != "applied":
            if outcome.result == "validated":
                outcome.result = "not applied"
            continue
        try:
            reply = client.rollback(to_version=outcome.version_before, expected_version=outcome.version_after)
            outcome.result, outcome.version_after = "rolled back", reply.state.version
        except Exception as err:  # reported: this replica still runs the change
            outcome.result, outcome.detail = "rollback failed", describe(err)


def finish(outcomes: list[ReplicaOutcome], summary: str) -> FleetResult:
    converged = all(o.result == "applied" for o in outcomes)
    return FleetResult(outcomes, converged, summary or ("converged" if converged else "not converged"))


def rolling_restart(clients: list[AdminClient], timeout_s: float = 0.0,
                    log: Callable[[str], None] = lambda _: None) -> FleetResult:
    outcomes = [ReplicaOutcome(c.address) for c in clients]
    for i, client in enumerate(clients):
        others_down = [c.address for c in clients if c is not client and not c.serving()]
        if others_down:
            outcomes[i].detail = f"not restarted: {', '.join(others_down)} not serving"
            break
        log(f"restarting {client.address}")
        try:
            reply = client.restart(timeout_s)
        except Exception as err:  # reported; the next replicas stay up
            outcomes[i].result, outcomes[i].detail = "failed", describe(err)
            break
        outcomes[i].result, outcomes[i].version_after = "restarted", reply.state.version
        outcomes[i].detail = f"serving again after {reply.seconds:.1f} s (start {reply.starts})"
    for outcome in outcomes:
        if outcome.result == "pending":
            outcome.result = "not restarted"
    converged = all(o.result == "restarted" for o in outcomes)
    return FleetResult(outcomes, converged, "every replica restarted" if converged else "not every replica restarted")
