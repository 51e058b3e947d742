"""Options shared by the decoding commands (generate, eval, calibrate): models, sampling, verification."""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from dspark.kernels.warping import SamplingParams
from dspark.models.decoding.loading import (CPU_LINEARS, DEFAULT_CPU_LINEARS, DEFAULT_DRAFT_VOCAB, DEFAULT_DRAFTER_DTYPE,
                                            DRAFT_VOCABS, DRAFTER_DTYPES, Target, load_drafter_for, load_target)
from dspark.models.decoding.settings import SPS_POLICIES
from dspark.models.decoding.sps_profile import load_sps, probe_sizes, profile_sps
from dspark.models.decoding.sts import load_sts
from dspark.models.decoding.verify_length import VerifyLengthPolicy
from dspark.models.errors import ConfigError
from dspark.models.target_io import load_target_config
from dspark.ops.arg_types import BATCH, MAX_NEW_TOKENS, SEED, finite_float, torch_device
from dspark.ops.commands.settings_args import add_settings_args, settings_from_args
from dspark.ops.commands.threads import add_threads_arg, use_threads


def add_model_args(parser: argparse.ArgumentParser, drafter_required: bool = True) -> None:
    group = parser.add_argument_group("models")
    group.add_argument("--target", type=Path, required=True, help="transformers model directory of the target")
    if drafter_required:
        group.add_argument("--drafter", type=Path, required=True, help="drafter checkpoint directory")
    else:
        choice = group.add_mutually_exclusive_group(required=True)
        choice.add_argument("--drafter", type=Path, help="drafter checkpoint directory")
        choice.add_argument("--no-spec", action="store_true", help="decode with the target alone")
    group.add_argument("--device", type=torch_device, default="cpu", help="cpu or cuda")
    add_drafter_dtype_arg(group)
    add_draft_vocab_arg(group)
    add_cpu_linears_arg(group)
    add_threads_arg(group)


def add_drafter_dtype_arg(parser) -> None:
    """--drafter-dtype (models/decoding/loading.py): the drafter's compute dtype, lossless whichever."""
    parser.add_argument("--drafter-dtype", choices=tuple(DRAFTER_DTYPES), default=DEFAULT_DRAFTER_DTYPE,
                        help="auto: bfloat16 beside a float32 target on a CPU with native bf16, else the target's "
                             f"(default: {DEFAULT_DRAFTER_DTYPE})")


def add_draft_vocab_arg(parser) -> None:
    """--draft-vocab (models/decoding/loading.py): whether the drafter drafts over its draft vocabulary."""
    parser.add_argument("--draft-vocab", choices=DRAFT_VOCABS, default=DEFAULT_DRAFT_VOCAB,
                        help="auto: only the tokens of the drafter's draft_vocab.json when it has one (lossless; "
                             f"models/drafters/draft_vocab.py); full: every token (default: {DEFAULT_DRAFT_VOCAB})")


def add_cpu_linears_arg(parser) -> None:
    """--cpu-linears (models/decoding/loading.py): how the target's and drafter's float32 linears compute on CPU."""
    parser.add_argument("--cpu-linears", choices=CPU_LINEARS, default=DEFAULT_CPU_LINEARS,
                        help="auto: each shape and row count the way a load-time probe measures fastest on this CPU "
                             f"(models/decoding/cpu_linears.py); default: PyTorch's (default: {DEFAULT_CPU_LINEARS})")


def dtype_name(drafter) -> str:
    """The drafter's compute dtype as reports record it: 'bfloat16'."""
    return str(drafter.dtype).removeprefix("torch.")


def draft_vocab_size(drafter) -> int:
    """How many tokens the drafter drafts among, as reports record it (its draft vocabulary, or every token)."""
    return drafter.config.vocab_size if drafter.draft_vocab is None else len(drafter.draft_vocab.token_ids)


def add_sampling_args(parser: argparse.ArgumentParser, temperature: float, max_new_tokens: int,
                      batch_size: bool = True) -> None:
    """The sampling flags, and --batch-size unless the command batches requests its own way."""
    group = parser.add_argument_group("sampling")
    group.add_argument("--max-new-tokens", type=MAX_NEW_TOKENS, default=max_new_tokens)
    group.add_argument("--temperature", type=finite_float, default=temperature, help="0: greedy")
    group.add_argument("--top-k", type=int, default=0, help="0: off")
    group.add_argument("--top-p", type=finite_float, default=1.0, help="1: off")
    group.add_argument("--seed", type=SEED, default=0)
    if batch_size:
        group.add_argument("--batch-size", type=BATCH, default=1, help="requests decoded together")


def add_verify_args(parser: argparse.ArgumentParser, defaults: dict | None = None) -> None:
    """The verify-plan settings (settings_args.py) plus the STS calibration file of the drafter."""
    add_settings_args(parser, defaults=defaults)
    parser.add_argument("--sts", type=Path, default=None,
                        help="STS calibration JSON from `dspark calibrate` (--sts-temperatures overrides it)")


def add_drafting_arg(parser: argparse.ArgumentParser) -> None:
    """--drafting alone (models/decoding/settings.py), for the commands that pick their policies themselves."""
    add_settings_args(parser, "drafting gate (models/decoding/drafting_gate.py)", only=("drafting",))


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    try:
        return SamplingParams(args.temperature, args.top_k, args.top_p)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_max_new_tokens(args: argparse.Namespace) -> None:
    """--max-new-tokens against the target's positions, read from its config before any weights load (the engine
    checks each prompt + max_new_tokens again)."""
    positions = getattr(load_target_config(args.target)[0], "max_position_embeddings", None)
    if positions is not None and args.max_new_tokens >= positions:
        raise ConfigError(f"--max-new-tokens {args.max_new_tokens} leaves no room for a prompt in the target's "
                          f"{positions} positions (max_position_embeddings)")


def load_models(args: argparse.Namespace) -> tuple:
    """(target, drafter or None) after validating the paths and --max-new-tokens; sets the thread count."""
    check_max_new_tokens(args)
    use_threads(args)
    target: Target = load_target(args.target, args.device, cpu_linears=args.cpu_linears)
    return target, load_drafter_for(None if getattr(args, "no_spec", False) else args.drafter, target,
                                    args.drafter_dtype, args.cpu_linears, args.draft_vocab)


def verify_policy(args: argparse.Namespace, drafter, target_model=None,
                  batch_size: int = 1) -> tuple[VerifyLengthPolicy, torch.Tensor | None]:
    """The verification-length policy and STS temperatures the options ask for. causal/lagged without
    --sps-table profile the target's SPS curve up to batch_size full blocks first (engine start)."""
    settings = settings_from_args(args)
    sts = torch.tensor(settings.sts_temperatures) if settings.sts_temperatures is not None else None
    if (args.sts is not None or sts is not None) and (drafter is None or drafter.config.kind != "dspark"):
        raise ConfigError("--sts and --sts-temperatures need a DSpark drafter (only DSpark has a confidence head)")
    if drafter is None:  # plain decoding verifies nothing
        return VerifyLengthPolicy(), None
    gamma = drafter.config.gamma
    settings.check_gamma(gamma)
    if sts is None and args.sts is not None:
        sts = load_sts(args.sts, gamma).tensor()
    sps = load_sps(settings.sps_table) if settings.sps_table is not None else None
    if sps is None and settings.policy in SPS_POLICIES and target_model is not None:
        sps = startup_sps(target_model, gamma + 1, batch_size)
    return VerifyLengthPolicy(settings, sps), sts


def startup_sps(target_model, block: int, batch_size: int):
    """The SPS curve of this machine up to batch_size blocks of `block` tokens, measured now (a few seconds)."""
    print(f"profiling the target's verify cost up to {batch_size * block} tokens per forward (--sps-table skips this)")
    return profile_sps(target_model, probe_sizes(batch_size * block, block), tokens_per_request=block,
                       repeats=3, progress=False)[0]
