"""A drafter rolled out to a fleet: one canary first, promoted only when it drafts better on live traffic.

    1. read     GetState on every replica: the drafter each one serves now (its folder, to roll back to)
    2. canary   LoadDrafter on the first `canary` replicas; each refuses a drafter that does not fit by name before it
                loads anything (integration/drafter_swap.py), and a refusal stops here, nothing changed elsewhere
    3. compare  live tau (accepted tokens per verify forward, from WatchState) of the canaries and of the rest of the
                fleet, watched over the same `window_s` on the same traffic:
                    canary tau > fleet tau             promote: every other replica loads the drafter
                    canary tau < fleet tau - margin    roll back: the canaries load their previous drafter again
                    anything else, or a window without traffic on either side: watch another window, at most
                    `windows` of them; then roll back (a drafter that has not shown itself better is not promoted)

With no canary, every replica loads the drafter at once. Tau rather than acceptance at one position: it is what a
user gets per target forward, and it weighs every position by how often the policy verifies it. The windows must
see traffic that both sides serve alike (behind one Service they do).
"""
from __future__ import annotations

from statistics import mean
from typing import Callable, Optional

from dspark.ops.admin.client import AdminClient
from dspark.ops.admin.fleet import FleetResult, ReplicaOutcome, describe, finish, in_parallel, window_tau

PROMOTE, ROLL_BACK, WATCH = "promote", "roll back", "watch"


def verdict(canary_tau: Optional[float], fleet_tau: Optional[float], margin: float) -> str:
    """What one window's taus say (None: that side served no verify forward in the window)."""
    if canary_tau is None or fleet_tau is None:
        return WATCH
    if canary_tau > fleet_tau:
        return PROMOTE
    if canary_tau < fleet_tau - margin:
        return ROLL_BACK
    return WATCH


def roll_out_drafter(clients: list[AdminClient], path: str, canary: int = 0, window_s: float = 30.0,
                     margin: float = 0.1, windows: int = 4,
                     log: Callable[[str], None] = lambda _: None) -> FleetResult:
    outcomes = [ReplicaOutcome(c.address) for c in clients]
    states = in_parallel(clients, lambda c: c.get())
    for outcome, state in zip(outcomes, states):
        if isinstance(state, Exception):
            outcome.result, outcome.detail = "unreachable", describe(state)
    if any(o.result == "unreachable" for o in outcomes):
        return finished(outcomes, "some replicas did not answer: nothing changed")
    previous = [state.drafter.path for state in states]
    first = list(range(canary)) if 0 < canary < len(clients) else list(range(len(clients)))
    log(f"loading {path} on {', '.join(clients[i].address for i in first)}")
    if not load(clients, outcomes, first, path):
        undo(clients, outcomes, first, previous)
        return finished(outcomes, "a replica refused the drafter: every replica that took it loaded its previous one")
    if len(first) == len(clients):
        return finished(outcomes, "")
    rest = [i for i in range(len(clients)) if i not in first]
    decided = WATCH
    for window in range(1, windows + 1):
        taus = in_parallel(clients, lambda c: window_tau(c, window_s))
        if any(isinstance(tau, Exception) for tau in taus):
            failed = next(describe(t) for t in taus if isinstance(t, Exception))
            log(f"window {window}: a replica's stats failed ({failed})")
            decided = ROLL_BACK
            break
        canary_tau, fleet_tau = side_tau(taus, first), side_tau(taus, rest)
        decided = verdict(canary_tau, fleet_tau, margin)
        log(f"window {window}: canary tau {shown_tau(canary_tau)}, fleet tau {shown_tau(fleet_tau)}: {decided}")
        for i in first:
            outcomes[i].detail = f"canary tau {shown_tau(canary_tau)} against the fleet's {shown_tau(fleet_tau)}"
        if decided != WATCH:
            break
    if decided != PROMOTE:
        undo(clients, outcomes, first, previous)
        return finished(outcomes, "the canary did not draft better than the fleet: it loaded its previous drafter")
    log(f"promoting: loading {path} on {', '.join(clients[i].address for i in rest)}")
    if not load(clients, outcomes, rest, path):
        undo(clients, outcomes, range(len(clients)), previous)
        return finished(outcomes, "a replica failed to load it: every replica that took it loaded its previous one")
    return finished(outcomes, "")


def finished(outcomes: list[ReplicaOutcome], summary: str) -> FleetResult:
    for outcome in outcomes:
        if outcome.result == "pending":  # never asked to load it
            outcome.result = "not applied"
    return finish(outcomes, summary)


def load(clients: list[AdminClient], outcomes: list[ReplicaOutcome], which, path: str) -> bool:
    """LoadDrafter on the replicas `which`; whether every one loaded it."""
    replies = in_parallel([clients[i] for i in which], lambda c: c.load_drafter(path))
    loaded = True
    for i, reply in zip(which, replies):
        if isinstance(reply, Exception):
            outcomes[i].result, outcomes[i].detail, loaded = "not applied", describe(reply), False
        else:
            outcomes[i].result = "applied"
    return loaded


def undo(clients: list[AdminClient], outcomes: list[ReplicaOutcome], which, previous: list[str]) -> None:
    """Each of `which` that loaded the drafter loads the one it served before."""
    for i in which:
        if outcomes[i].result != "applied":
            continue
        try:
            clients[i].load_drafter(previous[i])
            outcomes[i].result = "rolled back"
        except Exception as err:  # reported: this replica still serves the new drafter
            outcomes[i].result, outcomes[i].detail = "rollback failed", describe(err)


def side_tau(taus: list, which) -> Optional[float]:
    """The mean window tau of the replicas `which` that served verify forwards (None: none did)."""
    served = [taus[i] for i in which if taus[i] is not None]
    return mean(served) if served else None


def shown_tau(tau: Optional[float]) -> str:
    return "-" if tau is None else f"{tau:.3f}"
