"""Under tensor parallelism every rank plans the same verify lengths, although each measures its own round times.

Two real processes form a gloo group on 127.0.0.1, as two TP ranks' schedulers do. Each feeds its RoundClock
different round timings, then plans the same confidences through `planner.plan_lengths`, the call the SGLang
hook makes each round: on its local overhead alone (what each rank did before the agreement) and with the
group (rank 0's overhead everywhere). Rank 0 gathers both.
"""
import copy
import json
import os
import socket
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dspark.integration import planner
from dspark.integration.runtime_state import ENV_VAR, RuntimeStateStore
from dspark.kernels.sps import SpsTable

# 10 ms per verify forward below 4 tokens, 20 ms from 4. Two requests (2 anchor tokens): with 1 ms of overhead
# per round a 4th token does not pay for the slower forward (lengths [1, 0]); with 100 ms the step barely slows
# and every draft is worth verifying ([4, 4]).
TABLE = SpsTable((1, 4), (100.0, 50.0), 64)
CONFIDENCE = torch.full((2, 4), 0.9)  # [R, gamma], the same on both ranks (the draft model is replicated)
OVERHEAD = (0.001, 0.100)  # seconds per round beyond the verify forward, as rank 0 and rank 1 measure it
ROUNDS = 4
TIMEOUT_S = 30  # a rank left alone in a collective fails the test instead of hanging it


def rank_main(rank: int, port: int, table_path: str, results) -> None:
    os.environ[ENV_VAR] = json.dumps({"policy": "causal"})
    policy = RuntimeStateStore.from_environment(CONFIDENCE.shape[1], table_path).planner.policy
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=TIMEOUT_S))
    try:
        clock, now = planner.RoundClock(), 100.0
        for _ in range(ROUNDS):
            clock.observe(now, TABLE)
            clock.planned(now, 3)
            now += 1.0 / 100.0 + OVERHEAD[rank]
        max_length = torch.full((CONFIDENCE.shape[0],), CONFIDENCE.shape[1])
        alone, together = copy.deepcopy(clock), copy.deepcopy(clock)
        mine = {"local_lengths": planner.plan_lengths(policy, CONFIDENCE, None, max_length, alone, None, now).tolist(),
                "overhead": alone.overhead(),
                "agreed_lengths": planner.plan_lengths(policy, CONFIDENCE, None, max_length, together,
                                                       dist.group.WORLD, now).tolist(),
                # an SPS table refit from each rank's own round times (integration/refit.py)
                "local_refit": clock.costs.fit(TABLE, 1).sample_steps_per_sec,
                "agreed_refit": planner.agreed(list(clock.costs.fit(TABLE, 1).sample_steps_per_sec),
                                               dist.group.WORLD)}
        gathered = [None, None] if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if rank == 0:
            results.put(gathered)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ranks_with_different_round_times_plan_the_same_lengths(tmp_path):
    TABLE.save(tmp_path / "sps.json")
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = [context.Process(target=rank_main, args=(rank, port, str(tmp_path / "sps.json"), results))
             for rank in range(2)]
    for process in ranks:
        process.start()
    try:
        deadline = time.monotonic() + TIMEOUT_S
        for process in ranks:
            process.join(max(0.0, deadline - time.monotonic()))
        assert [process.exitcode for process in ranks] == [0, 0], "a rank failed or hung (its stderr is above)"
        rank0, rank1 = results.get(timeout=5)
    finally:
        for process in ranks:
            if process.is_alive():
                process.terminate()
                process.join(5)

    # Without agreement the ranks would split: their clocks differ, and so do the lengths planned on them.
    assert rank0["overhead"] == pytest.approx(OVERHEAD[0]) and rank1["overhead"] == pytest.approx(OVERHEAD[1])
    assert rank0["local_lengths"] == [1, 0] and rank1["local_lengths"] == [4, 4]
    # With it both plan on rank 0's overhead.
    assert rank0["agreed_lengths"] == rank1["agreed_lengths"] == rank0["local_lengths"]
    # Tables refit from traffic differ per rank too; every rank installs rank 0's.
    assert rank0["local_refit"] != rank1["local_refit"]
    assert rank0["agreed_refit"] == rank1["agreed_refit"] == pytest.approx(list(rank0["local_refit"]))
