"""Byte-level BPE tokenizer of the embedded target, with DSpark's mask token reserved.

Algorithm: GPT-2 style byte-level BPE (HF `tokenizers`): text is split by the GPT-2 regex, mapped to
the 256 byte symbols, and merges are learned on the train split up to `vocab_size` entries. No prefix
space is added and no normaliser runs, so `decode(encode(text)) == text` for every string.

Invariants:
- id 0 is `<|endoftext|>` (EOS; also the pad token and the document separator in training);
- id 1 is `<|mask|>`, DSpark's `mask_token_id`. Both are added special tokens, so BPE merges never
  produce them: text yields them only when it literally contains the token string.
- the saved directory loads with `AutoTokenizer.from_pretrained` / `PreTrainedTokenizerFast` and has a
  chat template made of plain text only, so an OpenAI-style chat endpoint can serve the model.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from dspark.models.errors import ConfigError

EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"
EOS_TOKEN_ID = 0
MASK_TOKEN_ID = 1
SPECIAL_TOKENS = (EOS_TOKEN, MASK_TOKEN)  # order gives the ids above
DEFAULT_VOCAB_SIZE = 4096
MODEL_MAX_LENGTH = 2048

# The model is a base LM over Python source, so a chat is served as plain continuation: the messages'
# contents joined by newlines, no role markers, no special tokens, and no trailing newline (a lone "\n"
# token at the end would split the "\n" + indentation tokens that code continues with).
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ message['content'] }}{% endfor %}"
)


def train_tokenizer(texts: list[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """Learn the byte-level BPE on `texts`; ids 0 and 1 are EOS and mask."""
    minimum = 256 + len(SPECIAL_TOKENS)
    if vocab_size < minimum:
        raise ConfigError(f"vocab_size must be >= {minimum} (256 bytes + special tokens), got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    for token, expected_id in ((EOS_TOKEN, EOS_TOKEN_ID), (MASK_TOKEN, MASK_TOKEN_ID)):
        assert tokenizer.token_to_id(token) == expected_id, (token, tokenizer.token_to_id(token))
    return tokenizer


def wrap_for_transformers(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """The transformers view of the tokenizer, with EOS/pad/mask and the chat template set."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        mask_token=MASK_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tokenizer: Tokenizer, out_dir: Path) -> None:
    """Write tokenizer.json, tokenizer_config.json (and the chat template) to `out_dir`; tokenizer.json without the
    indentation transformers writes (2.5x smaller, the same tokenizer: the committed tree is bounded)."""
    wrap_for_transformers(tokenizer).save_pretrained(str(out_dir))
    path = Path(out_dir) / "tokenizer.json"
    path.write_text(json.dumps(json.loads(path.read_text(encoding="utf-8")), ensure_ascii=False,
                               separators=(",", ":")), encoding="utf-8")


def encode_documents(tokenizer: Tokenizer, texts: list[str]) -> list[int]:
    """Concatenate the token ids of `texts`, each document followed by EOS (the packing separator)."""
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(texts, add_special_tokens=False):
        ids += encoding.ids
        ids.append(EOS_TOKEN_ID)
    return ids
