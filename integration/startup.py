"""What the plugin does in SGLang's launcher once the DSPARK arguments are resolved, before any weight loads.

The drafter must fit the target (vocab, hidden size, target layer ids, mask token): `read_drafter_config` with
the target's HF config; a CheckpointError naming every mismatch stops the launch before SGLang loads a weight. The
same check refuses a drafter in another trainer's layout that SGLang would serve wrong (a speculators fill-in block
whose slots it would read shifted: models/checkpoint_conventions.py), naming `dspark convert`.

Sampling features that SGLang's DSpark worker cannot serve exactly stop the launch too, by flag name
(`INEXACT_WITH_DSPARK`): a custom logit processor is applied to a whole verify window at once rather than position
by position, and the watermark's sampling is not applied to verify windows at all, so either would make DSpark's
answers differ from the target's. Serve them with `--no-spec`.

The launcher never loads the target. Without `--speculative-dspark-sps-table-path`, the schedulers measure the
SPS table with SGLang's own forward on the model they serve, before the server is ready (sps_forward.py).
"""
from __future__ import annotations

from pathlib import Path

from dspark.models.checkpoint import read_drafter_config
from dspark.models.errors import ConfigError

INEXACT_WITH_DSPARK = {
    "enable_custom_logit_processor": "SGLang's DSpark verify applies a custom logit processor to the whole verify "
                                     "window at once, not position by position",
    "enable_watermark": "SGLang's DSpark verify does not apply the watermark's sampling",
}


def refuse_inexact_features(view) -> None:
    for field, why in INEXACT_WITH_DSPARK.items():
        if getattr(view, field, False):
            raise ConfigError(f"--{field.replace('_', '-')} cannot be served exactly with DSpark: {why}; serve it "
                              "with --no-spec")


def _check_drafter(result, server_args) -> None:
    """AFTER SGLang's `_handle_dspark`: the fit check, and the features DSpark cannot serve exactly."""
    from sglang.srt.arg_groups.speculative_hook import resolving_view
    from transformers import AutoConfig

    view = resolving_view(server_args)
    refuse_inexact_features(view)
    read_drafter_config(view.speculative_draft_model_path, AutoConfig.from_pretrained(str(Path(view.model_path))))


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.arg_groups.speculative_hook._handle_dspark", _check_drafter, HookType.AFTER)
