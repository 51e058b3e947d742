"""`dspark train`: train a DSpark, DFlash or Eagle3 drafter for a target (the recipe: docs/training.md).

Single process (CPU or one GPU):
    dspark train --target embedded/target --drafter dspark --out runs/dspark --steps 2000

Several GPUs (DDP; every rank runs this same command, torchrun sets RANK / WORLD_SIZE / LOCAL_RANK):
    torchrun --nproc-per-node 8 -m dspark.ops.cli train --target DIR --drafter dspark --out runs/dspark ...
`--batch-size` is per rank, so the global batch is batch_size x grad_accum x ranks. Rank 0 builds the data
cache while the others wait, then each rank reads its own slice of every epoch; rank 0 alone writes
checkpoints, logs and the export. NCCL on GPUs, gloo on CPU.

Outputs: --out gets config.json + model.safetensors (SGLang/DeepSpec layout), train_log.json and README.md (the
card, with this command spelled out in full); --work-dir (default <out>/work) holds the resumable checkpoints
(`--resume` continues from the newest). The generated training data is cached under --data-cache, keyed by the
data settings and the target's weights, so drafters trained on the same settings share it; with --feature-cache
so are the target's outputs on it (models/training/feature_store.py).
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

import torch

from dspark.models.embedded_target.corpus import DEFAULT_HELD_OUT_PERCENT, HELD_OUT_PERCENT_RANGE, default_stdlib_root
from dspark.models.checkpoint import read_drafter_config
from dspark.models.drafters.config import MAX_BLOCK_SIZE, MAX_LAYERS, DrafterConfig
from dspark.models.errors import ConfigError
from dspark.models.training.data import DATA_BOUNDS, SOURCES, DataConfig
from dspark.models.target_io import computes_bf16_natively
from dspark.models.training.run import BLOCK_LOSSES, DrafterSpec, TrainJob, train_job
from dspark.models.training.trainer import DistContext, TrainConfig
from dspark.ops.arg_types import BATCH, SEED, finite_float, int_in, output_dir, torch_device
from dspark.ops.commands.reproduce import reproduce_command
from dspark.ops.commands.threads import add_threads_arg, use_threads

DEFAULT_DATA_CACHE = Path.home() / ".cache" / "dspark" / "train-data"
DIST_TIMEOUT_MINUTES = 180.0  # torch's default is 30 (10 for NCCL in some builds): less than generating the data takes


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("train", help="train a DSpark / DFlash / Eagle3 drafter for a target",
                                   description=__doc__.splitlines()[0])
    io = parser.add_argument_group("target and outputs")
    io.add_argument("--target", type=Path, required=True, help="transformers model directory of the target")
    io.add_argument("--drafter", choices=("dspark", "dflash", "eagle3"), default=None,
                    help="the kind to train (required, unless --init-from-drafter gives it)")
    io.add_argument("--out", type=output_dir, required=True, help="export directory (weights, card, train_log.json)")
    io.add_argument("--work-dir", type=output_dir, default=None, help="checkpoints (default: <out>/work)")
    io.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --work-dir")
    io.add_argument("--save-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    io.add_argument("--slim", action="store_true",
                    help="export without the frozen copies of the target's embedding and lm_head (SGLang shares "
                         "the target's; load_drafter takes them from target_model)")
    io.add_argument("--device", type=torch_device, default=None, help="cpu / cuda (default: cuda if available; torchrun: cuda:LOCAL_RANK)")
    add_threads_arg(io)
    io.add_argument("--dist-timeout-minutes", type=finite_float, default=DIST_TIMEOUT_MINUTES,
                    help="torchrun: how long a rank waits at a collective (rank 0 generating the data or a rank "
                         "writing its feature shard keeps the others waiting), in [1, 10080]")
    io.add_argument("--draft-vocab-size", type=int, default=TrainJob.draft_vocab_size,
                    help="tokens in the exported draft_vocab.json: the most frequent the loss reads; with "
                         "--init-from-drafter, that drafter's vocabulary whole, then the most frequent it lacks "
                         "(models/drafters/draft_vocab.py)")
    io.add_argument("--loss-over-draft-vocab", action="store_true",
                    help="compute the drafter's logits and the loss over that draft vocabulary only, exactly as "
                         "drafting with it proposes (~2x faster steps on SmolLM2; serve the drafter with its "
                         "draft_vocab.json, which dspark's engine and plugin do; an Eagle3 exports SGLang's own "
                         "draft head, d2t)")
    io.add_argument("--loss", choices=tuple(BLOCK_LOSSES), default=TrainJob.loss,
                    help="DSpark/DFlash: sampling (the paper's CE on the data plus total variation to the target) or "
                         "greedy (CE on the target's argmax, confidence on greedy acceptance: matched to greedy "
                         "verification; models/training/losses.py)")
    io.add_argument("--only-draft-vocab", action="store_true",
                    help="write <out>/draft_vocab.json from this recipe's data and stop (for a drafter trained before)")

    d = parser.add_argument_group("drafter", "each setting not given: its default, or with --init-from-drafter that "
                                             "drafter's own")
    d.add_argument("--block-size", type=int_in(1, MAX_BLOCK_SIZE), default=None,
                   help=f"gamma: draft tokens per round (Eagle3: TTT steps; default {DrafterSpec.block_size})")
    d.add_argument("--num-layers", type=int_in(1, MAX_LAYERS), default=None, help="draft layers (default: 5, Eagle3 1)")
    d.add_argument("--target-layer-ids", type=int, nargs="+", default=None,
                   help="tapped target layers (default: 5 spread over 1..L-3, or all but the last for shallow targets)")
    d.add_argument("--markov-head", choices=("vanilla", "gated", "rnn"), default=None,
                   help=f"default {DrafterSpec.markov_head}")
    d.add_argument("--markov-rank", type=int_in(1, 16384), default=None, help=f"default {DrafterSpec.markov_rank}")
    d.add_argument("--no-confidence-head", action="store_true", default=None,
                   help="DSpark without the confidence head")
    d.add_argument("--no-sample-from-anchor", action="store_true", default=None,
                   help="DFlash: original layout [anchor, MASK x gamma] reading slots 1..gamma (SGLang DFLASH)")
    d.add_argument("--mask-token-id", type=int, default=None, help="default: the target tokenizer's mask token")
    d.add_argument("--n-anchors", type=int_in(1, 65536), default=DrafterSpec.n_anchors,
                   help="anchor blocks sampled per sequence")
    d.add_argument("--init-from-target", action="store_true",
                   help="start the draft layers from the target's top layers and fc from a pass-through of the "
                        "deepest tapped layer (default: off, a random init)")

    d.add_argument("--init-from-drafter", type=Path, default=None, metavar="DIR",
                   help="continue training this drafter (e.g. the serving one, on its captured traffic: --data "
                        "CAPTURE_DIR): its settings and draft vocabulary are kept; a drafter flag given that "
                        "differs from its own is refused")

    data = parser.add_argument_group("data")
    data.add_argument("--data-source", choices=SOURCES, default=DataConfig.source,
                      help="generations: the target continues stdlib windows; corpus: the windows themselves; "
                           "chat: the target replies to chat prompts in its chat template")
    data.add_argument("--data", type=Path, default=None, metavar="FILE|DIR",
                      help="train on these regenerated conversations (`dspark regenerate` output, or a folder of "
                           "such files: every *.jsonl in it, e.g. a `dspark serve --capture` folder) instead of "
                           "generating replies: loss on every assistant turn, --prompt-len tokens at most before the "
                           "first reply (longer prompts cut from the left), --prompt-len + --response-len in all; "
                           "--held-out-percent of them held out by prompt, never trained on, their prompts written "
                           "to <out>/held_out.jsonl for `dspark eval`")
    data.add_argument("--prompts-file", type=Path, default=None,
                      help="chat source: .jsonl of {\"turns\": [...]} records (default: the built-in generated set), "
                           "e.g. user turns the target wrote itself (`dspark self-chat`)")
    data.add_argument("--builtin-prompts", type=int, default=None,
                      help="chat source: this many prompts of the built-in generated set too (default: 6000 without "
                           "--prompts-file, 0 with it)")
    data.add_argument("--num-samples", type=int_in(1, DATA_BOUNDS["num_samples"]), default=DataConfig.num_samples)
    data.add_argument("--prompt-len", type=int, default=DataConfig.prompt_len)
    data.add_argument("--response-len", type=int, default=DataConfig.response_len)
    data.add_argument("--temperature", type=finite_float, default=DataConfig.temperature,
                      help="target sampling for the responses (0: greedy)")
    data.add_argument("--top-p", type=finite_float, default=DataConfig.top_p)
    data.add_argument("--top-k", type=int, default=DataConfig.top_k)
    data.add_argument("--data-seed", type=SEED, default=DataConfig.seed)
    data.add_argument("--stdlib", type=Path, default=None, help="stdlib root for prompts (default: this interpreter's)")
    data.add_argument("--held-out-percent", type=int_in(*HELD_OUT_PERCENT_RANGE),
                      default=DEFAULT_HELD_OUT_PERCENT)
    data.add_argument("--data-cache", type=output_dir, default=DEFAULT_DATA_CACHE)
    data.add_argument("--feature-cache", type=output_dir, default=None,
                      help="compute the target's outputs on the training data once into a sharded bf16 store in "
                           "this directory (each torchrun rank writes one shard; a rerun resumes it) and train every "
                           "epoch on it, memory-mapped (default: off, a target forward every step)")
    data.add_argument("--eval-samples", type=int_in(0, 10_000), default=32,
                      help="held-out samples for the acceptance check (0: skip)")
    data.add_argument("--eval-every", type=int, default=0,
                      help="steps between held-out checks (teacher-forced greedy tau, TensorBoard heldout/tau); the "
                           "export is the drafter of the best one (default 0: one check at the end)")

    t = parser.add_argument_group("optimisation")
    t.add_argument("--steps", type=int, default=TrainConfig.steps, help="optimizer steps (the LR schedule spans them)")
    t.add_argument("--minutes", type=finite_float, default=None, help="stop early after this much training wall time")
    t.add_argument("--lr", type=finite_float, default=TrainConfig.lr)
    t.add_argument("--weight-decay", type=finite_float, default=TrainConfig.weight_decay)
    t.add_argument("--warmup-frac", type=finite_float, default=TrainConfig.warmup_frac)
    t.add_argument("--grad-clip", type=finite_float, default=TrainConfig.grad_clip)
    t.add_argument("--batch-size", type=BATCH, default=TrainConfig.batch_size,
                   help="sequences per micro-batch per rank")
    t.add_argument("--grad-accum", type=int_in(1, 1024), default=TrainConfig.grad_accum)
    t.add_argument("--bf16", action="store_true",
                   help="bf16 autocast of the target (data generation, features) and drafter forwards")
    t.add_argument("--fsdp", action="store_true",
                   help="torchrun: shard the drafter's parameters, gradients and optimizer state over the ranks "
                        "(FSDP2) instead of replicating them (DDP); not with --eval-every")
    t.add_argument("--shard-target", action="store_true",
                   help="torchrun: shard the frozen target's decoder layers over the ranks (FSDP2), for a target "
                        "that does not fit on one device; needs --data, and with --fsdp --eval-samples 0")
    t.add_argument("--checkpoint-every", type=int, default=TrainConfig.checkpoint_every,
                   help="steps between checkpoints (0: only at the end)")
    t.add_argument("--keep-checkpoints", type=int_in(1, 10_000), default=TrainConfig.keep_checkpoints,
                   help="the newest checkpoints kept (older ones are deleted: each holds the optimizer state)")
    t.add_argument("--log-every", type=int, default=TrainConfig.log_every)
    t.add_argument("--seed", type=SEED, default=TrainConfig.seed)
    parser.set_defaults(func=handle, _parser=parser)


def dist_context(device: str | None, timeout_minutes: float = DIST_TIMEOUT_MINUTES) -> DistContext:
    """Read torchrun's environment; initialise torch.distributed only when WORLD_SIZE > 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return DistContext(device=torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")))
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available() and device != "cpu":
        torch.cuda.set_device(local)
        backend, dev = "nccl", torch.device("cuda", local)
    else:
        backend, dev = "gloo", torch.device("cpu")
    torch.distributed.init_process_group(backend, timeout=datetime.timedelta(minutes=timeout_minutes))
    return DistContext(rank=rank, world_size=world, device=dev, local_rank=local,
                       local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def checkpoint_flags(config: DrafterConfig) -> dict:
    """The drafter flags (by their dest) that build `config` again: what --init-from-drafter takes for those not
    given, so a fine-tune keeps the drafter's settings (the flags a kind does not read left out)."""
    flags = {"drafter": config.kind, "block_size": config.block_size, "num_layers": config.num_hidden_layers,
             "target_layer_ids": list(config.target_layer_ids), "mask_token_id": config.mask_token_id}
    if config.kind == "dspark":
        flags.update(markov_head=config.markov_head_type, markov_rank=config.markov_rank,
                     no_confidence_head=not config.enable_confidence_head)
    if config.kind != "eagle3":
        flags["no_sample_from_anchor"] = not config.sample_from_anchor
    return flags


def fill_drafter_flags(args: argparse.Namespace) -> None:
    """Each drafter flag not given: with --init-from-drafter that drafter's own (models/training/drafter_init.py
    then refuses a given one that differs, naming it), else its default. Written into args, so the card's command
    spells the settings out."""
    if args.init_from_drafter is not None:
        if not args.init_from_drafter.is_dir():
            raise ConfigError(f"--init-from-drafter {args.init_from_drafter} is not a drafter directory")
        for dest, value in checkpoint_flags(read_drafter_config(args.init_from_drafter)).items():
            if getattr(args, dest) is None:
                setattr(args, dest, value)
    elif args.drafter is None:
        raise ConfigError("--drafter is required (dspark, dflash or eagle3), unless --init-from-drafter DIR gives it")
    defaults = {"block_size": DrafterSpec.block_size, "markov_head": DrafterSpec.markov_head,
                "markov_rank": DrafterSpec.markov_rank, "no_confidence_head": False, "no_sample_from_anchor": False}
    for dest, default in defaults.items():
        if getattr(args, dest) is None:
            setattr(args, dest, default)


def build_job(args: argparse.Namespace) -> TrainJob:
    if not 1 <= args.dist_timeout_minutes <= 10080:
        raise ConfigError(f"--dist-timeout-minutes must be in [1, 10080], got {args.dist_timeout_minutes}")
    if args.draft_vocab_size < 1:
        raise ConfigError(f"--draft-vocab-size must be >= 1, got {args.draft_vocab_size}")
    if args.prompts_file is not None and args.data_source != "chat":
        raise ConfigError(f"--prompts-file is read by --data-source chat only, not {args.data_source!r}")
    if args.prompts_file is not None and not args.prompts_file.is_file():
        raise ConfigError(f"--prompts-file {args.prompts_file} does not exist")
    if args.builtin_prompts is not None and args.data_source != "chat":
        raise ConfigError(f"--builtin-prompts is read by --data-source chat only, not {args.data_source!r}")
    if args.builtin_prompts is not None and (args.builtin_prompts < 0 or
                                             (args.builtin_prompts == 0 and args.prompts_file is None)):
        raise ConfigError(f"--builtin-prompts must be >= 1, or 0 with a --prompts-file; got {args.builtin_prompts}")
    if args.data is not None and not args.data.exists():
        raise ConfigError(f"--data {args.data} does not exist")
    if args.data is not None and (args.prompts_file is not None or args.builtin_prompts is not None
                                  or args.data_source != "generations"):
        raise ConfigError("--data is the training data: it takes no --prompts-file, --builtin-prompts or "
                          "--data-source")
    if args.init_from_drafter is not None and args.init_from_target:
        raise ConfigError("--init-from-drafter and --init-from-target are two starting points: give one")
    fill_drafter_flags(args)
    spec = DrafterSpec(
        kind=args.drafter, block_size=args.block_size, num_layers=args.num_layers,
        target_layer_ids=tuple(args.target_layer_ids) if args.target_layer_ids else None,
        markov_head=args.markov_head, markov_rank=args.markov_rank, confidence_head=not args.no_confidence_head,
        sample_from_anchor=not args.no_sample_from_anchor, n_anchors=args.n_anchors,
    )
    data = DataConfig(
        source=args.data_source, num_samples=args.num_samples, prompt_len=args.prompt_len,
        response_len=args.response_len, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        seed=args.data_seed,
    )
    train = TrainConfig(
        steps=args.steps, max_minutes=args.minutes, lr=args.lr, weight_decay=args.weight_decay,
        warmup_frac=args.warmup_frac, grad_clip=args.grad_clip, batch_size=args.batch_size,
        grad_accum=args.grad_accum, bf16=args.bf16, checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints, log_every=args.log_every, seed=args.seed,
    )
    return TrainJob(
        target_dir=args.target, out_dir=args.out, work_dir=args.work_dir or args.out / "work", spec=spec, data=data,
        train=train, stdlib_root=args.stdlib or default_stdlib_root(), held_out_percent=args.held_out_percent,
        data_cache_dir=args.data_cache, eval_samples=args.eval_samples, eval_every=args.eval_every, fsdp=args.fsdp,
        shard_target=args.shard_target,
        save_dtype=args.save_dtype, slim=args.slim,
        resume=args.resume, mask_token_id=args.mask_token_id, data_path=args.data, prompts_file=args.prompts_file,
        builtin_prompts=args.builtin_prompts,
        feature_cache_dir=args.feature_cache, init_from_target=args.init_from_target,
        init_from_drafter=args.init_from_drafter,
        draft_vocab_size=args.draft_vocab_size, only_draft_vocab=args.only_draft_vocab,
        loss_over_draft_vocab=args.loss_over_draft_vocab, loss=args.loss,
        command=reproduce_command("train", args._parser, args),
    )


def handle(args: argparse.Namespace) -> int:
    job = build_job(args)  # validates everything before any model is loaded
    use_threads(args)
    dist = dist_context(args.device, args.dist_timeout_minutes)
    if args.bf16 and not computes_bf16_natively(dist.device):
        print(f"dspark train: warning: --bf16 on {dist.device}, which has no native bf16 (no avx512_bf16 / AMX): "
              "autocast emulates it, several times slower than float32 here; drop --bf16 on this machine (the "
              "replies and features are then cached under their float32 key)", file=sys.stderr)
    try:
        info = train_job(job, dist)
    finally:
        if dist.world_size > 1:
            torch.distributed.destroy_process_group()
    if info is not None and job.only_draft_vocab:
        print(f"wrote {info['draft_vocab']}")
    elif info is not None:
        losses = ", ".join(f"{k} {v:.4f}" for k, v in info["final_terms"].items() if k not in ("step", "wall_s", "lr"))
        tau = f"; held-out greedy tau {info['held_out']['tau']:.3f}" if info["held_out"] else ""
        minutes = info["wall_s"] / 60
        print(f"wrote {job.out_dir}: {info['kind']}, {info['steps']} steps in {minutes:.1f} min; {losses}{tau}")
    return 0
