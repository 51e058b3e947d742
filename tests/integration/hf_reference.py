"""What the served model must reproduce: transformers' own greedy decoding of the same model."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def hf_greedy(model_dir: Path, prompts: list[str], max_new_tokens: int) -> dict[str, tuple[list[int], str]]:
    """prompt -> (new token ids, their text), stopping before EOS the way SGLang reports it."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outputs = {}
    for prompt in prompts:
        input_ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            generated = model.generate(input_ids, max_new_tokens=max_new_tokens, do_sample=False)
        new_ids = generated[0, input_ids.shape[1]:].tolist()
        if tokenizer.eos_token_id in new_ids:  # SGLang stops at EOS and does not return it
            new_ids = new_ids[: new_ids.index(tokenizer.eos_token_id)]
        outputs[prompt] = (new_ids, tokenizer.decode(new_ids, skip_special_tokens=True))
    return outputs


def chat_prompt(model_dir: Path, message: str) -> str:
    """The text SGLang's /v1/chat/completions feeds the model for one user message (the HF chat template)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                         add_generation_prompt=True)
