"""One drafter-training job end to end: target, data, drafter, trainer, held-out check, export, model card.

`dspark train` (dspark.ops.commands.train) parses the command line and the torchrun environment, then calls
`prepare_data` and `train_job`. The pieces:

- the target: a transformers causal LM directory (config, weights, tokenizer), frozen;
- documents: the training split of the CPython stdlib corpus (dspark.models.embedded_target.corpus), tokenized
  with the target's tokenizer; held-out files serve the held-out check. For the chat source the documents are
  chat prompts (a --prompts-file, or the built-in generated set of dspark.models.training.chat_prompts) in the
  target's chat template, split train / held-out by a stable hash of the text. The eval prompt sets are never read;
- DrafterSpec -> DrafterConfig (dims copied from the target) and the matching TrainTask; optionally the drafter
  starts from the target's top layers (target_init.py) and trains on the target's outputs cached once
  (feature_cache.py, under its own key beside the data cache);
- export: config.json + model.safetensors in the SGLang/DeepSpec layout (dspark.models.checkpoint), in the chosen
  dtype, plus train_log.json and a README.md card with the exact command that reproduces it.

Default tapped layers follow the reference's released configs: up to 5 layers spread evenly over 1 .. L-3
(Qwen3-8B's 36 layers give [1, 9, 17, 25, 33]; Qwen3-14B's 40 give [1, 10, 19, 28, 37]); a target too shallow
for that taps every layer but the last (the embedded target's 4 layers give [0, 1, 2]).
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from dspark.models.checkpoint import save_drafter
from dspark.models.drafters import DRAFTER_CLASSES, Drafter, DrafterConfig
from dspark.models.drafters.draft_vocab import load_draft_vocab, most_frequent, save_draft_vocab
from dspark.models.embedded_target.corpus import Corpus, is_held_out, load_corpus
from dspark.models.errors import CheckpointError, ConfigError
from dspark.models.evaluation.datasets import read_turns
from dspark.models.training.chat_prompts import generate_chat_prompts
from dspark.models.training.data import DataConfig, TokenDataset, build_dataset, load_dataset, save_dataset
from dspark.models.training.evaluate import greedy_acceptance
from dspark.models.training.feature_cache import (CachedFeatures, compute_features, feature_cache_path, load_features,
                                                  save_features)
from dspark.models.training.losses import DFLASH_LOSS, DSPARK_LOSS
from dspark.models.training.tasks import BlockTask, Eagle3Task, TrainTask
from dspark.models.training.drafter_init import check_same_drafter, init_from_drafter
from dspark.models.training.target_init import init_from_target
from dspark.models.training.trainer import LOG_FILE, DistContext, TrainConfig, Trainer, bf16_autocast

DEFAULT_LAYERS = {"dspark": 5, "dflash": 5, "eagle3": 1}
MAX_TAPS = 5
BUILTIN_CHAT_PROMPTS = 6000  # size of the generated prompt set when no --prompts-file is given (seed 0)


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


def build_task(config: DrafterConfig, n_anchors: int, vocab_ids: torch.Tensor | None = None) -> TrainTask:
    """The drafter's training task; vocab_ids ([V'] sorted) restricts a block drafter's loss to that draft
    vocabulary (losses.py)."""
    if config.kind == "eagle3":
        assert vocab_ids is None, "TrainJob refuses --loss-over-draft-vocab for Eagle3"
        return Eagle3Task(config.target_layer_ids, config.block_size)
    weights = DSPARK_LOSS if config.kind == "dspark" else DFLASH_LOSS
    if config.kind == "dspark" and not config.enable_confidence_head:
        weights = dataclasses.replace(DSPARK_LOSS, conf=0.0)
    return BlockTask(config.target_layer_ids, config.block_size, n_anchors, weights, vocab_ids)


def load_target_config(target_dir: Path):
    """The target's HF config and tokenizer (cheap: lets every setting be checked before weights load)."""
    if not (target_dir / "config.json").is_file():
        raise CheckpointError(f"--target {target_dir} has no config.json: pass a transformers model directory "
                              "(e.g. embedded/target)")
    return AutoConfig.from_pretrained(str(target_dir)), AutoTokenizer.from_pretrained(str(target_dir))


def load_target(target_dir: Path, device: torch.device) -> torch.nn.Module:
    """The frozen target model in fp32."""
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).to(device).eval()
    return model.requires_grad_(False)


def target_fingerprint(target_dir: Path) -> str:
    """sha256 of the target's weights file(s): part of the data-cache key and the card."""
    digest = hashlib.sha256()
    files = sorted(target_dir.glob("*.safetensors")) or sorted(target_dir.glob("*.bin"))
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def corpus_documents(corpus: Corpus, tokenizer, split: str) -> list[torch.Tensor]:
    """Token ids of each file of the corpus split ("train" or "held_out"), tokenized without special tokens.

    Files may exceed the tokenizer's model_max_length (only windows are used), so that warning is silenced.
    """
    paths = corpus.train_files if split == "train" else corpus.held_out_files
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False, verbose=False)  # noqa: E731
    return [torch.tensor(encode(corpus.read(p)), dtype=torch.long) for p in paths]


def chat_prompt_texts(job: "TrainJob", corpus: Corpus) -> tuple[list[str], str]:
    """The chat prompts (first user turns: job.builtin_prompts of the built-in set, then the prompts file's; each
    text once) and where they come from."""
    builtin = job.builtin_prompts if job.builtin_prompts is not None else \
        (0 if job.prompts_file is not None else BUILTIN_CHAT_PROMPTS)
    texts, sources = [], []
    if builtin:
        texts += [r["turns"][0] for r in generate_chat_prompts(corpus, builtin, seed=0)]
        sources.append(f"built-in generated set ({builtin} prompts, seed 0)")
    if job.prompts_file is not None:
        texts += read_turns(job.prompts_file)
        sources.append(str(job.prompts_file))
    if not texts:
        raise ConfigError("no chat prompts: give --prompts-file or a --builtin-prompts count above 0")
    return list(dict.fromkeys(texts)), " and ".join(sources)


def job_documents(job: "TrainJob", tokenizer, corpus: Corpus):
    """(split -> token documents, description of the chat prompts, their data-cache key part) for the job."""
    if job.data.source != "chat":
        return (lambda split: corpus_documents(corpus, tokenizer, split)), "", {}
    texts, prompts_source = chat_prompt_texts(job, corpus)
    key = {"prompts_sha256": hashlib.sha256("\n\0".join(texts).encode()).hexdigest()}
    return (lambda split: chat_documents(texts, tokenizer, corpus.held_out_percent, split)), prompts_source, key


def chat_documents(texts: list[str], tokenizer, held_out_percent: int, split: str) -> list[torch.Tensor]:
    """Token ids of each prompt of the split in the target's chat template, ending with the generation prompt.

    The split uses the corpus rule on the prompt text (a stable hash), so it does not depend on order."""
    held = split == "held_out"
    chosen = [t for t in texts if is_held_out(t, held_out_percent) == held]
    encode = lambda text: tokenizer.apply_chat_template(  # noqa: E731
        [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=True)["input_ids"]
    return [torch.tensor(encode(t), dtype=torch.long) for t in chosen]


def write_draft_vocab(job: TrainJob, dataset: TokenDataset, vocab_size: int) -> Path:
    """draft_vocab.json in the export directory: the job.draft_vocab_size most frequent tokens the loss reads."""
    trained = dataset.input_ids[dataset.loss_mask]
    token_ids, coverage = most_frequent(trained, vocab_size, job.draft_vocab_size)
    generation = "under bf16 autocast" if job.train.bf16 else "in float32"
    source = (f"the {len(token_ids)} most frequent of the {trained.numel()} trained tokens of `dspark train`'s data "
              f"({len(dataset)} samples, {job.data.source} source, seed {job.data.seed}, generated {generation})")
    job.out_dir.mkdir(parents=True, exist_ok=True)
    return save_draft_vocab(job.out_dir, token_ids, source, trained.numel(), coverage)


def export_drafter(drafter: Drafter, out_dir: Path, dtype: torch.dtype, frozen: bool = True) -> Path:
    """Save a copy of the drafter in `dtype` (the training copy stays fp32); frozen=False: a slim checkpoint."""
    return save_drafter(copy.deepcopy(drafter).to(dtype), out_dir, frozen=frozen)


def write_card(out_dir: Path, info: dict) -> None:
    """README.md: what was trained on what, how long, the final losses, the held-out check, how to reproduce."""
    final = info["final_terms"]
    terms = ", ".join(f"{k} {v:.4f}" for k, v in final.items() if k not in ("step", "wall_s", "lr", "grad_norm"))
    accept = info.get("held_out")
    cfg = info["drafter_config"]
    lines = [
        f"# {info['kind']} drafter for {info['target']}",
        "",
        f"{info['kind']} drafter ({cfg['num_hidden_layers']} layer(s), gamma {cfg['block_size']}, target layers "
        f"{cfg['target_layer_ids']}{_heads(cfg)}), trained by `dspark train` (DEEPSPEC_REFERENCE.md §2 recipe).",
        "",
        "## Data",
        f"- {info['data_summary']}",
        f"- target weights sha256 `{info['target_sha256'][:16]}...`; {info['samples']} samples of {info['seq_len']} "
        f"tokens, {info['trained_tokens']} trained (response) tokens.",
        "",
        "## Training",
        f"- {info['steps']} optimizer steps in {info['wall_s'] / 60:.1f} min ({info['wall_s']:.0f} s) of training "
        f"wall time on {info['device']} x{info['world_size']}"
        f"{' (stopped by the time budget)' if info['stopped_early'] else ''}; settings in train_log.json.",
        f"- {_levers(info)}",
        f"- final loss terms (mean of the last logged window of <= {info['log_every']} steps): {terms}"
        " (`accept` is the diagnostic expected acceptance rate c*, not a trained term).",
        f"- weights stored in {info['save_dtype']}; {info['trainable_params']:,} trainable parameters "
        + ("(the frozen embedding and lm_head are the target's and not stored: load with "
           "`load_drafter(dir, target_config, target_model=target)`)." if info.get("slim") else
           "(+ the frozen embedding and lm_head copied from the target)."),
    ]
    if accept:
        lines += [
            "",
            "## Held-out check (teacher-forced greedy acceptance, dspark.models.training.evaluate)",
            f"- {accept['blocks']} anchors on target greedy continuations of held-out prompts: tau {accept['tau']:.3f} "
            f"tokens per target forward; P(draft k accepted | earlier accepted) = {accept['conditional']} "
            f"(a uniform guess matches with probability 1/{cfg['vocab_size']}).",
        ]
    lines += ["", "## Reproduce", "```", info["command"], "```", ""]
    (out_dir / "README.md").write_text("\n".join(lines))


def _levers(info: dict) -> str:
    """How the steps were computed and where the drafter started (card line)."""
    features = ("the target's outputs computed once and cached (--feature-cache)" if info.get("feature_cache")
                else "a target forward per micro-batch")
    if info.get("init_from_drafter"):
        start = f"the trained drafter {info['init_from_drafter']} (--init-from-drafter)"
    elif info.get("init_from_target"):
        start = "the target's top layers (--init-from-target)"
    else:
        start = "a random init"
    compute = "bf16 autocast (--bf16)" if info.get("bf16") else "fp32"
    vocab = ("the draft vocabulary only (--loss-over-draft-vocab: serve it with draft_vocab.json)"
             if info.get("loss_over_draft_vocab") else "the full vocabulary")
    return f"target outputs: {features}; started from {start}; compute: {compute}; logits and loss over {vocab}."


def _heads(cfg: dict) -> str:
    if not cfg.get("markov_rank"):
        return ""
    conf = ", confidence head" if cfg.get("enable_confidence_head") else ""
    return f", {cfg['markov_head_type']} Markov head rank {cfg['markov_rank']}{conf}"


def describe_data(cfg: DataConfig, corpus: Corpus, prompts_source: str = "") -> str:
    if cfg.source == "corpus":
        return (f"corpus text: windows of {cfg.seq_len} tokens from the {len(corpus.train_files)} training files of "
                f"the stdlib corpus (split: {corpus.held_out_percent}% held out by path hash); loss on the last "
                f"{cfg.response_len} tokens of each window.")
    sampling = ("greedy" if cfg.temperature == 0 else
                f"sampled at temperature {cfg.temperature}, top_p {cfg.top_p}, top_k {cfg.top_k}")
    if cfg.source == "chat":
        return (f"the target's own chat replies: prompts are user turns of the {prompts_source} (never an eval "
                f"set; {corpus.held_out_percent}% held out by text hash) of <= {cfg.prompt_len} tokens in the "
                f"target's chat template, replies are up to {cfg.response_len} tokens {sampling}; loss on the reply.")
    return (f"the target's own continuations: prompts are {cfg.prompt_len}-token windows of the "
            f"{len(corpus.train_files)} training files of the stdlib corpus ({corpus.held_out_percent}% held out "
            f"by path hash, never used), responses are {cfg.response_len} tokens {sampling}; loss on the response.")


def dataset_stats(dataset: TokenDataset) -> dict:
    return {"samples": len(dataset), "seq_len": dataset.input_ids.shape[1],
            "trained_tokens": int(dataset.loss_mask.sum())}


def save_json(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")


def config_json(config: DrafterConfig) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()}


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
    save_dtype: str = "bfloat16"
    slim: bool = False  # export without the frozen embedding / lm_head copies
    resume: bool = False
    mask_token_id: int | None = None  # default: the tokenizer's mask token
    prompts_file: Path | None = None  # chat source: {"turns": [...]} records; None: the built-in generated set
    builtin_prompts: int | None = None  # chat source: how many built-in prompts too (None: all without a file, else 0)
    feature_cache_dir: Path | None = None  # cache the target's outputs here once; None: a target forward per step
    init_from_target: bool = False  # start from the target's top layers (target_init.py), not a random init
    init_from_drafter: Path | None = None  # start from this trained drafter's weights (drafter_init.py)
    draft_vocab_size: int = 8192  # draft_vocab.json: this many of the trained tokens, the most frequent
    loss_over_draft_vocab: bool = False  # block drafters: logits and loss over draft_vocab.json only (losses.py)
    only_draft_vocab: bool = False  # write draft_vocab.json from the data and stop (a drafter trained before)
    command: str = ""

    def __post_init__(self) -> None:
        if self.loss_over_draft_vocab and self.spec.kind == "eagle3":
            raise ConfigError("--loss-over-draft-vocab trains the block drafters (dspark, dflash); Eagle3's "
                              "test-time-training loss runs over the full vocabulary")


def cached_dataset(documents, cfg: DataConfig, target, eos_id: int, key: dict, cache_dir: Path, dist: DistContext):
    """Load the dataset for `key` from cache_dir, or build it on rank 0 and save it; other ranks wait and load."""
    path = cache_dir / (hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16] + ".pt")
    if dist.is_main and load_dataset(path, key) is None:
        partial = path.with_suffix(".partial.pt")  # the generation so far: an interrupted run picks it up
        save_dataset(build_dataset(documents, cfg, target, eos_id, partial=partial), key, path)
        partial.unlink(missing_ok=True)
    dist.barrier()
    dataset = load_dataset(path, key)
    assert dataset is not None, f"{path} vanished after it was written"
    return dataset


def cached_target_features(target, dataset: TokenDataset, layer_ids: tuple[int, ...], key: dict, cache_dir: Path,
                           bf16: bool, dist: DistContext) -> CachedFeatures:
    """The target's outputs on `dataset` from cache_dir, or computed on rank 0 (under bf16 autocast when asked)
    and saved; other ranks wait and load."""
    autocast = "bfloat16" if bf16 else "none"
    key = {**key, "target_layer_ids": list(layer_ids), "dtype": "bfloat16", "autocast": autocast}
    path = feature_cache_path(cache_dir, key)
    lm_head = target.get_output_embeddings()
    if dist.is_main and load_features(path, key, lm_head) is None:
        with bf16_autocast(bf16, dist.device):
            save_features(*compute_features(target, dataset, layer_ids), key, path)
    dist.barrier()
    features = load_features(path, key, lm_head)
    assert features is not None, f"{path} vanished after it was written"
    return features


def train_job(job: TrainJob, dist: DistContext) -> dict | None:
    """Run the job; rank 0 returns the card info (also written to out_dir), other ranks None."""
    target_config, tokenizer = load_target_config(job.target_dir)
    mask_id = job.mask_token_id if job.mask_token_id is not None else tokenizer.mask_token_id
    config = drafter_config(job.spec, target_config, mask_id)
    if job.init_from_drafter is not None:
        check_same_drafter(job.init_from_drafter, config, target_config)
    corpus = load_corpus(job.stdlib_root, job.held_out_percent)
    target = load_target(job.target_dir, dist.device)
    fingerprint = target_fingerprint(job.target_dir)
    eos_id = tokenizer.eos_token_id
    key = {"data": asdict(job.data), "target_sha256": fingerprint, "corpus_root": str(corpus.root),
           "held_out_percent": corpus.held_out_percent, "split": "train"}
    documents, prompts_source, prompts_key = job_documents(job, tokenizer, corpus)
    key.update(prompts_key)
    # bf16 generation samples from (slightly) different logits: its data is cached under its own key.
    train_key = {**key, "generation_autocast": "bfloat16"} if job.train.bf16 else key
    with bf16_autocast(job.train.bf16, dist.device):
        dataset = cached_dataset(documents("train"), job.data, target, eos_id, train_key, job.data_cache_dir, dist)
    if dist.is_main:
        vocab_path = write_draft_vocab(job, dataset, target_config.vocab_size)
    if job.only_draft_vocab:
        return {"draft_vocab": str(vocab_path)} if dist.is_main else None
    features = None
    if job.feature_cache_dir is not None:
        features = cached_target_features(target, dataset, config.target_layer_ids, train_key, job.feature_cache_dir,
                                          job.train.bf16, dist)
    torch.manual_seed(job.train.seed)
    drafter = DRAFTER_CLASSES[config.kind].from_target(target, config).to(dist.device)
    if job.init_from_target:
        init_from_target(drafter, target)
    if job.init_from_drafter is not None:
        init_from_drafter(drafter, job.init_from_drafter, target)
    dist.barrier()  # rank 0 wrote the draft vocabulary
    vocab_ids = load_draft_vocab(job.out_dir, target_config.vocab_size)  # the one the exported drafter drafts among
    task = build_task(config, job.spec.n_anchors, vocab_ids if job.loss_over_draft_vocab else None)
    trainer = Trainer(drafter, target, dataset, task, job.train, job.work_dir, dist, features=features)
    if job.resume:
        trainer.resume()
    result = trainer.run()
    if not dist.is_main:
        return None
    held_out = None
    if job.eval_samples:
        eval_source = "chat" if job.data.source == "chat" else "generations"
        eval_cfg = dataclasses.replace(job.data, source=eval_source, num_samples=job.eval_samples, temperature=0.0)
        eval_key = {**key, "data": asdict(eval_cfg), "split": "held_out"}
        eval_set = cached_dataset(documents("held_out"), eval_cfg, target, eos_id, eval_key,
                                  job.data_cache_dir, DistContext(device=dist.device))
        held_out = greedy_acceptance(drafter, target, eval_set, config.target_layer_ids, vocab_ids=vocab_ids).to_json()
    info = {
        "kind": config.kind, "target": str(job.target_dir), "target_sha256": fingerprint,
        "drafter_config": config_json(config), "data_summary": describe_data(job.data, corpus, prompts_source),
        **dataset_stats(dataset),
        "steps": result.steps, "wall_s": round(result.wall_s, 1), "stopped_early": result.stopped_early,
        "final_terms": result.final_terms, "log_every": job.train.log_every, "device": str(dist.device),
        "world_size": dist.world_size, "save_dtype": job.save_dtype, "slim": job.slim, "held_out": held_out,
        "command": job.command, "feature_cache": job.feature_cache_dir is not None,
        "init_from_target": job.init_from_target, "bf16": job.train.bf16,
        "init_from_drafter": None if job.init_from_drafter is None else str(job.init_from_drafter),
        "loss_over_draft_vocab": job.loss_over_draft_vocab,
        "trainable_params": sum(p.numel() for p in drafter.parameters() if p.requires_grad),
    }
    job.out_dir.mkdir(parents=True, exist_ok=True)
    export_drafter(drafter, job.out_dir, getattr(torch, job.save_dtype), frozen=not job.slim)
    trainer.write_log(result.wall_s, extra={"job": info})
    (job.out_dir / LOG_FILE).write_text((job.work_dir / LOG_FILE).read_text())
    write_card(job.out_dir, info)
    return info
