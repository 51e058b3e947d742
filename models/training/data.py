"""Training data for drafters: the target's own continuations of real prompts, or plain corpus text.

DeepSpec regenerates every assistant answer with the target (T=0.7, top_p=0.8, top_k=20; docs/training.md), so
the drafter learns the distribution it will be verified against, not the corpus's. For a base code LM
such as the embedded target there are no chat turns, so the analogue is:

  source="generations" (default): prompt = a window of `prompt_len` tokens at a random offset of a training
      document (for the embedded target: a held-in CPython stdlib file, never an eval prompt), response = the
      target's own continuation of `response_len` tokens sampled at T/top_p/top_k (greedy at temperature 0).
      loss_mask covers the response, including a generated EOS; tokens after an EOS are EOS padding with
      loss_mask and attention_mask False.
  source="corpus": windows of prompt_len + response_len tokens of the documents themselves, loss_mask on all but
      the first prompt_len tokens (the same shape of sample, with data tokens instead of target tokens).

  source="chat": for chat targets. prompt = one user turn of a prompt list (dspark.models.training.chat_prompts,
      never an eval set) in the target's chat template with the generation prompt (at most `prompt_len` tokens;
      longer prompts are skipped), response = the target's own reply of up to `response_len` tokens sampled as
      above. Prompts differ in length, so they are generated left-padded (positions counted from each prompt's
      first token) and stored right-padded: [prompt, response, padding], padding with attention_mask and
      loss_mask False, loss_mask on the response.

All samples have the same length, so batches need no padding beyond the tail. Target features are not
stored: the trainer recomputes them online with a target forward. The token ids alone are small, so a dataset can
be cached with save_dataset / load_dataset (a .pt file next to a JSON key: the DataConfig and the target's identity),
and a generation interrupted part-way resumes from its `partial` file (build_dataset).

RNG contract: every random choice (window offsets, sampled tokens) comes from one CPU torch.Generator seeded with
DataConfig.seed; the same config, documents and target give the same dataset.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import DynamicCache

from dspark.kernels import warping
from dspark.kernels.warping import SamplingParams
from dspark.models.errors import ConfigError
from dspark.models.training.regenerate import ReplySampling

SOURCES = ("generations", "corpus", "chat")


# What reading a damaged cache file raises (JSON and UTF-8 errors are ValueErrors; torch.load's own are the rest).
UNREADABLE_CACHE = (OSError, ValueError, TypeError, RuntimeError, EOFError, pickle.UnpicklingError, struct.error)
# Upper bounds: what one CPU or GPU job can hold, far above any real run (a 1M-token context, 10M samples).
DATA_BOUNDS = {"num_samples": 10_000_000, "prompt_len": 1 << 20, "response_len": 1 << 20,
               "generation_batch_size": 1 << 16}


@dataclass(frozen=True)
class DataConfig:
    """How the training samples are built (module docstring)."""

    source: str = "generations"
    num_samples: int = 2048
    prompt_len: int = 64  # chat: the longest prompt kept
    response_len: int = 128
    temperature: float = ReplySampling.temperature  # DeepSpec's regeneration settings; 0 = greedy
    top_p: float = ReplySampling.top_p
    top_k: int = ReplySampling.top_k
    generation_batch_size: int = 64
    seed: int = 42

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ConfigError(f"data source must be one of {SOURCES}, got {self.source!r}")
        for name, bound in DATA_BOUNDS.items():
            if not 1 <= getattr(self, name) <= bound:
                raise ConfigError(f"data {name} must be in [1, {bound}], got {getattr(self, name)}")
        ReplySampling(self.temperature, self.top_p, self.top_k)  # the replies' sampling, checked as regenerate's

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len


@dataclass(frozen=True)
class TokenDataset:
    """Fixed-length training samples."""

    input_ids: torch.Tensor  # [n, seq] long
    loss_mask: torch.Tensor  # [n, seq] bool, trained (response) tokens
    attention_mask: torch.Tensor  # [n, seq] bool, False on post-EOS padding

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index: torch.Tensor) -> TokenDataset:
        """The samples at `index` ([n_sel] long), e.g. one micro-batch."""
        return TokenDataset(self.input_ids[index], self.loss_mask[index], self.attention_mask[index])


def sample_windows(
    documents: list[torch.Tensor],  # each [doc_len] long
    length: int,
    count: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """`count` windows of `length` tokens at uniformly random offsets, documents weighted by their window count.

    Returns [count, length] long. Documents shorter than `length` are skipped.
    """
    usable = [doc for doc in documents if doc.numel() >= length]
    if not usable:
        raise ConfigError(f"no training document has >= {length} tokens (prompt_len + response_len); lower them")
    n_starts = torch.tensor([doc.numel() - length + 1 for doc in usable], dtype=torch.float64)
    doc_index = torch.multinomial(n_starts, count, replacement=True, generator=generator)
    offsets = (torch.rand(count, generator=generator, dtype=torch.float64) * n_starts[doc_index]).long()
    return torch.stack([usable[d][o : o + length] for d, o in zip(doc_index.tolist(), offsets.tolist())])


def next_tokens(logits: torch.Tensor, cfg: DataConfig, generator: torch.Generator) -> torch.Tensor:
    """Greedy at temperature 0, else a sample from the warped distribution (kernels.warping, as decoding samples).

    logits: [bs, vocab] -> [bs] long. The generator lives on the CPU, so sampling happens there, in fp32 (logits
    from a bf16 autocast forward would otherwise be warped with bf16 cumulative sums). With top_k set, only the
    top_k logits are warped: the same distribution, without top_p's sort of the whole vocabulary, which on a CPU
    costs as much as the target's forward.
    """
    params, device = SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p), logits.device
    logits = logits.float().cpu()
    if params.greedy or not 0 < cfg.top_k < logits.shape[-1]:
        return warping.sample(logits, params, generator).to(device)
    top_logits, top_ids = logits.topk(cfg.top_k, dim=-1)
    picked = warping.sample(top_logits, params, generator)
    return top_ids.gather(1, picked[:, None]).squeeze(1).to(device)


@torch.no_grad()
def continue_prompts(
    target: torch.nn.Module,
    prompts: torch.Tensor,  # [bs, prompt_len] long
    cfg: DataConfig,
    eos_token_id: int,
    generator: torch.Generator,
    prompt_mask: torch.Tensor | None = None,  # [bs, prompt_len] bool, False on left padding; None: no padding
) -> TokenDataset:
    """Append the target's continuation of cfg.response_len tokens to each prompt (KV-cached decoding).

    With a prompt_mask, padded positions are masked out and positions count from each prompt's first real token,
    so a left-padded prompt is continued exactly as it would be alone.
    """
    bs = prompts.shape[0]
    prompt_mask = torch.ones_like(prompts, dtype=torch.bool) if prompt_mask is None else prompt_mask.bool()
    mask = prompt_mask.long()
    position = mask.cumsum(dim=1) - 1
    cache = DynamicCache()
    step = lambda ids: target(input_ids=ids, attention_mask=mask, position_ids=position.clamp(min=0),  # noqa: E731
                              past_key_values=cache, use_cache=True).logits[:, -1]
    logits = step(prompts)
    position = position[:, -1:]
    finished = torch.zeros(bs, dtype=torch.bool, device=prompts.device)
    response, alive = [], []
    for _ in range(cfg.response_len):
        token = next_tokens(logits, cfg, generator)
        token = torch.where(finished, torch.full_like(token, eos_token_id), token)
        alive.append(~finished)
        response.append(token)
        finished = finished | (token == eos_token_id)
        if finished.all():
            break
        mask, position = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1), position + 1
        logits = step(token[:, None])
    n_missing = cfg.response_len - len(response)
    response += [torch.full_like(response[0], eos_token_id)] * n_missing
    alive += [torch.zeros_like(alive[0])] * n_missing
    response_mask = torch.stack(alive, dim=1)
    return TokenDataset(
        input_ids=torch.cat([prompts, torch.stack(response, dim=1)], dim=1),
        loss_mask=torch.cat([torch.zeros_like(prompt_mask), response_mask], dim=1),
        attention_mask=torch.cat([prompt_mask, response_mask], dim=1),
    )


def build_dataset(
    documents: list[torch.Tensor],  # each [doc_len] long, training documents only
    cfg: DataConfig,
    target: torch.nn.Module | None = None,
    eos_token_id: int | None = None,
    progress: bool = True,
    partial: Path | None = None,
) -> TokenDataset:
    """Build cfg.num_samples samples from the documents (and the target, for the generated sources).

    partial: a file that holds the generation so far, rewritten after every batch (the finished batches and the
    generator's state). A build interrupted part-way (generating thousands of replies on a CPU takes tens of
    minutes) and started again with the same file, config, documents and target continues where it stopped and
    returns exactly the dataset of an uninterrupted build. The caller ties the file to the dataset's key and
    removes it once the dataset is saved.
    """
    generator = torch.Generator().manual_seed(cfg.seed)
    if cfg.source == "corpus":
        ids = sample_windows(documents, cfg.seq_len, cfg.num_samples, generator)
        loss_mask = torch.ones_like(ids, dtype=torch.bool)
        loss_mask[:, : cfg.prompt_len] = False
        return TokenDataset(ids, loss_mask, torch.ones_like(loss_mask))
    if target is None or eos_token_id is None:
        raise ValueError(f"source={cfg.source!r} needs the target model and its eos_token_id")
    if cfg.source == "chat":
        prompts, prompt_mask = pick_chat_prompts(documents, cfg, eos_token_id, generator)
    else:
        prompts = sample_windows(documents, cfg.prompt_len, cfg.num_samples, generator)
        prompt_mask = torch.ones_like(prompts, dtype=torch.bool)
    device = next(target.parameters()).device
    parts = []
    if partial is not None and partial.exists():
        try:
            saved = torch.load(partial, weights_only=True)
            parts = [TokenDataset(**part) for part in saved["parts"]]
            generator.set_state(saved["generator"])
        except (*UNREADABLE_CACHE, KeyError):
            parts = []  # started again from the first batch
    starts = range(0, cfg.num_samples, cfg.generation_batch_size)
    bar = tqdm(starts, desc="generating training data", unit="batch", disable=not progress, initial=len(parts))
    for start in starts[len(parts):]:
        rows = slice(start, start + cfg.generation_batch_size)
        # Drop the padding columns no prompt of this batch needs (a batch holds prompts of similar length).
        width = int(prompt_mask[rows].sum(dim=1).max())
        chunk, chunk_mask = prompts[rows, -width:].to(device), prompt_mask[rows, -width:].to(device)
        part = continue_prompts(target, chunk, cfg, eos_token_id, generator, prompt_mask=chunk_mask)
        aligned = right_align(part, cfg.seq_len, eos_token_id)
        parts.append(TokenDataset(aligned.input_ids.cpu(), aligned.loss_mask.cpu(), aligned.attention_mask.cpu()))
        if partial is not None:
            save_atomically({"parts": [vars(done) for done in parts], "generator": generator.get_state()}, partial)
        bar.update()
    bar.close()
    fields = ("input_ids", "loss_mask", "attention_mask")
    return TokenDataset(*(torch.cat([getattr(part, f) for part in parts]) for f in fields))


def save_atomically(obj, path: Path) -> None:
    """torch.save through a temporary file: an interruption leaves the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def pick_chat_prompts(
    prompts: list[torch.Tensor],  # each [prompt_tokens] long, chat-templated with the generation prompt
    cfg: DataConfig,
    pad_id: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cfg.num_samples distinct prompts of <= prompt_len tokens, drawn at random, ordered by length.

    Returns ([n, prompt_len] long left-padded with pad_id, [n, prompt_len] bool mask of the real tokens).
    """
    usable = [p for p in prompts if 0 < p.numel() <= cfg.prompt_len]
    if len(usable) < cfg.num_samples:
        raise ConfigError(f"only {len(usable)} of {len(prompts)} chat prompts have <= {cfg.prompt_len} tokens, "
                          f"fewer than num_samples={cfg.num_samples}: raise prompt_len or lower num_samples")
    chosen = [usable[i] for i in torch.randperm(len(usable), generator=generator)[: cfg.num_samples].tolist()]
    chosen.sort(key=len)  # similar lengths share a generation batch: little padding
    ids = torch.full((len(chosen), cfg.prompt_len), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for row, prompt in enumerate(chosen):
        ids[row, cfg.prompt_len - prompt.numel() :] = prompt
        mask[row, cfg.prompt_len - prompt.numel() :] = True
    return ids, mask


def right_align(part: TokenDataset, seq_len: int, pad_id: int) -> TokenDataset:
    """Move each row's left padding to its end and pad or cut the rows to seq_len: [prompt, response, padding]."""
    n, length = part.input_ids.shape
    pad = (~part.attention_mask).long().cumprod(dim=1).sum(dim=1)  # leading padding per row
    index = (torch.arange(length, device=pad.device) + pad[:, None]).clamp(max=length - 1)
    inside = torch.arange(length, device=pad.device) < (length - pad)[:, None]
    input_ids = torch.where(inside, part.input_ids.gather(1, index), torch.full_like(part.input_ids, pad_id))
    loss_mask, attention_mask = (m.gather(1, index) & inside for m in (part.loss_mask, part.attention_mask))
    if length < seq_len:
        extra = seq_len - length
        input_ids = torch.cat([input_ids, input_ids.new_full((n, extra), pad_id)], dim=1)
        loss_mask, attention_mask = (torch.cat([m, m.new_zeros(n, extra)], dim=1) for m in (loss_mask, attention_mask))
    return TokenDataset(input_ids[:, :seq_len], loss_mask[:, :seq_len], attention_mask[:, :seq_len])


def save_dataset(dataset: TokenDataset, key: dict, path: Path) -> None:
    """Write the samples to `path` (.pt) and the JSON `key` that identifies them (DataConfig, target, ...)
    to `path`.json."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(dataclasses.asdict(dataset), path)
    path.with_suffix(".json").write_text(json.dumps(key, indent=2, sort_keys=True) + "\n")


def load_dataset(path: Path, key: dict) -> TokenDataset | None:
    """The cached dataset at `path` if it was saved with exactly this `key`, else None."""
    meta = path.with_suffix(".json")
    try:  # a cache file a killed run cut short, or any other unreadable one, is a miss: the dataset is rebuilt
        if not path.exists() or not meta.exists() or json.loads(meta.read_text()) != json.loads(json.dumps(key)):
            return None
        return TokenDataset(**torch.load(path, weights_only=True))
    except UNREADABLE_CACHE:
        return None
