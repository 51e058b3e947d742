"""dspark's allocator in place of SGLang's DSpark verify-budget planner.

SGLang 0.5.23 plans a DSpark round in two calls on `DSparkVerifyPlanner`: `resolve_verify_token_budget`
(a global argmax over an SPS table, on confidences two rounds old) and `_schedule_verify_lens` (a top-k
over the current survivals under that budget). With a dspark policy selected (runtime_state.py), both
answer from one call of `dspark.kernels.allocate` per round instead:

    lengths l_r = VerifyLengthPolicy(state).lengths(c [R, gamma], lagged c, max length)   (0..gamma)
    budget      = sum_r l_r                     -> resolve_verify_token_budget
    verify_lens = 1 + l_r (the anchor/bonus)    -> _schedule_verify_lens

so SGLang's layout, ragged verify forward and acceptance run unchanged on our lengths. causal and lagged plan
on the SPS table plus the round overhead measured online (models/decoding/round_cost.py `RoundClock`, the
engine's too). `lagged` reads each request's confidences from its previous round, kept per request-pool row and
invalidated when SGLang reuses the row for a new request (`req_to_token_pool.req_generation`). The planner also applies
the state's STS temperatures to the confidence head when the state changes (null: those SGLang loaded).
Policy `sglang` leaves both calls to SGLang. These hooks run only in ragged-verify modes
(`SGLANG_RAGGED_VERIFY_MODE=compact|cap-accept`), where SGLang plans per-request lengths at all.

Under tensor parallelism each TP rank runs its own scheduler and planner on the same batch, and every rank must
plan the same lengths, or their ragged layouts disagree and the verify collectives hang or mix requests. The
confidences (draft model), request-pool rows and generations are replicated by SGLang, and so is the runtime
state: TP rank 0's scheduler alone receives `/set_internal_state` and broadcasts it with the other requests at
the start of a loop iteration (sglang/srt/managers/scheduler_components/request_receiver.py
`SchedulerRequestReceiver.recv_requests` -> `_broadcast_reqs_across_ranks` -> `broadcast_pyobj`, then
managers/scheduler.py `Scheduler.ingest_requests` -> `process_input_requests`), so every rank swaps it in at
the same round boundary. The one rank-local input is the RoundClock's wall-clock overhead: each round, every
rank plans on rank 0's (`agreed`, over the gloo group of the ranks that run the batch).

A round whose drafter the drafting gate skipped (drafting.py) verifies the anchors alone, whatever the policy;
the round clock does not sample it (its cost is not a drafting round's), so the next drafting round's interval
spans both and only ever errs long, as idle gaps do.

Calibration probes: under a confidence policy, the share `probe_round_ratio` of the rounds (spread evenly,
counted alike on every rank) is verified in full, as `fixed` under the same limits, so that the live
calibration window (calibration.py) also holds the target's verdicts on drafts the allocator would have cut:
labels from allocator-cut rounds alone only ever cover the confident prefixes.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Optional

import torch
import torch.distributed

from dspark.integration import live_settings, metrics
from dspark.integration.runtime_state import RuntimeStateStore
from dspark.models.decoding.round_cost import RoundClock
from dspark.models.decoding.verify_length import VerifyLengthPolicy

if TYPE_CHECKING:
    from dspark.integration.scheduler_state import SchedulerState

logger = logging.getLogger(__name__)


class PlannerTrace:
    """Verify budgets of the rounds since the runtime state last changed, and counters since start (the admin
    API's per-interval stats are differences of these), for /get_server_info."""

    def __init__(self):
        self.total = {"rounds": 0, "requests": 0, "drafts": 0, "probe_rounds": 0}
        self.planned_ns: Optional[int] = None  # when the last round was planned (unix ns), for its span
        self.planner_s = 0.0  # how long planning it took
        self.probe = False  # whether the last round was a calibration probe (verified in full)
        self.reset()

    def reset(self) -> None:
        self.rounds = self.requests = self.drafts = 0

    def note(self, requests: int, drafts: int, probe: bool) -> None:
        self.rounds += 1
        self.requests += requests
        self.drafts += drafts
        self.probe = probe
        for key, value in (("rounds", 1), ("requests", requests), ("drafts", drafts), ("probe_rounds", probe)):
            self.total[key] += value

    def report(self) -> dict:
        return {"rounds": self.rounds, "mean_verify_budget": self.drafts / max(self.requests, 1)}

    def totals(self) -> dict:
        return dict(self.total)


def batch_group() -> Optional[torch.distributed.ProcessGroup]:
    """The CPU (gloo) group of the TP ranks that run this scheduler's batch (attention-TP under DP attention;
    the one DSpark's own rank-0 broadcasts use), or None on a single rank."""
    from sglang.srt.layers.dp_attention import get_dp_tp_group

    group = get_dp_tp_group()
    return group.cpu_group if group.world_size > 1 else None


def agreed(local: list[float], group: Optional[torch.distributed.ProcessGroup]) -> list[float]:
    """Rank 0's values on every rank of `group` (None: `local`): a wall-clock measurement every rank must plan on
    alike (the round overhead; a table refit from round times).

    A collective: every rank of the group calls it at the same point, which holds because they plan the same
    batches under the same state and take the same updates between the same rounds."""
    if group is None:
        return local
    values = torch.tensor(local, dtype=torch.float64)
    torch.distributed.broadcast(values, group=group, group_src=0)
    return values.tolist()


def plan_lengths(policy: VerifyLengthPolicy, confidence: torch.Tensor, lagged: Optional[torch.Tensor],
                 max_length: torch.Tensor, clock: RoundClock, group: Optional[torch.distributed.ProcessGroup],
                 now: float) -> torch.Tensor:
    """One round's [R] verify lengths, with causal and lagged planning on the table plus the group's agreed
    overhead; `now` is the round's start (time.perf_counter())."""
    if policy.sps is not None:
        clock.observe(now, policy.sps)
        policy = replace(policy, sps=policy.sps.with_overhead(agreed([clock.overhead()], group)[0]))
    lengths = policy.lengths(confidence, lagged, max_length)
    clock.planned(now, len(lengths) + int(lengths.sum()))
    return lengths


def new_store(gamma: int, sps_table: Optional[str]) -> RuntimeStateStore:
    """The runtime state store of this scheduler: the initial state, with `sps_table` unless it names one."""
    return RuntimeStateStore.from_environment(gamma, sps_table,
                                              on_change=live_settings.write if metrics.reporting_rank() else None)


def _init_store(state: SchedulerState, result, planner, *args, **kwargs) -> None:
    from sglang.srt.runtime_context import get_spec
    from sglang.srt.speculative.ragged_verify import RaggedVerifyMode, read_ragged_verify_mode

    state.group = batch_group()
    planner._dspark_history = {}  # request-pool row -> (generation, confidence [gamma]) of its last round
    planner._dspark_version = -1
    planner._dspark_sps_table = None  # the table the metrics last reported
    planner._dspark_verify_lens = None
    head = planner._confidence_head  # its temperatures as loaded (SGLang's --speculative-dspark-confidence-sts-path)
    planner._dspark_loaded_sts = head.sts_temperatures.clone() if head is not None else None
    given = get_spec().speculative_dspark_sps_table_path
    table = RuntimeStateStore.initial_settings(given).sps_table
    if table is None and read_ragged_verify_mode() is not RaggedVerifyMode.STATIC:
        state.awaiting_table = planner  # its store waits for the table SGLang's forward measures
        return
    state.store = new_store(planner.gamma, given)
    if given is None and table is not None:  # handed over in the state alone (a restart's live settings)
        give_sglang_the_table(planner, table)
    logger.info("dspark planner: %s", state.store.report())


def _table_at_start(state: SchedulerState, result, scheduler, *args, **kwargs) -> None:
    """AFTER the scheduler's set-up, before it serves: without a table, the one SGLang's own forward measures
    (sps_forward.py), and the store on it."""
    from sglang.srt.runtime_context import get_spec

    from dspark.integration import sps_forward

    state.scheduler = scheduler  # ProfileSps measures through it later, between rounds
    planner, state.awaiting_table = state.awaiting_table, None
    if planner is None:
        return
    path, source = sps_forward.table_at_start(state, scheduler, int(get_spec().speculative_num_draft_tokens))
    if source == "sglang-forward":
        state.measured_tables.add(str(path))
    state.store = new_store(planner.gamma, str(path))
    give_sglang_the_table(planner, path)
    logger.info("dspark planner (SPS table %s: %s): %s", source, path, state.store.report())


def give_sglang_the_table(planner, path) -> None:
    """What SGLang's planner does at init with a table path given: plan on it (policy `sglang`), and lay rounds out
    by the planned lengths instead of verifying every draft (`_is_verify_all`, which an uninitialized table sets
    in compact mode, would ignore dspark's lengths too)."""
    from sglang.srt.speculative.dspark_components.dspark_sps import load_sps_table_from_path

    if planner._budget_planner is not None:
        planner._budget_planner.sps_table = load_sps_table_from_path(str(path))
        planner._is_verify_all = False


def lagged_confidence(planner, req_pool_indices: torch.Tensor, confidence: torch.Tensor) -> torch.Tensor:
    """[R, gamma] confidences of each request's previous round (NaN rows: none), then remember this round's."""
    rows = req_pool_indices.to("cpu").long()
    generations = planner.model_runner.req_to_token_pool.req_generation[rows].tolist()
    lagged = torch.full_like(confidence, float("nan"))
    history = planner._dspark_history
    for i, (row, generation) in enumerate(zip(rows.tolist(), generations)):
        seen = history.get(row)
        if seen is not None and seen[0] == generation:
            lagged[i] = seen[1]
        history[row] = (generation, confidence[i])
    return lagged


def _on_state_change(state: SchedulerState, planner) -> None:
    store = state.store
    if planner._dspark_version == store.version:
        return
    planner._dspark_version = store.version
    table = store.planner.state.sps_table
    metrics.observe_state(store.version, store.history[-1].time, table, state.sps_source(table),
                          planner._dspark_sps_table, state.sps_source(planner._dspark_sps_table))
    planner._dspark_sps_table = table
    state.clock.reset()  # samples were taken against the previous table
    head, wanted = planner._confidence_head, store.planner.sts_temperatures
    if head is not None:
        temperatures = planner._dspark_loaded_sts if wanted is None else wanted
        if state.head_temperatures is None or not torch.equal(temperatures.cpu(), state.head_temperatures):
            state.calibration.reset()  # the window describes the calibration in effect
        state.head_temperatures = temperatures.cpu()
        head.sts_temperatures = temperatures.to(planner.device)


def _resolve_budget(state: SchedulerState, original, planner, *, draft_input, confidence, prefix_lens,
                    req_pool_indices):
    store, trace = state.store, state.trace
    planner._dspark_verify_lens, trace.planned_ns = None, None
    if store is not None and state.skipped_round:  # the anchors alone: plain decoding
        _on_state_change(state, planner)
        trace.note(len(req_pool_indices), 0, False)
        planner._dspark_verify_lens = torch.ones(len(req_pool_indices), device=planner.device, dtype=torch.int32)
        draft_input.verify_token_budget = 0
        return 0
    if store is None or confidence is None:
        return original(planner, draft_input=draft_input, confidence=confidence, prefix_lens=prefix_lens,
                        req_pool_indices=req_pool_indices)
    _on_state_change(state, planner)
    policy, settings = store.planner.policy, store.planner.state
    if policy is None:  # SGLang's own planner
        return original(planner, draft_input=draft_input, confidence=confidence, prefix_lens=prefix_lens,
                        req_pool_indices=req_pool_indices)
    current = confidence.detach().float().to("cpu")
    requests, gamma = current.shape
    lagged = lagged_confidence(planner, req_pool_indices, current) if settings.policy == "lagged" else None
    probe = (policy.needs_confidence and settings.probe_round_ratio > 0
             and state.probes.take(settings.probe_round_ratio))
    if probe:  # verify in full, so the calibration window also learns where the allocator would cut
        policy = replace(policy, settings=replace(settings, policy="fixed"))
    max_length = torch.full((requests,), gamma)  # the policy applies max_verify_length and the budget caps
    trace.planned_ns, began = time.time_ns(), time.perf_counter()
    lengths = plan_lengths(policy, current, lagged, max_length, state.clock, state.group, began)
    trace.planner_s = time.perf_counter() - began
    drafts = int(lengths.sum())
    trace.note(requests, drafts, probe)
    metrics.observe_overhead(state.clock.overhead())
    planner._dspark_verify_lens = (1 + lengths).to(device=planner.device, dtype=torch.int32)
    draft_input.verify_token_budget = drafts
    return drafts


def _schedule_verify_lens(original, planner, **kwargs):
    verify_lens, planner._dspark_verify_lens = planner._dspark_verify_lens, None
    return original(planner, **kwargs) if verify_lens is None else verify_lens


PLANNER = "sglang.srt.speculative.dspark_components.dspark_planner.DSparkVerifyPlanner"
SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"


def install(state: SchedulerState) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{PLANNER}.__init__", partial(_init_store, state), HookType.AFTER)
    HookRegistry.register(f"{PLANNER}.resolve_verify_token_budget", partial(_resolve_budget, state), HookType.AROUND)
    HookRegistry.register(f"{PLANNER}._schedule_verify_lens", _schedule_verify_lens, HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.maybe_init_dynamic_chunk_sizer", partial(_table_at_start, state),
                          HookType.AFTER)
