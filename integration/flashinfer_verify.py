"""Ragged (per-request length) target verify on SGLang's plain FlashInfer attention backend, with CUDA graphs.

SGLang 0.5.23 verifies DSpark's compact ragged layout (`SGLANG_RAGGED_VERIFY_MODE=compact`: request r sends
1 + l_r tokens) only on backends that declare `supports_ragged_verify_graph` (FA3, TRT-LLM, FlashInfer-MLA);
`FlashInferAttnBackend.init_forward_metadata_out_graph` raises NotImplementedError for a ragged layout, which
stops the server while it captures its CUDA graphs, and its eager path trips over layouts built on device
(no host total). With `--attention-backend flashinfer` this module takes over the TARGET_VERIFY planning of a
ragged batch, eager and graphed:

  geometry   kernels/ragged_layout.py: qo_indptr = cumsum(1 + l_r), kv_len = prefix + 1 + l_r, padded to the
             captured slots and token tier the way SGLang pads its layout; kv_indices from SGLang's own KV
             index translator over that kv_indptr; FlashInfer's bottom-right causal mask does the rest.
  graphs     SGLang's runner captures one TARGET_VERIFY graph per token tier (`bs * (gamma + 1)` for each
             captured bs) and many tiers share a slot count, but a FlashInfer CUDA-graph wrapper keeps private
             plan state (its int workspace, the row count fixed at its first plan). So the wrappers are keyed
             by ("ragged", tier), as SGLang's FlashInfer-MLA backend does, created at capture and re-planned
             with the plain `plan()` before each replay (SGLang's `fast_prefill_plan` assumes uniform rows).
  flag       `supports_ragged_verify_graph = True` on each FlashInferAttnBackend once built (an instance
             attribute set after __init__: a HookRegistry REPLACE of the class attribute would rebind unrelated
             module globals that are also False).

Only single-wrapper models are handled (no sliding window, no cross attention); others get an error naming
why. Everything else (decode, extend, uniform verify, draft passes) is SGLang's own code.
"""
from __future__ import annotations

from dspark.kernels.ragged_layout import ragged_verify_geometry

BACKEND = "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend"
RAGGED_KEY = "ragged"


def ragged_verify_batch(forward_batch) -> bool:
    spec_info = getattr(forward_batch, "spec_info", None)
    return (forward_batch.forward_mode.is_target_verify() and spec_info is not None
            and getattr(spec_info, "ragged_verify_layout", None) is not None)


def check_supported(backend) -> None:
    if backend.num_wrappers != 1:
        raise NotImplementedError(
            f"dspark's ragged FlashInfer verify plans single-wrapper attention only; this model needs "
            f"{backend.num_wrappers} wrappers ({backend.dispatch_reason}): use --attention-backend fa3, or "
            "SGLANG_RAGGED_VERIFY_MODE=cap-accept")


def plan_ragged_verify(backend, forward_batch, wrappers, *, num_slots: int, num_tokens: int) -> None:
    """Plan `wrappers` for the ragged verify batch padded to num_slots rows and num_tokens packed tokens."""
    from sglang.srt.mem_cache.kv_loc_plan import IdSpaceKind

    layout = forward_batch.spec_info.ragged_verify_layout
    geometry = ragged_verify_geometry(prefix_lens=forward_batch.seq_lens[:num_slots], verify_lens=layout.verify_lens,
                                      num_slots=num_slots, num_tokens=num_tokens)
    # FlashInfer's plan() copies its indptrs to the host anyway; a graphed wrapper copies kv_indices into its buffer
    kv_indices = geometry.kv_indptr.new_empty(int(geometry.kv_indptr[-1]))
    backend.kv_index_translator.pack_read_stream(
        forward_batch.kv_loc_plan, req_pool_indices=forward_batch.req_pool_indices[:num_slots],
        seq_lens=geometry.kv_lens, indptr=geometry.kv_indptr, out=kv_indices, kind=IdSpaceKind.FULL)
    updater = backend.indices_updater_prefill
    for wrapper in wrappers:
        wrapper.plan(geometry.qo_indptr, geometry.kv_indptr, kv_indices, backend.kv_last_page_len[:num_slots],
                     updater.num_qo_heads, updater.num_kv_heads, updater.head_dim, 1,
                     q_data_type=updater.q_data_type, kv_data_type=updater.data_type, non_blocking=True)


def _eager(original, backend, forward_batch):
    if not ragged_verify_batch(forward_batch):
        return original(backend, forward_batch)
    from sglang.srt.layers.attention.flashinfer_backend import PrefillMetadata

    check_supported(backend)
    wrappers = backend.prefill_wrappers_verify
    plan_ragged_verify(backend, forward_batch, wrappers, num_slots=forward_batch.batch_size,
                       num_tokens=forward_batch.positions.numel())
    backend.forward_metadata = PrefillMetadata(wrappers, False, False)


def _out_graph(original, backend, forward_batch, in_capture: bool = False):
    if not ragged_verify_batch(forward_batch):
        return original(backend, forward_batch, in_capture=in_capture)
    from sglang.srt.layers.attention.flashinfer_backend import PrefillMetadata

    check_supported(backend)
    slots, tier = forward_batch.batch_size, forward_batch.positions.numel()
    key = (RAGGED_KEY, tier)
    if in_capture:
        backend.prefill_cuda_graph_metadata[key] = backend._create_prefill_wrappers(slots)
    wrappers = backend.prefill_cuda_graph_metadata[key]
    plan_ragged_verify(backend, forward_batch, wrappers, num_slots=slots, num_tokens=tier)
    backend.forward_metadata = PrefillMetadata(wrappers, False, False)


def _declare_graph_support(result, backend, *args, **kwargs) -> None:
    if type(backend).__name__ == "FlashInferAttnBackend":  # its subclasses decide for themselves
        backend.supports_ragged_verify_graph = True


def install() -> None:
    """Hooks FlashInferAttnBackend where it can exist: a CUDA device and the flashinfer package (its module
    does not import elsewhere, and the registry would log a failed hook in every CPU server)."""
    import importlib.util

    import torch

    if not torch.cuda.is_available() or importlib.util.find_spec("flashinfer") is None:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{BACKEND}.__init__", _declare_graph_support, HookType.AFTER)
    HookRegistry.register(f"{BACKEND}.init_forward_metadata", _eager, HookType.AROUND)
    HookRegistry.register(f"{BACKEND}.init_forward_metadata_out_graph", _out_graph, HookType.AROUND)
