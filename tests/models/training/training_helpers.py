"""Tiny random targets and stand-ins shared by the training tests (never the committed embedded weights)."""
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

TINY_VOCAB = 64
EOS_ID = 0
MASK_ID = 1


def build_tiny_target(seed: int = 0, layers: int = 4, hidden: int = 32) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=TINY_VOCAB,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=2 * hidden,
        tie_word_embeddings=True,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
    )
    return Qwen3ForCausalLM(config).eval()
