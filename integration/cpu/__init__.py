"""SGLang's own DSPARK speculative decoding on CPU: the spots where SGLang 0.5.23 assumes a GPU.

`install()` registers hooks with SGLang's HookRegistry (the plugin entry point calls it in every SGLang
process). Each hook changes behaviour only for CPU devices or CPU tensors, so on a GPU machine SGLang
runs untouched. The spots, in the order a request meets them:

1. argument checks: `_handle_dspark` refuses any device but CUDA/NPU/XPU. On CPU the check is passed
   (nothing else in it depends on the device), and `torch_native` becomes a valid draft attention
   backend (SGLang's public `add_draft_attention_backend_choices`), instead of a fallback to FlashInfer.
2. prefill KV injection: the drafter's fused Triton KV write is declined for CPU pools (SGLang then
   uses its per-layer PyTorch path); bf16 only, float32 never builds it.
3. draft block and target verify: `ForwardMode.TARGET_VERIFY` attention in the torch-native backend
   (`verify_attention.py`).
4. the draft attention's Triton table QK-norm+RoPE is switched off where no CUDA device exists (bf16).
5. `Tensor.record_stream` on a CPU tensor (the worker marks `seq_lens` for its stream) is a no-op:
   CPU work has no streams.
6. sampled acceptance: SGLang's Triton chain kernel is replaced for CPU tensors by
   `chain_sampling.py` on dspark's PyTorch verification reference.
CUDA graphs and overlap scheduling stay off on CPU (`dspark serve` passes the flags).
"""
from __future__ import annotations

import functools

import torch

from dspark.integration.cpu.chain_sampling import chain_speculative_sampling
from dspark.integration.cpu.verify_attention import forward_target_verify

_SPEC_HOOK = "sglang.srt.arg_groups.speculative_hook"


class _DeviceView:
    """A server-args view that reports an XPU device, to pass `_handle_dspark`'s device gate on CPU."""

    def __init__(self, view):
        object.__setattr__(self, "_view", view)

    def __getattr__(self, name):
        return "xpu" if name == "device" else getattr(self._view, name)


def _handle_dspark_on_cpu(original, server_args):
    import sglang.srt.arg_groups.speculative_hook as spec_hook

    if not str(spec_hook.resolving_view(server_args).device).startswith("cpu"):
        return original(server_args)
    real_view = spec_hook.resolving_view
    spec_hook.resolving_view = lambda args: _DeviceView(real_view(args))
    try:
        return original(server_args)
    finally:
        spec_hook.resolving_view = real_view


def _no_fused_kv_write_on_cpu(original, self, pool):
    if not pool.get_key_buffer(0).is_cuda:
        return None
    return original(self, pool)


def _no_table_qk_norm_rope_without_cuda(result, self, *args, **kwargs):
    if not torch.cuda.is_available():
        self.use_table_qk_norm_rope = False


def _target_verify_attention(original, self, q, k, v, layer, forward_batch, save_kv_cache=True):
    if forward_batch.forward_mode.is_target_verify():
        return forward_target_verify(self, q, k, v, layer, forward_batch, save_kv_cache)
    return original(self, q, k, v, layer, forward_batch, save_kv_cache)


def _record_stream_on_cpu(original, tensor, stream):
    if tensor.device.type != "cpu":
        original(tensor, stream)


def _chain_sampling_on_cpu(original, *args, **kwargs):
    target_probs = kwargs.get("target_probs", args[9] if len(args) > 9 else None)
    if target_probs is not None and target_probs.device.type == "cpu":
        return chain_speculative_sampling(*args, **kwargs)
    return original(*args, **kwargs)


HOOKS = {
    f"{_SPEC_HOOK}._handle_dspark": _handle_dspark_on_cpu,
    "sglang.srt.models.dspark.DSparkDraftMixin._build_fused_kv_write_bundle": _no_fused_kv_write_on_cpu,
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend":
        _target_verify_attention,
    "torch.Tensor.record_stream": _record_stream_on_cpu,
    "sglang.kernels.ops.speculative.dspark.dspark_accept.chain_speculative_sampling_triton":
        _chain_sampling_on_cpu,
}
AFTER_HOOKS = {
    "sglang.srt.models.dflash.DFlashAttention.__init__": _no_table_qk_norm_rope_without_cuda,
}


@functools.cache
def install() -> None:
    """Register the CPU hooks (idempotent; SGLang applies them after all plugins ran)."""
    from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES, add_draft_attention_backend_choices
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if "torch_native" not in DRAFT_ATTENTION_BACKEND_CHOICES:
        add_draft_attention_backend_choices(["torch_native"])
    for target, hook in HOOKS.items():
        HookRegistry.register(target, hook, HookType.AROUND)
    for target, hook in AFTER_HOOKS.items():
        HookRegistry.register(target, hook, HookType.AFTER)
