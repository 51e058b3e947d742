"""What the plugin does in SGLang's launcher once the DSPARK arguments are resolved, before any traffic.

1. The drafter must fit the target (vocab, hidden size, target layer ids, mask token):
   `read_drafter_config` with the target's HF config; a CheckpointError naming every mismatch stops the
   launch before SGLang loads a weight.
2. Ragged verification plans against an SPS table, and SGLang treats a missing one as "verify
   everything". Without `--speculative-dspark-sps-table-path` the plugin profiles the target here
   (models/decoding/sps_profile.py: warm-up, repeats, verify-shaped probes up to a full batch of
   blocks), logs the table, writes it under the SPS directory (models/decoding/sps_paths.py; default
   `$DSPARK_CACHE/sps/`) keyed by target, device, dtype and
   threads, and hands its path to SGLang; later starts reuse it. The probes run the target through
   transformers on the server's device: on CPU that is the same torch-native math SGLang runs; on a GPU
   it omits CUDA graphs, so pass a table from SGLang's own profiler there for the best plans.
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch

from dspark.models.checkpoint import read_drafter_config
from dspark.models.decoding.sps_paths import sps_write_dir

logger = logging.getLogger(__name__)

MAX_PROBE_TOKENS = 256  # the largest verify batch profiled: beyond it the floor rule reuses the last probe
DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
          "float16": torch.float16, "half": torch.float16}


def sps_cache_path(target: Path, device: str, dtype: torch.dtype) -> Path:
    config = target / "config.json"
    key = f"{target.resolve()}|{config.stat().st_mtime_ns}|{device}|{dtype}|{torch.get_num_threads()}"
    return sps_write_dir() / f"{target.name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.json"


def profile_table(target: Path, device: str, dtype: torch.dtype, tokens_per_request: int, max_requests: int):
    """The SPS table of `target` on `device`, measured now (verify-shaped probes up to a full batch of blocks)."""
    from dspark.models.decoding.loading import load_target
    from dspark.models.decoding.sps_profile import probe_sizes, profile_sps

    largest = min(MAX_PROBE_TOKENS, max_requests * tokens_per_request)
    logger.info("dspark: profiling %s on %s up to %d tokens per verify", target, device, largest)
    model = load_target(target, device, dtype, cpu_linears="default").model  # SGLang's own linears
    table, _ = profile_sps(model, probe_sizes(largest, tokens_per_request), tokens_per_request=tokens_per_request,
                           warmup=1, repeats=3)
    return table


def profile_at_start(target: Path, device: str, dtype: torch.dtype, tokens_per_request: int,
                     max_requests: int) -> Path:
    """The cached SPS table of this target on this machine, profiled now if there is none."""
    path = sps_cache_path(target, device, dtype)
    if path.is_file():
        logger.info("dspark: SPS table %s (profiled on an earlier start)", path)
        return path
    table = profile_table(target, device, dtype, tokens_per_request, max_requests)
    path.parent.mkdir(parents=True, exist_ok=True)
    table.save(path)
    logger.info("dspark: SPS table %s: %s", path, table.to_json())
    return path


def _prepare_dspark(result, server_args) -> None:
    """AFTER SGLang's `_handle_dspark`: the fit check, then the SPS table."""
    from sglang.srt.arg_groups.overrides import declare_resolution
    from sglang.srt.arg_groups.speculative_hook import resolving_view
    from sglang.srt.speculative.ragged_verify import RaggedVerifyMode, read_ragged_verify_mode
    from transformers import AutoConfig

    view = resolving_view(server_args)
    target = Path(view.model_path)
    read_drafter_config(view.speculative_draft_model_path, AutoConfig.from_pretrained(str(target)))
    if view.speculative_dspark_sps_table_path or read_ragged_verify_mode() is RaggedVerifyMode.STATIC:
        return
    if not (target / "config.json").is_file():
        logger.warning("dspark: %s is not a local model directory; no SPS table profiled (SGLang will verify "
                       "every draft): pass --speculative-dspark-sps-table-path", target)
        return
    device = "cuda" if str(view.device).startswith("cuda") else "cpu"
    dtype = DTYPES.get(str(view.dtype), torch.float32 if device == "cpu" else torch.bfloat16)
    path = profile_at_start(target, device, dtype, int(view.speculative_num_draft_tokens),
                            int(view.max_running_requests))
    declare_resolution(server_args, "dspark", speculative_dspark_sps_table_path=str(path))


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.arg_groups.speculative_hook._handle_dspark", _prepare_dspark, HookType.AFTER)
