"""The model card (README.md) and train_log.json of a trained embedded target.

The card is rendered from the train log only, so every number in it is one the run measured; the full
corpus file lists live in train_log.json and the card gives counts, sizes and the split rule.
"""
from __future__ import annotations

from pathlib import Path

from dspark.models.train_log import train_log_text

TRAIN_LOG = "train_log.json"
CARD = "README.md"
USAGE = '''## Use

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained("embedded/target")
tokenizer = AutoTokenizer.from_pretrained("embedded/target")
ids = tokenizer("def parse_args(", return_tensors="pt").input_ids
print(tokenizer.decode(model.generate(ids, max_new_tokens=40, do_sample=False)[0]))
```
'''
ESCAPED_PIPE = "\\|"  # GitHub tables split cells on "|" even inside code spans


def _table(rows: list[tuple[str, object]]) -> str:
    """A two-column markdown table; "|" in a cell (the special tokens) is escaped so it stays one cell."""
    cells = [(name, str(value).replace("|", ESCAPED_PIPE)) for name, value in rows]
    return "\n".join(["| | |", "|---|---|"] + [f"| {name} | {value} |" for name, value in cells])


def _architecture_table(log: dict) -> str:
    arch = log["architecture"]
    rows = [
        ("architecture", "Qwen3ForCausalLM (transformers), trained from scratch"),
        ("parameters", f"{log['parameters']:,} (tied input/output embeddings)"),
        ("hidden size", arch["hidden_size"]),
        ("layers", arch["num_layers"]),
        ("attention heads / KV heads / head dim", f"{arch['num_heads']} / {arch['num_kv_heads']} / {arch['head_dim']}"),
        ("MLP intermediate size", arch["intermediate_size"]),
        ("vocab", f"{arch['vocab_size']} (byte-level BPE)"),
        ("max positions / RoPE theta", f"{arch['max_position_embeddings']} / {arch['rope_theta']:g}"),
        ("dtype", "float32 (model.safetensors)"),
        ("special tokens", f"`<|endoftext|>` = {log['eos_token_id']} (EOS, pad, document separator); "
                           f"`<|mask|>` = {log['mask_token_id']} (DSpark `mask_token_id`)"),
    ]
    return _table(rows)


def _training_table(log: dict) -> str:
    settings = log["settings"]
    budget = []
    if settings["max_steps"] is not None:
        budget.append(f"{settings['max_steps']} steps")
    if settings["max_minutes"] is not None:
        budget.append(f"{settings['max_minutes']:g} min")
    rows = [
        ("budget", " or ".join(budget) + (" (whichever comes first)" if len(budget) > 1 else "")),
        ("steps run", log["steps"]),
        ("tokens seen", f"{log['tokens_seen']:,} ({log['tokens_seen'] / log['train_tokens']:.2f} epochs)"),
        ("batch x sequence", f"{settings['batch_size']} x {settings['seq_len']} (packed documents, EOS-separated)"),
        ("optimizer", f"AdamW, lr {settings['lr']:g}, betas (0.9, 0.95), weight decay {settings['weight_decay']:g}, "
                      f"grad clip {settings['grad_clip']:g}"),
        ("schedule", f"{settings['warmup_steps']} warmup steps, cosine to {settings['min_lr_ratio']:g} x lr"),
        ("seed", settings["seed"]),
        ("training time", f"{log['train_seconds'] / 60:.1f} min (whole command {log['wall_seconds'] / 60:.1f} min)"),
        ("final train loss", f"{log['final_train_loss']:.4f} (mean of the last 50 steps)"),
        ("held-out NLL", f"{log['held_out_nll']:.4f} nats/token over {log['held_out_scored_tokens']:,} tokens"),
        ("**held-out perplexity**", f"**{log['held_out_perplexity']:.2f}**"),
    ]
    return _table(rows)


def _curve(log: dict) -> str:
    checks = log["quick_checks"]
    if not checks:
        return "none"
    stride = max(1, len(checks) // 8)  # at most ~8 points keep the line readable
    shown = checks[::stride] if checks[-1] in checks[::stride] else checks[::stride] + [checks[-1]]
    return ", ".join(f"step {c['step']} ppl {c['ppl']:.1f}" for c in shown)


def _samples(log: dict) -> str:
    return "\n\n".join(
        f"Prompt `{sample['prompt']!r}`, {sample['new_tokens']} new tokens:\n\n"
        f"```python\n{sample['prompt']}{sample['continuation']}\n```"
        for sample in log["samples"]
    )


def render_card(log: dict) -> str:
    corpus = log["corpus"]
    return f"""---
library_name: transformers
pipeline_tag: text-generation
---

# dspark embedded target

A tiny Qwen3 causal LM over Python source, the target model that dspark's drafters (DSpark, DFlash,
Eagle3) are trained against. Built by `dspark embedded-target` from the CPython standard library of
the interpreter that ran it ({log['python_version']}), so it needs no downloads.

## Model

{_architecture_table(log)}

## Corpus

All `*.py` files under the stdlib root, leaving out any file under a directory named
{', '.join(f'`{name}`' for name in corpus['excluded_dirs'])} and the build-specific
{', '.join(f'`{pattern}`' for pattern in corpus['excluded_build_files'])} (they differ between machines).

- split rule: {corpus['split_rule']} (held_out_percent = {corpus['held_out_percent']})
- train: {corpus['train_file_count']} files, {corpus['train_bytes']:,} bytes, {log['train_tokens']:,} tokens
- held out: {corpus['held_out_file_count']} files, {corpus['held_out_bytes']:,} bytes, {log['held_out_tokens']:,} tokens
- {log['chars_per_token']} characters per token on the train split
- file lists: `{TRAIN_LOG}` (`corpus.train_files`, `corpus.held_out_files`)

## Training

{_training_table(log)}

Held-out perplexity is exp(mean next-token NLL) over the held-out token stream cut into windows of
{log['settings']['seq_len']} + 1 tokens overlapping by one (every token after the first scored once).
Quick held-out checks ({log['settings']['eval_windows']} windows) during training: {_curve(log)}.
Per-step loss and learning rate are in `{TRAIN_LOG}`.

## Greedy samples

{_samples(log)}

## Reproduce

```
{log['command']}
```

Trained on CPU (torch threads: {log['torch_threads']}, torch {log['torch_version']}). A run bounded by
minutes ends at a step count that depends on machine speed (its learning-rate schedule follows the
clock); with `--steps` alone a run is a function of the seed and takes as long as the machine needs.

{USAGE}"""


def write_card_and_log(out_dir: Path, log: dict) -> None:
    """Write train_log.json and README.md next to the weights."""
    out_dir = Path(out_dir)
    (out_dir / TRAIN_LOG).write_text(train_log_text(log))
    (out_dir / CARD).write_text(render_card(log))
