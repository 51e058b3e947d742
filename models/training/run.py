"""One drafter-training job end to end: target, data, drafter, trainer, held-out check, export, model card.

`dspark train` (dspark.ops.commands.train) parses the command line and the torchrun environment, then calls
`train_job`. The pieces:

- the target: a transformers causal LM directory (config, weights, tokenizer), frozen (models/target_io.py); with
  --shard-target its decoder layers are FSDP2-sharded over the ranks (sharding.py) and every rank runs each of its
  forwards together: the feature store's writers, the held-out set's replies and every held-out check;
- documents (documents.py): the training split of the CPython stdlib corpus (dspark.models.embedded_target.corpus), tokenized
  with the target's tokenizer; held-out files serve the held-out check. For the chat source the documents are
  chat prompts (a --prompts-file, or the built-in generated set of dspark.models.training.chat_prompts) in the
  target's chat template, split train / held-out by a stable hash of the text. The eval prompt sets are never read;
- DrafterSpec -> DrafterConfig (dims copied from the target) and the matching TrainTask; optionally the drafter
  starts from the target's top layers (target_init.py) and trains on the target's outputs cached once
  (a sharded, memory-mapped feature store: feature_store.py, under its own key);
- export (export.py): config.json + model.safetensors in the SGLang/DeepSpec layout (dspark.models.checkpoint), in the chosen
  dtype, plus train_log.json and a README.md card with the exact command that reproduces it.

Default tapped layers follow the reference's released configs: up to 5 layers spread evenly over 1 .. L-3
(Qwen3-8B's 36 layers give [1, 9, 17, 25, 33]; Qwen3-14B's 40 give [1, 10, 19, 28, 37]); a target too shallow
for that taps every layer but the last (the embedded target's 4 layers give [0, 1, 2]).
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dspark.models.cache import key_digest
from dspark.models.drafters import DRAFTER_CLASSES, Drafter, DrafterConfig
from dspark.models.drafters.draft_vocab import load_draft_vocab
from dspark.models.embedded_target.corpus import load_corpus
from dspark.models.errors import ConfigError
from dspark.models.target_io import load_frozen_target, load_target_config, stop_token_ids, target_fingerprint
from dspark.models.training.data import DataConfig, TokenDataset, build_dataset, load_dataset, save_dataset
from dspark.models.training.conversation_data import conversations_dataset
from dspark.models.training.data_files import HELD_OUT_FILE, read_data, split_conversations, write_held_out
from dspark.models.training.documents import job_documents
from dspark.models.training.export import (config_json, dataset_stats, describe_data, export_drafter, write_card,
                                           write_draft_vocab)
from dspark.models.training.evaluate import decoded_tau, greedy_acceptance
from dspark.models.training.feature_store import (StoredFeatures, StoreLayout, forwards_left, open_store,
                                                  store_directory, write_shard)
from dspark.models.training.losses import DFLASH_GREEDY_LOSS, DFLASH_LOSS, DSPARK_GREEDY_LOSS, DSPARK_LOSS
from dspark.models.training.monitor import RunMonitor
from dspark.models.training.tasks import BlockTask, Eagle3Task, TrainTask
from dspark.models.training.drafter_init import check_same_drafter, init_from_drafter
from dspark.models.training.sharding import shard_frozen_target, world_mesh
from dspark.models.training.target_init import init_from_target
from dspark.models.training.trainer import (LOG_FILE, DistContext, TrainConfig, Trainer, bf16_autocast,
                                           check_fills_a_batch)
from dspark.models.portable_paths import portable

DEFAULT_LAYERS = {"dspark": 5, "dflash": 5, "eagle3": 1}
MAX_TAPS = 5


@dataclass(frozen=True)
class DrafterSpec:
    """The drafter's own settings; its dimensions come from the target."""

    kind: str
    block_size: int = 7  # gamma (Eagle3: the TTT unroll length and chain length)
    num_layers: int | None = None  # default DEFAULT_LAYERS[kind]
    target_layer_ids: tuple[int, ...] | None = None  # default default_target_layer_ids(target layers)
    markov_head: str = "vanilla"
    markov_rank: int = 256
    confidence_head: bool = True
    sample_from_anchor: bool = True
    n_anchors: int = 512

    def __post_init__(self) -> None:
        if self.kind not in DRAFTER_CLASSES:
            raise ConfigError(f"--drafter must be one of {sorted(DRAFTER_CLASSES)}, got {self.kind!r}")
        if self.n_anchors < 1:
            raise ConfigError(f"--n-anchors must be >= 1, got {self.n_anchors}")


def default_target_layer_ids(num_target_layers: int) -> tuple[int, ...]:
    """Up to MAX_TAPS ids spread over 1 .. L-3, or every layer but the last for shallow targets (docstring)."""
    if num_target_layers - 1 <= MAX_TAPS:
        return tuple(range(num_target_layers - 1))
    last = num_target_layers - 3
    return tuple(round(1 + i * (last - 1) / (MAX_TAPS - 1)) for i in range(MAX_TAPS))


def drafter_config(spec: DrafterSpec, target_config, mask_token_id: int | None) -> DrafterConfig:
    layer_ids = spec.target_layer_ids or default_target_layer_ids(target_config.num_hidden_layers)
    common = dict(kind=spec.kind, block_size=spec.block_size, target_layer_ids=layer_ids,
                  num_hidden_layers=spec.num_layers or DEFAULT_LAYERS[spec.kind])
    if spec.kind == "eagle3":
        return DrafterConfig.from_target(target_config, **common)
    if mask_token_id is None:
        raise ConfigError(f"--drafter {spec.kind} needs a mask token: the target tokenizer has no mask_token; "
                          "pass --mask-token-id with an unused vocabulary row")
    heads = {}
    if spec.kind == "dspark":
        heads = dict(markov_rank=spec.markov_rank, markov_head_type=spec.markov_head,
                     enable_confidence_head=spec.confidence_head, confidence_head_with_markov=spec.confidence_head)
    return DrafterConfig.from_target(target_config, mask_token_id=mask_token_id,
                                     sample_from_anchor=spec.sample_from_anchor, **common, **heads)


BLOCK_LOSSES = {  # --loss: (DSpark's weights, DFlash's weights), losses.py
    "sampling": (DSPARK_LOSS, DFLASH_LOSS),
    "greedy": (DSPARK_GREEDY_LOSS, DFLASH_GREEDY_LOSS),
}


def build_task(config: DrafterConfig, n_anchors: int, vocab_ids: torch.Tensor | None = None,
               loss: str = "sampling") -> TrainTask:
    """The drafter's training task; vocab_ids ([V'] sorted) restricts its logits and loss to that draft
    vocabulary, and `loss` picks a block drafter's sampling-matched or greedy-matched loss (losses.py)."""
    if config.kind == "eagle3":
        assert loss == "sampling", "TrainJob refuses --loss greedy for Eagle3"
        return Eagle3Task(config.target_layer_ids, config.block_size, vocab_ids)
    dspark_weights, dflash_weights = BLOCK_LOSSES[loss]
    weights = dspark_weights if config.kind == "dspark" else dflash_weights
    if config.kind == "dspark" and not config.enable_confidence_head:
        weights = dataclasses.replace(weights, conf=0.0)
    return BlockTask(config.target_layer_ids, config.block_size, n_anchors, weights, vocab_ids)


@dataclass(frozen=True)
class TrainJob:
    """Everything `dspark train` decided from its command line."""

    target_dir: Path
    out_dir: Path  # final export + card
    work_dir: Path  # checkpoints and the running train_log.json
    spec: DrafterSpec
    data: DataConfig
    train: TrainConfig
    stdlib_root: Path
    held_out_percent: int
    data_cache_dir: Path
    eval_samples: int = 32  # held-out greedy continuations for the acceptance check (0: skip)
    eval_every: int = 0  # steps between held-out checks during training, keeping the best drafter (0: only the end)
    fsdp: bool = False  # several ranks: the drafter sharded with FSDP2 (sharding.py) instead of replicated by DDP
    shard_target: bool = False  # several ranks: the frozen target's layers sharded with FSDP2 (sharding.py)
    save_dtype: str = "bfloat16"
    slim: bool = False  # export without the frozen embedding / lm_head copies
    resume: bool = False
    mask_token_id: int | None = None  # default: the tokenizer's mask token
    data_path: Path | None = None  # regenerated or captured conversations (a file or a folder: data_files.py), not `data`
    prompts_file: Path | None = None  # chat source: {"turns": [...]} records; None: the built-in generated set
    builtin_prompts: int | None = None  # chat source: how many built-in prompts too (None: all without a file, else 0)
    feature_cache_dir: Path | None = None  # cache the target's outputs here once; None: a target forward per step
    init_from_target: bool = False  # start from the target's top layers (target_init.py), not a random init
    init_from_drafter: Path | None = None  # start from this trained drafter's weights (drafter_init.py)
    draft_vocab_size: int = 8192  # draft_vocab.json: this many of the trained tokens, the most frequent
    loss_over_draft_vocab: bool = False  # logits and loss over draft_vocab.json only (losses.py)
    only_draft_vocab: bool = False  # write draft_vocab.json from the data and stop (a drafter trained before)
    loss: str = "sampling"  # block drafters: "sampling" (the paper's) or "greedy" (matched to greedy verification)
    command: str = ""

    def __post_init__(self) -> None:
        if self.fsdp and self.eval_every:
            raise ConfigError("--eval-every runs the held-out check on rank 0 alone, which an FSDP2-sharded drafter "
                              "cannot: drop --fsdp or --eval-every")
        if self.shard_target and self.data_path is None:
            raise ConfigError("--shard-target needs --data: generating the training replies runs the target on rank 0 "
                              "alone; regenerate them first (`dspark regenerate`, whose SGLang shards the target)")
        if self.shard_target and self.fsdp and self.eval_samples:
            raise ConfigError("--shard-target runs the held-out check on every rank, and --fsdp gathers the drafter on "
                              f"rank 0 alone: with both, pass --eval-samples 0 (got {self.eval_samples})")
        if self.eval_every < 0 or (self.eval_every and not self.eval_samples):
            raise ConfigError(f"--eval-every must be >= 0, and > 0 only with --eval-samples above 0; got "
                              f"{self.eval_every} with --eval-samples {self.eval_samples}")
        if self.loss not in BLOCK_LOSSES:
            raise ConfigError(f"--loss must be one of {', '.join(BLOCK_LOSSES)}, got {self.loss!r}")
        if self.loss != "sampling" and self.spec.kind == "eagle3":
            raise ConfigError(f"--loss {self.loss} trains the block drafters (dspark, dflash); Eagle3 keeps its "
                              "test-time-training loss")


def cached_dataset(documents, cfg: DataConfig, target, eos_id: int, key: dict, cache_dir: Path, dist: DistContext,
                   every_rank: bool = False):
    """Load the dataset for `key` from cache_dir, or build it on rank 0 and save it while the other ranks wait, then
    load it. every_rank: the target is sharded, so every rank builds it together (rank 0 saves; no partial file)."""
    path = cache_dir / f"{key_digest(key)}.pt"
    if every_rank:
        build = bool(dist.max_over_ranks(int(load_dataset(path, key) is None)))
    else:
        build = dist.is_main and load_dataset(path, key) is None
    if build:
        partial = None if every_rank else path.with_suffix(".partial.pt")  # an interrupted run picks it up
        dataset = build_dataset(documents, cfg, target, eos_id, progress=dist.is_main, partial=partial)
        if dist.is_main:
            save_dataset(dataset, key, path)
        if partial is not None:
            partial.unlink(missing_ok=True)
    dist.barrier()
    dataset = load_dataset(path, key)
    assert dataset is not None, f"{path} vanished after it was written"
    return dataset


def stored_target_features(target, dataset: TokenDataset, layer_ids: tuple[int, ...], key: dict, store_root: Path,
                           bf16: bool, dist: DistContext, sharded_target: bool = False) -> StoredFeatures:
    """The target's outputs on `dataset` from the feature store under store_root (feature_store.py): opened when
    complete, else every rank writes (or finishes) its own shard, under bf16 autocast when asked, and all open it;
    with a sharded target every rank runs as many forwards as the one with the most left."""
    key = {**key, "target_layer_ids": list(layer_ids), "dtype": "bfloat16", "autocast": "bfloat16" if bf16 else "none"}
    directory = store_directory(store_root, key)
    lm_head = target.get_output_embeddings()
    hidden = target.config.hidden_size
    layout = StoreLayout(samples=len(dataset), seq_len=dataset.input_ids.shape[1], hidden_width=len(layer_ids) * hidden,
                         last_width=hidden, shards=dist.world_size)
    features = open_store(directory, key, layout, lm_head)
    if features is not None:
        return features
    forwards = dist.max_over_ranks(forwards_left(directory, layout, dist.rank)) if sharded_target else 0
    with bf16_autocast(bf16, dist.device):
        write_shard(directory, key, layout, dist.rank, target, dataset, layer_ids, progress=dist.is_main,
                    forwards=forwards)
    dist.barrier()
    features = open_store(directory, key, layout, lm_head)
    assert features is not None, f"{directory} is incomplete after every rank wrote its shard"
    return features


def file_dataset(job: TrainJob, train: list, tokenizer, eos_id: int) -> TokenDataset:
    """The training split of --data's conversations as samples (conversation_data.py)."""
    if not train:
        raise ConfigError(f"--data {job.data_path}: every conversation falls in the held-out split")
    return conversations_dataset(train, tokenizer, job.data.prompt_len, job.data.response_len, eos_id)


def target_and_drafter(job: TrainJob, config: DrafterConfig, dist: DistContext,
                       sharded: bool) -> tuple[torch.nn.Module, Drafter]:
    """The frozen target and the drafter built from it (seeded; from the target's top layers or another drafter's
    weights when asked). A sharded target is read whole on the CPU, the drafter built from it, then its layers
    sharded (sharding.py); a node's ranks take turns at this, so one whole copy at a time sits in host memory."""
    def load(device: torch.device) -> tuple[torch.nn.Module, Drafter]:
        target = load_frozen_target(job.target_dir, device)
        torch.manual_seed(job.train.seed)
        drafter = DRAFTER_CLASSES[config.kind].from_target(target, config).to(dist.device)
        if job.init_from_target:
            init_from_target(drafter, target)
        if job.init_from_drafter is not None:
            init_from_drafter(drafter, job.init_from_drafter, target)
        return target, drafter

    if not sharded:
        return load(dist.device)
    mesh = world_mesh(dist.device, dist.world_size)
    for turn in range(dist.local_world_size):
        if dist.local_rank == turn:
            target, drafter = load(torch.device("cpu"))
            shard_frozen_target(target, mesh, dist.device)
        dist.barrier()
    return target, drafter


def train_job(job: TrainJob, dist: DistContext) -> dict | None:
    """Run the job; rank 0 returns the card info (also written to out_dir), other ranks None."""
    target_config, tokenizer = load_target_config(job.target_dir)
    mask_id = job.mask_token_id if job.mask_token_id is not None else tokenizer.mask_token_id
    config = drafter_config(job.spec, target_config, mask_id)
    if job.init_from_drafter is not None:
        check_same_drafter(job.init_from_drafter, config, target_config)
    # --data is read (and checked as hostile input) before any model is loaded, and split: the held-out slice
    # (data_files.py) is never trained on.
    corpus = load_corpus(job.stdlib_root, job.held_out_percent)
    train_conversations, held_out_prompts = (split_conversations(read_data(job.data_path), corpus.held_out_percent)
                                             if job.data_path is not None else (None, None))
    eos_id = tokenizer.eos_token_id
    # So are its samples (tokenized), and data too small for one global batch is refused before the models load.
    file_samples = (file_dataset(job, train_conversations, tokenizer, eos_id)
                    if train_conversations is not None else None)
    if not job.only_draft_vocab:  # which never trains
        check_fills_a_batch(len(file_samples) if file_samples is not None else job.data.num_samples, job.train, dist)
    sharded = job.shard_target and dist.world_size > 1  # every forward of the target is then a collective
    target, drafter = target_and_drafter(job, config, dist, sharded)
    fingerprint = target_fingerprint(job.target_dir)
    key = {"data": asdict(job.data), "target_sha256": fingerprint, "corpus_root": str(corpus.root),
           "held_out_percent": corpus.held_out_percent, "split": "train"}
    documents, prompts_source, prompts_key = job_documents(job, tokenizer, corpus)
    key.update(prompts_key)
    # bf16 generation samples from (slightly) different logits: its data is cached under its own key.
    train_key = {**key, "generation_autocast": "bfloat16"} if job.train.bf16 else key
    if file_samples is not None:
        dataset = file_samples
    else:
        with bf16_autocast(job.train.bf16, dist.device):
            dataset = cached_dataset(documents("train"), job.data, target, eos_id, train_key, job.data_cache_dir,
                                     dist)
    if dist.is_main:
        vocab_path = write_draft_vocab(job, dataset, target_config.vocab_size)
    if job.only_draft_vocab:
        return {"draft_vocab": str(vocab_path)} if dist.is_main else None
    features = None
    if job.feature_cache_dir is not None:
        features = stored_target_features(target, dataset, config.target_layer_ids, train_key, job.feature_cache_dir,
                                          job.train.bf16, dist, sharded)
    dist.barrier()  # rank 0 wrote the draft vocabulary
    vocab_ids = load_draft_vocab(job.out_dir, target_config.vocab_size)  # the one the exported drafter drafts among
    task = build_task(config, job.spec.n_anchors, vocab_ids if job.loss_over_draft_vocab else None, job.loss)
    def held_out_set() -> TokenDataset:  # the target's greedy replies to held-out prompts (rank 0, or every rank)
        eval_source = "chat" if job.data.source == "chat" or job.data_path is not None else "generations"
        eval_cfg = dataclasses.replace(job.data, source=eval_source, num_samples=job.eval_samples, temperature=0.0)
        eval_key = {**key, "data": asdict(eval_cfg), "split": "held_out"}
        return cached_dataset(documents("held_out"), eval_cfg, target, eos_id, eval_key, job.data_cache_dir,
                              dist if sharded else DistContext(device=dist.device), every_rank=sharded)

    stop_ids = stop_token_ids(target, tokenizer)

    def held_out_check(eval_set: TokenDataset) -> dict:  # teacher-forced acceptance, and the small decoded check
        report = greedy_acceptance(drafter, target, eval_set, config.target_layer_ids, vocab_ids=vocab_ids)
        return {**report.to_json(), "decoded_tau": decoded_tau(drafter, target, eval_set, stop_ids,
                                                               vocab_ids=vocab_ids)}

    monitor, eval_set = None, None
    if dist.is_main or sharded:  # a sharded target's check is a collective: every rank runs it, rank 0 writes
        # built before training, so a held-out split too small for --eval-samples is refused before the steps
        eval_set = held_out_set() if job.eval_samples else None
        def held_out_metrics() -> dict:  # what the monitor logs, keeping the best drafter by "tau"
            check = held_out_check(eval_set)
            return {"tau": check["tau"], "decoded_tau": check["decoded_tau"]}

        evaluate = held_out_metrics if job.eval_every else None
        monitor = RunMonitor(job.work_dir, evaluate, job.eval_every, writes=dist.is_main)
    trainer = Trainer(drafter, target, dataset, task, job.train, job.work_dir, dist, features=features,
                      monitor=monitor, fsdp=job.fsdp)
    if job.resume:
        trainer.resume()
    result = trainer.run()
    if trainer.fsdp:  # every rank takes part in gathering the sharded drafter; rank 0 checks and exports a plain one
        gathered = trainer.full_drafter_state()
        if dist.is_main:
            drafter = DRAFTER_CLASSES[config.kind].from_target(target, config).to(dist.device)
            drafter.load_state_dict(gathered)
    dist.barrier()  # rank 0 wrote the best drafter's weights
    if not (dist.is_main or sharded):
        return None
    kept_best = monitor.load_best(drafter)  # the export is the drafter of the best held-out tau, not the last
    held_out = held_out_check(eval_set) if eval_set is not None else None
    if not dist.is_main:
        return None
    info = {
        "kind": config.kind, "target": portable(job.target_dir), "target_sha256": fingerprint,
        "drafter_config": config_json(config),
        "data_summary": describe_data(job.data, corpus, prompts_source, job.data_path is not None),
        **dataset_stats(dataset),
        "steps": result.steps, "wall_s": round(result.wall_s, 1), "stopped_early": result.stopped_early,
        "final_terms": result.final_terms, "log_every": job.train.log_every, "device": str(dist.device),
        "world_size": dist.world_size, "save_dtype": job.save_dtype, "slim": job.slim, "held_out": held_out,
        "command": job.command, "feature_cache": job.feature_cache_dir is not None,
        "init_from_target": job.init_from_target, "bf16": job.train.bf16,
        "init_from_drafter": None if job.init_from_drafter is None else portable(job.init_from_drafter),
        "loss_over_draft_vocab": job.loss_over_draft_vocab, "loss": job.loss,
        "fsdp": trainer.fsdp, "shard_target": sharded, "held_out_every": monitor.evaluations,
        "exported_best": monitor.best if kept_best else None,
        "trainable_params": sum(p.numel() for p in drafter.parameters() if p.requires_grad),
        "held_out_slice": None if held_out_prompts is None else {
            "rule": f"sha256 of the first user turn in the lowest {corpus.held_out_percent} of 100 buckets",
            "held_out_percent": corpus.held_out_percent, "prompts": len(held_out_prompts), "file": HELD_OUT_FILE},
    }
    job.out_dir.mkdir(parents=True, exist_ok=True)
    if held_out_prompts is not None:  # `dspark eval --datasets <out>/held_out.jsonl` compares drafters on it
        write_held_out(held_out_prompts, job.out_dir)
    export_drafter(drafter, job.out_dir, getattr(torch, job.save_dtype), frozen=not job.slim,
                   draft_vocab=vocab_ids if job.loss_over_draft_vocab else None)
    trainer.write_log(result.wall_s, extra={"job": info})
    (job.out_dir / LOG_FILE).write_text((job.work_dir / LOG_FILE).read_text())
    write_card(job.out_dir, info)
    return info
