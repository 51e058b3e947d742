"""The SPS table measured inside SGLang's scheduler processes, by SGLang's own forward on the model they serve.

Without `--speculative-dspark-sps-table-path`, every scheduler measures the table once its model runner, KV pool
and DSpark worker exist and before the server reports ready (AFTER `Scheduler.maybe_init_dynamic_chunk_sizer`,
the last step of the scheduler's set-up that runs forwards of its own). No process loads a second copy of the
target: the probes are forwards of the served model through the scheduler's `ModelRunner`, with the run's
attention backend and device (on CPU, the CPU recipe).

    probes      batches of R requests x (gamma + 1) new tokens, the token counts of a verify forward, up to
                min(256, max running requests x (gamma + 1)) tokens (models/decoding/sps_profile.py: the sizes,
                the interleaved passes and the envelope are the engine profiler's). Each is an EXTEND forward of
                requests with no cached prefix, set up and released through the scheduler's own pools and tree
                cache (the request lifecycle SGLang's DynamicChunkSizer uses); only the forward is timed. A
                TARGET_VERIFY forward would need a DSpark draft input, so no CUDA graph replays here: on a GPU the
                table is that of the eager forward at these sizes (the round clock's live overhead and the SPS
                refit from traffic then correct it toward the graphs' cost).
    TP          every rank runs the same probes (the forward's collectives need them all); rank 0's table is
                broadcast and every rank writes it beside its own cache (a rank on another node has its own disk)
    cache       <SPS dir>/sglang/<model>-<key>.json, key = model path and revision (without one: config.json's
                content and the weight files' names and sizes), device name (CPU: threads), dtype, TP size and
                attention backend: the next start of the same deployment reads it instead of measuring (source
                "cached"), from any directory of $DSPARK_SPS_DIR (the chart's SPS Job stores its tables in a
                ConfigMap the pods mount there: `dspark serve --profile-sps-only`)

ProfileSps (the admin plane) asks the schedulers to measure again, on the live replica, between rounds: the
`{"profile_sps": {}}` form of a dspark update (refit.py), which becomes a `set` of the measured table.
"""
from __future__ import annotations

import hashlib
import logging
import platform
import time
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import torch
import torch.distributed

from dspark.kernels.sps import SpsTable
from dspark.models.cache import key_digest
from dspark.models.decoding.sps_paths import sps_dirs, sps_write_dir
from dspark.models.decoding.sps_profile import load_sps, measure_table, probe_sizes
from dspark.models.errors import ConfigError

if TYPE_CHECKING:
    from dspark.integration.scheduler_state import SchedulerState

logger = logging.getLogger(__name__)

MAX_PROBE_TOKENS = 256  # the largest verify batch profiled: beyond it the floor rule reuses the last probe
WARMUP, REPEATS = 1, 3
SEED = 0  # the probes' token ids, the same on every TP rank


def cache_key(scheduler) -> dict:
    """What the table depends on: the same key, the same table."""
    runner, args = scheduler.tp_worker.model_runner, scheduler.server_args
    model = Path(args.model_path)
    revision = getattr(args, "revision", None)
    if revision is None and (model / "config.json").is_file():
        revision = content_revision(model)
    device = (torch.cuda.get_device_name() if str(runner.device).startswith("cuda")
              else f"cpu:{platform.machine()}:{torch.get_num_threads()} threads")
    return {"model": str(model.resolve()) if model.exists() else str(model), "revision": revision,
            "device": device, "dtype": str(scheduler.model_config.dtype), "tp_size": int(args.tp_size),
            "attention_backend": type(runner.attn_backend).__name__}


def content_revision(model: Path) -> str:
    """A model directory's revision when none is given: its config.json and the names and sizes of its weight files.
    The same on every copy of the same files (each pod downloads its own; mtimes differ), unlike a timestamp."""
    digest = hashlib.sha256((model / "config.json").read_bytes())
    for weights in sorted(model.glob("*.safetensors")) + sorted(model.glob("*.bin")):
        digest.update(f"{weights.name}:{weights.stat().st_size}".encode())
    return f"content:{digest.hexdigest()[:16]}"


def cache_name(key: dict) -> str:
    return f"{Path(key['model']).name}-{key_digest(key)}.json"


def cache_path(key: dict) -> Path:
    """Where this deployment's table is written: the writable SPS directory's sglang/."""
    return sps_write_dir() / "sglang" / cache_name(key)


def cached_copies(key: dict) -> list[Path]:
    """Where a start looks for this deployment's table, in order: every SPS directory's sglang/ (the chart mounts
    the tables its SPS Job measured at one of them: a persistent home beside the per-pod cache)."""
    return [directory / "sglang" / cache_name(key) for directory in sps_dirs()]


def forward_probe(scheduler) -> Callable[[torch.Tensor], Callable[[], float]]:
    """For measure_table: a forward of `counts` [R] new tokens per request through the scheduler's model runner."""
    from sglang.srt.layers.dp_attention import set_is_extend_in_batch
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.mem_cache.common import release_kv_cache
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.utils.common import get_device_module

    runner, tree_cache = scheduler.tp_worker.model_runner, scheduler.tree_cache
    generator = torch.Generator().manual_seed(SEED)
    vocab = int(scheduler.model_config.vocab_size)

    def setup(counts: torch.Tensor) -> Callable[[], float]:
        ids = [torch.randint(vocab, (int(n),), generator=generator).tolist() for n in counts]

        def seconds() -> float:
            reqs = []
            for i, tokens in enumerate(ids):
                req = Req(rid=f"dspark-sps-{i}", origin_input_text="", origin_input_ids=array("q", tokens),
                          sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
                req.init_next_round_input(tree_cache)  # the scheduler's lifecycle: match, lock, allocate
                req.lock = tree_cache.lock(req.last_node)
                req.extend_end = len(req.full_untruncated_fill_ids)
                reqs.append(req)
            try:
                batch = ScheduleBatch.init_new(reqs, scheduler.req_to_token_pool, scheduler.token_to_kv_pool_allocator,
                                               tree_cache, scheduler.model_config, False, SpeculativeAlgorithm.NONE)
                batch.prepare_for_extend()
                if batch.input_ids is None and batch.prefill_input_ids_cpu is not None:
                    batch.input_ids = batch.prefill_input_ids_cpu.to(runner.device)
                    batch.prefill_input_ids_cpu = None
                forward_batch = ForwardBatch.init_new(batch, runner, return_hidden_states_before_norm=False)
                set_is_extend_in_batch(True)
                device = get_device_module()
                device.synchronize()
                start = time.perf_counter()
                runner.forward(forward_batch=forward_batch)
                device.synchronize()
                return time.perf_counter() - start
            finally:
                for req in reqs:
                    if req.kv.holds_kv:
                        release_kv_cache(req, tree_cache, checkpoint=False)
        return seconds
    return setup


def measure(scheduler, tokens_per_request: int, group: Optional[torch.distributed.ProcessGroup]) -> SpsTable:
    """The table of the served model, measured now on every rank of `group`; rank 0's on all of them."""
    largest = min(MAX_PROBE_TOKENS, int(scheduler.max_running_requests) * tokens_per_request)
    with torch.no_grad():
        table, _ = measure_table(forward_probe(scheduler), probe_sizes(largest, tokens_per_request),
                                 tokens_per_request=tokens_per_request, warmup=WARMUP, repeats=REPEATS,
                                 progress=False)
    return rank0_table(table, group)


def rank0_table(table: Optional[SpsTable], group: Optional[torch.distributed.ProcessGroup]) -> Optional[SpsTable]:
    """Rank 0's `table` (or None) on every rank of `group`."""
    if group is None:
        return table
    carried = [table]
    torch.distributed.broadcast_object_list(carried, group=group, group_src=0)
    return carried[0]


def cached_table(path: Path) -> Optional[SpsTable]:
    """The cached table, or None when there is none or it does not read as one (then it is measured again)."""
    try:
        return load_sps(path) if path.is_file() else None
    except ConfigError as err:
        logger.warning("dspark: measuring the SPS table again: %s", err)
        return None


def table_at_start(state: SchedulerState, scheduler, tokens_per_request: int) -> tuple[Path, str]:
    """The path of this deployment's table and its source: "cached" when rank 0 finds it, else "sglang-forward"
    (measured now, on every rank)."""
    key = cache_key(scheduler)
    path = cache_path(key)
    found = next((table for table in map(cached_table, cached_copies(key)) if table is not None), None)
    cached = rank0_table(found, state.group)
    if cached is not None:
        source, table = "cached", cached
    else:
        began = time.perf_counter()
        source, table = "sglang-forward", measure(scheduler, tokens_per_request, state.group)
        logger.info("dspark: SPS table measured by SGLang's forward in %.1f s: %s", time.perf_counter() - began,
                    table.to_json())
    if source == "sglang-forward" or cached_table(path) != table:  # this rank's disk may not have rank 0's copy
        path.parent.mkdir(parents=True, exist_ok=True)
        table.save(path)
    return path, source
