"""What a training job leaves in its output folder: the drafter's checkpoint in the chosen dtype, its draft
vocabulary, train_log.json-style JSON, and the README.md model card (what was trained on what, how long, the
final losses, the held-out check, and the command that reproduces it)."""
from __future__ import annotations

import copy
import json
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import torch

from dspark.models.checkpoint import save_drafter
from dspark.models.drafters import Drafter, DrafterConfig
from dspark.models.drafters.draft_vocab import load_draft_vocab, most_frequent, save_draft_vocab
from dspark.models.embedded_target.corpus import Corpus
from dspark.models.portable_paths import portable
from dspark.models.training.data import DataConfig, TokenDataset


def write_draft_vocab(job: "TrainJob", dataset: TokenDataset, vocab_size: int) -> Path:
    """draft_vocab.json in the export directory: the job.draft_vocab_size most frequent tokens the loss reads. A
    fine-tune keeps the draft vocabulary of the drafter it starts from whole: its rows are the trained ones, and a
    recount over fewer, newer replies would drop tokens it drafts well."""
    trained = dataset.input_ids[dataset.loss_mask]
    kept = None if job.init_from_drafter is None else load_draft_vocab(job.init_from_drafter, vocab_size)
    token_ids, coverage = most_frequent(trained, vocab_size, job.draft_vocab_size, keep=kept)
    generation = "under bf16 autocast" if job.train.bf16 else "in float32"
    counted = (f"{trained.numel()} trained tokens of `dspark train`'s data ({len(dataset)} samples, {job.data.source} "
               f"source, seed {job.data.seed}, generated {generation})")
    source = (f"the {len(token_ids)} most frequent of the {counted}" if kept is None else
              f"the {len(kept)} of {portable(job.init_from_drafter)}'s draft vocabulary and "
              f"{len(token_ids) - len(kept)} more, the most frequent of the {counted}")
    job.out_dir.mkdir(parents=True, exist_ok=True)
    return save_draft_vocab(job.out_dir, token_ids, source, trained.numel(), coverage)


def export_drafter(drafter: Drafter, out_dir: Path, dtype: torch.dtype, frozen: bool = True,
                   draft_vocab: Optional[torch.Tensor] = None) -> Path:
    """Save a copy of the drafter in `dtype` (the training copy stays fp32); frozen=False: a slim checkpoint;
    draft_vocab (for a drafter trained over it): a compact one (models/checkpoint.py)."""
    return save_drafter(copy.deepcopy(drafter).to(dtype), out_dir, frozen=frozen, draft_vocab=draft_vocab)


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
        f"{cfg['target_layer_ids']}{_heads(cfg)}), trained by `dspark train` (recipe: docs/training.md).",
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
        if "decoded_tau" in accept:
            lines.append(f"- decoded (the first held-out prompts, greedy, every draft verified): tau "
                         f"{accept['decoded_tau']:.3f} tokens per round.")
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
    loss = ("the greedy-matched loss (--loss greedy: CE on the target's argmax)" if info.get("loss") == "greedy"
            else "the sampling loss")
    return (f"target outputs: {features}; started from {start}; compute: {compute}; logits and loss over {vocab}; "
            f"{loss}.")


def _heads(cfg: dict) -> str:
    if not cfg.get("markov_rank"):
        return ""
    conf = ", confidence head" if cfg.get("enable_confidence_head") else ""
    return f", {cfg['markov_head_type']} Markov head rank {cfg['markov_rank']}{conf}"


def describe_data(cfg: DataConfig, corpus: Corpus, prompts_source: str = "", from_file: bool = False) -> str:
    if from_file:
        return (f"the {prompts_source} (every assistant turn the target's own; {corpus.held_out_percent}% held out "
                f"by the first user turn's hash, their prompts in held_out.jsonl): at most {cfg.prompt_len} tokens before the first reply (longer "
                f"prompts cut from the left), {cfg.prompt_len + cfg.response_len} in all; loss on every reply.")
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


def config_json(config: DrafterConfig) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()}
