"""The documents a training job reads: the corpus's files, or the chat prompts (the built-in generated set and a
prompts file's first user turns, or the first user turns of --data's conversations) in the target's chat template,
each split train / held-out by a stable hash."""
from __future__ import annotations

import hashlib

import torch

from dspark.models.embedded_target.corpus import Corpus, is_held_out
from dspark.models.errors import ConfigError
from dspark.models.portable_paths import portable
from dspark.models.prompts import read_turns
from dspark.models.training.chat_prompts import generate_chat_prompts
from dspark.models.training.data_files import data_key, first_user_turns, read_data

BUILTIN_CHAT_PROMPTS = 6000  # size of the generated prompt set when no --prompts-file is given (seed 0)


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
    if job.data_path is not None:
        texts = first_user_turns(read_data(job.data_path))
        return ((lambda split: chat_documents(texts, tokenizer, corpus.held_out_percent, split)),
                f"regenerated conversations of {portable(job.data_path)}", data_key(job.data_path))
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
