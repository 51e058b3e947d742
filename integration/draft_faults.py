"""A drafter step that raises is retried once, logged and counted, instead of taking the scheduler down with
every request in it.

Runs inside drafting.py's hook AROUND SGLang's `DraftBlockProposer.propose`, around the drafter's forward of one
round (the whole proposal, or only the backbone forward of a round the drafting gate skips). A failure there has
left nothing committed for the round (the target has not verified anything yet, and the draft KV of the block
positions is rewritten by the retry), so running the step again gives the same proposal. A second failure in a
row propagates: a drafter that keeps failing is a broken deployment, which SGLang's own crash handling reports.
Under tensor parallelism a fault on one rank alone cannot be retried this way (the other ranks are already in
the step's collectives); the injected faults below hit every rank at the same step.

Test-only switch: with DSPARK_TEST_DRAFT_FAULT_EVERY=N every N-th draft step raises `InjectedDraftFault`
before the drafter runs (tests/integration/test_api_keys_draft_faults_and_drain.py).
"""
from __future__ import annotations

import logging
import os

from dspark.integration import metrics

logger = logging.getLogger(__name__)

FAULT_ENV = "DSPARK_TEST_DRAFT_FAULT_EVERY"


class InjectedDraftFault(RuntimeError):
    """A drafter failure injected by the test-only switch."""


class FaultInjector:
    def __init__(self, every: int):
        self.every, self.steps = every, 0

    @classmethod
    def from_environment(cls) -> "FaultInjector":
        return cls(int(os.environ.get(FAULT_ENV) or 0))

    def step(self) -> None:
        self.steps += 1
        if self.every and self.steps % self.every == 0:
            raise InjectedDraftFault(f"injected drafter fault at draft step {self.steps} ({FAULT_ENV}={self.every})")


def with_retry(injector: FaultInjector, step, proposer, **kwargs):
    """`step(proposer, **kwargs)`, run again once if it raises (`injector`: the test-only faults)."""
    try:
        injector.step()
        return step(proposer, **kwargs)
    except Exception as err:  # noqa: BLE001  (any drafter failure: retried once, then it propagates)
        logger.warning("dspark: the draft step failed (%s: %s); retrying it once", type(err).__name__, err)
        metrics.observe_draft_fault(type(err).__name__)
        return step(proposer, **kwargs)
