"""Loads our drafter checkpoints with SGLang 0.5.23's own code on CPU and writes what it found as JSON.

Run as a script in a separate process (it publishes SGLang's runtime config and starts a one-process gloo
group, which must not leak into the pytest process):

    SGLANG_USE_CPU_ENGINE=1 SGLANG_RAGGED_VERIFY_MODE=cap-accept python sglang_probe.py WORKDIR

WORKDIR holds `target/` (an HF Qwen3 target) and one checkpoint directory per case named in `cases.json`
({name: {"family": "dspark" | "dflash" | "eagle3", "numerics": bool}}; family = the SGLang algorithm whose
parser and draft class are used). For each case the report records:
- config: what SGLang's own config parsers make of config.json (or the error they raise);
- unfilled: SGLang parameters still NaN after `load_weights` (every parameter starts as NaN, so a weight
  SGLang did not consume from our file shows up here);
- mismatched: SGLang parameters whose loaded value differs from the tensor(s) we wrote for them;
- unconsumed: our weights that map to no SGLang parameter (besides the documented shared embedding/head);
- numerics: max |SGLang - ours| for pieces SGLang can run without a batch (context projection, K norm +
  RoPE, Markov step bias, confidence head, MLP, Eagle3 q/k);
- load_lm_head_from_target: Eagle3's flag for taking the target's lm_head (slim checkpoints);
- hot_token_id: the tokens a compact Eagle3's draft indices stand for, as SGLang read them from d2t.
Cap-accept mode makes SGLang build the DSpark confidence head (the default static mode drops it).
"""
import json
import socket
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from dspark.models.checkpoint import D2T, load_drafter

# Weights SGLang deliberately does not load for block drafters: it shares the target's embedding and head.
SHARED_FROM_TARGET = ("embed_tokens.weight", "lm_head.weight")
STACKED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
           "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def start_sglang(target_dir: Path) -> None:
    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    publish(ServerArgs(model_path=str(target_dir), device="cpu", skip_tokenizer_init=True), role="test",
            ranks=SpawnRanks(world_rank=0))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{port}")
    initialize_model_parallel()


def parse_config(kind: str, hf_config) -> dict:
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
    from sglang.srt.speculative.dspark_components.dspark_config import resolve_runtime_config

    if kind == "eagle3":
        return {"eagle_aux_hidden_state_layer_ids": hf_config.eagle_config["eagle_aux_hidden_state_layer_ids"]}
    if kind == "dflash":
        parsed = parse_dflash_draft_config(draft_hf_config=hf_config)
        return {"block_size": parsed.block_size, "target_layer_ids": parsed.target_layer_ids,
                "mask_token_id": parsed.mask_token_id}
    runtime = resolve_runtime_config(draft_hf_config=hf_config, speculative_num_draft_tokens=None,
                                     target_vocab_size=hf_config.vocab_size)
    return {"gamma": runtime.gamma, "mask_token_id": runtime.mask_token_id}


def sglang_name(kind: str, ours: str):
    """(SGLang parameter, shard index or None) that our weight `ours` loads into."""
    name = ours
    if kind == "eagle3":
        name = ours if ours == "lm_head.weight" else "model." + ours.replace("midlayer.", "layers.0.")
    for part, (fused, shard) in STACKED.items():
        if f".{part}." in name and (".self_attn." in name or ".mlp." in name):  # not markov_head.gate_proj
            return name.replace(f".{part}.", f".{fused}."), shard
    return name, None


def check_weights(kind: str, model, ours: dict) -> dict:
    params = dict(model.named_parameters())
    expected, unconsumed = {}, []
    for name in sorted(ours):
        target, shard = sglang_name(kind, name)
        if target not in params:
            if not (kind != "eagle3" and name in SHARED_FROM_TARGET) and not (kind == "eagle3" and name == D2T):
                unconsumed.append(name)
            continue
        expected.setdefault(target, {})[shard] = ours[name]
    for p in params.values():
        p.data.fill_(float("nan"))
    model.load_weights(iter(ours.items()))
    unfilled = sorted(n for n, p in params.items() if torch.isnan(p).any())
    mismatched = []
    for target, shards in expected.items():
        value = shards[None] if None in shards else torch.cat([shards[i] for i in sorted(shards)])
        loaded = params[target].data[: value.shape[0]]  # a padded vocab keeps extra rows
        if loaded.shape != value.shape or not torch.equal(loaded, value.to(loaded.dtype)):
            mismatched.append(target)
    return {"unfilled": unfilled, "mismatched": mismatched, "unconsumed": unconsumed,
            "sglang_params": sorted(params)}


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def block_numerics(model, drafter) -> dict:
    cfg = drafter.config
    torch.manual_seed(0)
    n = 5
    x = torch.randn(n, cfg.num_taps * cfg.hidden_size)
    positions = torch.arange(3, 3 + n)
    ours_ctx = drafter.hidden_norm(drafter.fc(x))
    out = {"context_projection": max_err(model.project_target_hidden(x), ours_ctx)}
    cos, sin = drafter.rotary(positions.unsqueeze(0))
    for i, (layer, ours_layer) in enumerate(zip(model.layers, drafter.layers)):
        attn = layer.self_attn
        k, v = attn.kv_proj_only(ours_ctx)
        k = attn.apply_k_rope(positions, attn.apply_k_norm(k))
        ours_k, ours_v = ours_layer.self_attn.keys_values(ours_ctx.unsqueeze(0), cos, sin)
        out[f"layer{i}_context_k"] = max_err(k, ours_k[0].transpose(0, 1).reshape(n, -1))
        out[f"layer{i}_context_v"] = max_err(v, ours_v[0].transpose(0, 1).reshape(n, -1))
        out[f"layer{i}_mlp"] = max_err(layer.mlp(ours_ctx), ours_layer.mlp(ours_ctx))
    out["final_norm"] = max_err(model.norm(ours_ctx), drafter.norm(ours_ctx))
    if getattr(model, "markov_head", None) is not None:
        out.update(markov_numerics(model, drafter, ours_ctx))
    return out


def markov_numerics(model, drafter, hidden: torch.Tensor) -> dict:
    """Two chained steps of the Markov bias (the RNN state carries over) and the confidence head."""
    prev = torch.randint(0, drafter.config.vocab_size, (2, hidden.shape[0]))
    theirs_state, ours_state = model.markov_head.init_state(hidden), drafter.markov_head.initial_state(hidden)
    out = {}
    for step in range(2):
        theirs, theirs_state = model.markov_head.step_bias(prev[step], hidden_states=hidden, state=theirs_state)
        code, ours_state = drafter.markov_head.step_code(prev[step], hidden, ours_state)
        out[f"markov_step{step}_bias"] = max_err(theirs, drafter.markov_head.markov_w2(code))
    if getattr(model, "confidence_head", None) is not None:
        prev_emb = drafter.markov_head.prev_embedding(prev[0])
        theirs = model.confidence_head(hidden, prev_emb if model.confidence_head.with_markov else None)
        out["confidence_logit"] = max_err(theirs, drafter.confidence_head(hidden, prev_emb))
    return out


def eagle3_numerics(model, drafter) -> dict:
    cfg = drafter.config
    torch.manual_seed(0)
    n = 5
    x = torch.randn(n, cfg.num_taps * cfg.hidden_size)
    tokens = torch.randint(0, cfg.vocab_size, (n,))
    positions = torch.arange(2, 2 + n)
    hidden = drafter.fc(x)
    out = {"fc": max_err(model.model.fc(x), hidden)}
    layer = model.model.layers[0]
    embeds = drafter.embed_tokens(tokens)
    qkv, _ = layer.self_attn.qkv_proj(torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], -1))
    q, k, _ = qkv.split([layer.self_attn.q_size, layer.self_attn.kv_size, layer.self_attn.kv_size], dim=-1)
    q, k = layer.self_attn.rotary_emb(positions, q, k)
    cos, sin = drafter.rotary(positions.unsqueeze(0))
    ours_q, ours_k, _ = drafter.midlayer.qkv(embeds.unsqueeze(0), hidden.unsqueeze(0), cos, sin)
    out["q"] = max_err(q, ours_q[0].transpose(0, 1).reshape(n, -1))
    out["k"] = max_err(k, ours_k[0].transpose(0, 1).reshape(n, -1))
    out["mlp"] = max_err(layer.mlp(hidden), drafter.midlayer.mlp(hidden))
    out["final_norm"] = max_err(model.model.norm(hidden), drafter.norm(hidden))
    return out


def probe_case(kind: str, path: Path, numerics: bool) -> dict:
    from sglang.srt.models.dflash import DFlashDraftModel
    from sglang.srt.models.dspark import Qwen3DSparkModel
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
    from sglang.srt.utils.hf_transformers_utils import get_config

    hf_config = get_config(str(path), trust_remote_code=False)
    report = {"architectures": hf_config.architectures}
    try:
        report["config"] = parse_config(kind, hf_config)
    except ValueError as err:
        report["config_error"] = str(err)
        return report
    model_class = {"dspark": Qwen3DSparkModel, "dflash": DFlashDraftModel, "eagle3": LlamaForCausalLMEagle3}[kind]
    model = model_class(hf_config).float()
    report.update(check_weights(kind, model, load_file(str(path / "model.safetensors"))))
    # Eagle3: whether SGLang's worker will replace the lm_head with the target's (set_embed_and_head).
    report["load_lm_head_from_target"] = getattr(model, "load_lm_head_from_target", None)
    # A compact Eagle3: the tokens SGLang's worker maps its draft indices to (d2t read into hot_token_id).
    hot = getattr(model, "hot_token_id", None)
    report["hot_token_id"] = None if hot is None else hot.tolist()
    if not numerics:
        return report
    drafter = load_drafter(path)
    with torch.no_grad():
        report["numerics"] = eagle3_numerics(model, drafter) if kind == "eagle3" else block_numerics(model, drafter)
    return report


def main(workdir: Path) -> None:
    torch.set_num_threads(2)
    start_sglang(workdir / "target")
    cases = json.loads((workdir / "cases.json").read_text())
    report = {name: probe_case(case["family"], workdir / name, case["numerics"]) for name, case in cases.items()}
    (workdir / "report.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
