"""Train the embedded target (a Qwen3ForCausalLM) from scratch on the stdlib corpus.

Recipe: documents are tokenized, each followed by EOS, and concatenated into one stream per split.
A training batch is `batch_size` windows of `seq_len + 1` tokens cut at uniformly random offsets of
the train stream (next-token cross-entropy on the last `seq_len` positions). AdamW (weight decay on
matrices only), linear warmup then cosine decay to `min_lr_ratio * lr`, gradient clipping.

Budget: training stops at `max_steps` or after `max_minutes`, whichever comes first. The learning-rate
schedule follows progress = max(step / max_steps, elapsed / budget), so the cosine reaches its floor
when the run ends, whichever limit binds. With `max_steps` only, a run is a pure function of the seed
(up to CPU floating-point nondeterminism); with a time budget the step count depends on machine speed.

Held-out perplexity = exp(mean next-token NLL over the held-out stream), cut into consecutive windows
of `seq_len + 1` tokens that overlap by one, so every held-out token after the first is scored once,
with at most `seq_len` tokens of context.
"""
from __future__ import annotations

import dataclasses
import math
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from tqdm.auto import tqdm
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from dspark.models.embedded_target.card import write_card_and_log
from dspark.models.embedded_target.corpus import Corpus
from dspark.models.embedded_target.tokenizer import (
    DEFAULT_VOCAB_SIZE,
    EOS_TOKEN_ID,
    MASK_TOKEN_ID,
    encode_documents,
    save_tokenizer,
    train_tokenizer,
)
from dspark.models.errors import ConfigError

LOSS_WINDOW = 50  # steps averaged for the reported train loss
LOG_EVERY = 10  # steps per train_log.json history entry
SAMPLE_PROMPTS = ("def __init__(self", "import os\nimport sys\n\n\ndef main(", "class Queue:\n    def put(self")
SAMPLE_NEW_TOKENS = 48


@dataclasses.dataclass(frozen=True)
class TargetArchitecture:
    """Shape of the target model (defaults: the committed embedded target, 4.2M parameters)."""

    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 768
    vocab_size: int = DEFAULT_VOCAB_SIZE
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if getattr(self, field.name) <= 0:
                raise ConfigError(f"{field.name} must be positive, got {getattr(self, field.name)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )

    def qwen3_config(self) -> Qwen3Config:
        return Qwen3Config(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings,
            rope_parameters={"rope_theta": self.rope_theta, "rope_type": "default"},
            tie_word_embeddings=True,
            bos_token_id=EOS_TOKEN_ID,
            eos_token_id=EOS_TOKEN_ID,
            pad_token_id=EOS_TOKEN_ID,
            dtype="float32",
        )


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """Optimisation and budget settings; at least one of max_steps / max_minutes must be set."""

    seq_len: int = 256
    batch_size: int = 16
    lr: float = 2.5e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    max_steps: int | None = None
    max_minutes: float | None = None
    seed: int = 0
    eval_every: int = 250  # steps between quick held-out checks (0: none)
    eval_windows: int = 32  # windows in a quick check; the final evaluation uses all of them

    def __post_init__(self) -> None:
        if self.max_steps is None and self.max_minutes is None:
            raise ConfigError("set max_steps (--steps) or max_minutes (--minutes): training needs a budget")
        for name in ("seq_len", "batch_size", "max_steps", "max_minutes", "lr", "grad_clip", "eval_windows"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{name} must be positive, got {value}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")

    def progress(self, step: int, elapsed_s: float) -> float:
        """Fraction of the budget used: the larger of the step and the time fractions."""
        fractions = []
        if self.max_steps is not None:
            fractions.append(step / self.max_steps)
        if self.max_minutes is not None:
            fractions.append(elapsed_s / (60.0 * self.max_minutes))
        return max(fractions)

    def lr_at(self, step: int, progress: float) -> float:
        """Linear warmup over warmup_steps, then cosine from lr to min_lr_ratio * lr over the budget."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
        return self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)


def sample_batch(stream: torch.Tensor, seq_len: int, batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """Random windows of the token stream.

    stream: [num_tokens] int64. Returns [bs, seq_len + 1] int64 (inputs = [:, :-1], targets = [:, 1:]).
    """
    starts = torch.randint(0, stream.numel() - seq_len - 1, (batch_size,), generator=generator)
    return torch.stack([stream[s : s + seq_len + 1] for s in starts.tolist()])


def next_token_nll(model: Qwen3ForCausalLM, windows: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of each window's next tokens. windows: [bs, seq + 1] int64."""
    logits = model(input_ids=windows[:, :-1]).logits  # [bs, seq, vocab]
    return F.cross_entropy(logits.flatten(0, 1).float(), windows[:, 1:].flatten(), reduction=reduction)


def eval_windows(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Consecutive windows overlapping by one token, so each token after the first is a target once.

    stream: [num_tokens] int64. Returns [num_windows, seq_len + 1]; the ragged tail is dropped.
    """
    num_windows = (stream.numel() - 1) // seq_len
    return torch.stack([stream[i * seq_len : i * seq_len + seq_len + 1] for i in range(num_windows)])


@torch.no_grad()
def held_out_nll(model: Qwen3ForCausalLM, windows: torch.Tensor, batch_size: int) -> float:
    """Mean next-token NLL over all windows ([num_windows, seq + 1]); perplexity is its exp."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for chunk in windows.split(batch_size):
        total += next_token_nll(model, chunk, reduction="sum").item()
        count += chunk[:, 1:].numel()
    model.train(was_training)
    return total / count


def build_optimizer(model: torch.nn.Module, settings: TrainSettings) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (linear and embedding weights), none on norms."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": settings.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=settings.lr, betas=(0.9, 0.95), eps=1e-8)


def _recent_mean(losses: list[float]) -> float:
    return sum(losses[-LOSS_WINDOW:]) / len(losses[-LOSS_WINDOW:])


def run_training(
    model: Qwen3ForCausalLM, train_stream: torch.Tensor, held_out: torch.Tensor, settings: TrainSettings
) -> dict:
    """The optimisation loop. train_stream: [num_tokens]; held_out: [num_windows, seq + 1].

    Returns the history (per-step loss and lr, quick held-out checks) and the step/token/time totals.
    """
    generator = torch.Generator().manual_seed(settings.seed + 1)
    optimizer = build_optimizer(model, settings)
    quick = held_out[: settings.eval_windows]
    steps, checks, losses = [], [], []
    model.train()
    start = time.monotonic()
    bar = tqdm(total=settings.max_steps, desc="embedded target", unit="step", dynamic_ncols=True)
    step, progress = 0, 0.0
    while progress < 1.0:
        lr = settings.lr_at(step, progress)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = next_token_nll(model, sample_batch(train_stream, settings.seq_len, settings.batch_size, generator))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        optimizer.step()
        step += 1
        losses.append(loss.item())
        elapsed = time.monotonic() - start
        if step % LOG_EVERY == 0:
            mean_loss = sum(losses[-LOG_EVERY:]) / LOG_EVERY
            steps.append({"step": step, "loss": round(mean_loss, 4), "lr": lr, "elapsed_s": round(elapsed, 1)})
        if settings.eval_every and step % settings.eval_every == 0:
            nll = held_out_nll(model, quick, settings.batch_size)
            checks.append({"step": step, "held_out_nll_quick": round(nll, 4), "ppl": round(math.exp(nll), 2)})
            bar.write(f"step {step}: quick held-out ppl {math.exp(nll):.2f}")
        bar.set_postfix(loss=f"{_recent_mean(losses):.3f}", lr=f"{lr:.2e}", refresh=False)
        bar.update(1)
        progress = settings.progress(step, time.monotonic() - start)
    bar.close()
    return {
        "steps": step,
        "tokens_seen": step * settings.batch_size * settings.seq_len,
        "train_seconds": round(time.monotonic() - start, 1),
        "final_train_loss": round(_recent_mean(losses), 4),
        "history": steps,
        "quick_checks": checks,
    }


def save_target(model: Qwen3ForCausalLM, out_dir: Path) -> None:
    """config.json + model.safetensors (float32) + generation_config.json with EOS id 0."""
    model.generation_config = GenerationConfig(
        eos_token_id=EOS_TOKEN_ID, pad_token_id=EOS_TOKEN_ID, bos_token_id=EOS_TOKEN_ID, do_sample=False
    )
    model.save_pretrained(str(out_dir))


@torch.no_grad()
def greedy_samples(model: Qwen3ForCausalLM, tokenizer: Tokenizer) -> list[dict]:
    """Greedy continuations of SAMPLE_PROMPTS (stopping at EOS), for the model card."""
    model.eval()
    samples = []
    for prompt in SAMPLE_PROMPTS:
        prompt_ids = torch.tensor([tokenizer.encode(prompt).ids])  # [1, seq]
        output = model.generate(prompt_ids, max_new_tokens=SAMPLE_NEW_TOKENS, do_sample=False,
                                eos_token_id=EOS_TOKEN_ID, pad_token_id=EOS_TOKEN_ID)
        new_ids = output[0, prompt_ids.shape[1]:].tolist()
        samples.append({"prompt": prompt, "new_tokens": len(new_ids), "continuation": tokenizer.decode(new_ids)})
    return samples


def train_target(
    corpus: Corpus, arch: TargetArchitecture, settings: TrainSettings, out_dir: Path, command: str
) -> dict:
    """Tokenizer, model, training, held-out evaluation, then weights, tokenizer, card and train log
    in `out_dir`. `command` is the command line that reproduces the run (recorded in the card)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    wall_start = time.monotonic()
    train_texts, held_out_texts = corpus.train_texts(), corpus.held_out_texts()
    tokenizer = train_tokenizer(train_texts, arch.vocab_size)
    train_stream = torch.tensor(encode_documents(tokenizer, train_texts), dtype=torch.long)
    held_out_stream = torch.tensor(encode_documents(tokenizer, held_out_texts), dtype=torch.long)
    if train_stream.numel() <= settings.seq_len + 1 or held_out_stream.numel() <= settings.seq_len + 1:
        raise ConfigError(f"corpus too small for seq_len {settings.seq_len}: use a larger corpus or seq_len")
    torch.manual_seed(settings.seed)
    model = Qwen3ForCausalLM(arch.qwen3_config())
    held_out = eval_windows(held_out_stream, settings.seq_len)
    result = run_training(model, train_stream, held_out, settings)
    nll = held_out_nll(model, held_out, settings.batch_size)
    save_tokenizer(tokenizer, out_dir)
    save_target(model, out_dir)
    log = {
        "command": command,
        "architecture": dataclasses.asdict(arch),
        "settings": dataclasses.asdict(settings),
        "parameters": sum(p.numel() for p in model.parameters()),
        "mask_token_id": MASK_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "corpus": corpus.describe(),
        "train_tokens": train_stream.numel(),
        "held_out_tokens": held_out_stream.numel(),
        "held_out_scored_tokens": held_out[:, 1:].numel(),
        "chars_per_token": round(sum(map(len, train_texts)) / train_stream.numel(), 3),
        "held_out_nll": round(nll, 5),
        "held_out_perplexity": round(math.exp(nll), 3),
        "samples": greedy_samples(model, tokenizer),
        "wall_seconds": round(time.monotonic() - wall_start, 1),
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        **result,
    }
    write_card_and_log(out_dir, log)
    return log
