"""A tiny DeepseekV4ForCausalLM with non-degenerate random weights, made on the spot.

The attention geometry is DeepSeek-V4-Flash's (facts/sglang-dsv4.md §4: 64 query heads over one 512-wide
KV head, q_lora_rank 1024, grouped output projection 8 x 1024, a 128-token sliding window on every layer,
compressed KV every 4 (C4, with the 64 x 128 indexer and its top-512) or 128 (C128) tokens, mHC with 4
copies of the residual stream); hidden size 2048, 4 layers (compress ratios 0, 4, 128, 4: one window-only
layer, two C4 layers, one C128 layer) and 256 narrow experts are tiny. Every tensor SGLang 0.5.17's V4
loader takes is written to model.safetensors, seeded (scales: STD below), bf16 except where SGLang keeps
the parameter in fp32.

Checkpoint names are SGLang's own parameter names, which its loader (models/deepseek_v4.py,
DeepseekV4ForCausalLM.load_weights) takes as they are, with these fusions:
- self_attn.wq_a + self_attn.wkv into wqkv_a (when SGLANG_OPT_FUSE_WQA_WKV is on; loaded apart otherwise);
- <...>.compressor.wkv + <...>.compressor.wgate concatenated into <...>.compressor.wkv_gate (both needed);
- mlp.shared_experts.gate_proj / up_proj stacked into gate_up_proj;
- mlp.experts.E.gate_proj / up_proj / down_proj into the fused experts' w13 / w2;
- fp32 parameters: the mHC mixing (hc_*), attn_sink, compressor.ape [ratio, (1 + (ratio == 4)) x head_dim]
  and compressor.norm, mlp.gate.e_score_correction_bias.
With SGLANG_OPT_FP8_WO_A_GEMM=0 (server.py's V4 environment) wo_a is an ordinary bf16 weight. A name the
model lacks is only warned about ("not found in params_dict") and a parameter nobody loads keeps garbage
("Some weights are not initialized from checkpoints"): compare.py stops on either line, and the CPU test
checks these names against that mapping.

    python3 tests/gpu/dsa/tiny_v4_model.py DIR [--seed 0] [--check]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # the repository root, so `tests.gpu` imports when run as a script

from tests.gpu.dsa.tiny_dsa_model import (  # noqa: E402
    TensorSpec,
    check_directory,
    make_tensor,
    run_cli,
    write_model_directory,
)

CONTEXT_LENGTH = 8192  # the probe's --context-length

# facts/sglang-dsv4.md §4, the config that served; vocab and special ids come from the tokenizer.
BASE_CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "hidden_size": 2048, "num_hidden_layers": 4,
    "num_attention_heads": 64, "num_key_value_heads": 1,
    "head_dim": 512, "qk_nope_head_dim": 448, "qk_rope_head_dim": 64, "v_head_dim": 512,
    "q_lora_rank": 1024, "kv_lora_rank": 512, "o_groups": 8, "o_lora_rank": 1024,
    "sliding_window": 128, "window_size": 128,
    "compress_ratios": [0, 4, 128, 4], "compress_rope_theta": 160000,
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-06,
    "n_routed_experts": 256, "num_experts_per_tok": 6, "n_shared_experts": 1, "moe_intermediate_size": 128,
    "intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sqrtsoftplus",
    "norm_topk_prob": True, "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
    # 0.5.17 reads num_hash_layers (0: no hash-routed layer); n_hash_layers is its config class's spelling.
    "first_k_dense_replace": 0, "num_hash_layers": 0, "n_hash_layers": 0,
    "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 10000, "max_position_embeddings": 65536,
    # original_max_position_embeddings is read unconditionally (a KeyError without it).
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True,
}

# (mean, std) of the N(mean, std) weights, per checkpoint-name suffix, first match wins. Why these values:
# - Projections whose output is normalized next have no say over the scale: wq_a (-> q_norm), wq_b (SGLang
#   RMS-normalizes each head of q, without a weight, before RoPE), wkv (-> kv_norm), the compressors' wkv
#   (-> compressor.norm), the indexer's wq_b (its q is FP8-quantized with a per-token scale).
# - Attention logits: q is unit-RMS per head, so q.k over 512 dims has std sqrt(512) x the keys' RMS, and
#   the keys' RMS is kv_norm's (window keys) or compressor.norm's (C4/C128 keys) weight. Weight 3 and the
#   softmax scale 512^-0.5 give logits with std ~3 across keys (the CPU test measures layer 0's window and
#   layer 1's / layer 2's compressed keys): most of a row's weight on few keys, so which keys the indexer
#   keeps changes the output. Norm weights of 1 would give std ~1 (nearly uniform over 128 keys).
# - Compressor gates: score + ape is softmaxed over the ratio's tokens per channel; wgate 0.02 on the
#   unit-RMS input and ape N(0, 0.5) give scores of std ~1, so each compressed key is a weighted mix of
#   its tokens, not one token and not a plain mean.
# - Indexer: scores sum_h w_h relu(q_h . k) of spread ~0.5 over keys of RMS 1 (norm weight 1): fp32 scores
#   with no repeated values, so the top-512 has a boundary (the CPU test measures the gap at it).
# - Output path: o has RMS ~3 (the keys'); wo_a 0.01 over 4096 inputs per group, wo_b 0.005 over 8192:
#   the attention adds ~0.8 RMS to a residual stream of RMS 1 (embeddings N(0, 1)), so the next token
#   depends on the context, not only on the current token.
# - mHC: hc_*_fn 0.01 over the 8192-wide normalized stream gives mixes of std ~0.9; with scale ~1 and
#   base ~0 the pre/post weights sit near sigmoid's middle and the Sinkhorn mix is far from a permutation.
# - MoE: router 0.02 (logits std ~0.9, routing depends on the token), experts 0.03 / 0.05.
# - lm_head 0.06 on the unit-RMS final hidden: vocabulary logits with std ~2.7, so logprobs have spread.
# - Every other norm weight is 1 + N(0, 0.1), not the modules' default ones, so a norm the loader skipped
#   would change the outputs.
STD: list[tuple[str, tuple[float, float]]] = [
    ("embed_tokens.weight", (0.0, 1.0)),
    ("self_attn.kv_norm.weight", (3.0, 0.3)),
    ("indexer.compressor.norm.weight", (1.0, 0.1)),
    ("compressor.norm.weight", (3.0, 0.3)),
    ("compressor.ape", (0.0, 0.5)),
    ("compressor.wkv.weight", (0.0, 0.02)), ("compressor.wgate.weight", (0.0, 0.02)),
    ("indexer.wq_b.weight", (0.0, 0.03)), ("indexer.weights_proj.weight", (0.0, 0.02)),
    ("self_attn.attn_sink", (0.0, 1.0)),
    ("self_attn.wq_a.weight", (0.0, 0.02)), ("self_attn.wq_b.weight", (0.0, 0.02)),
    ("self_attn.wkv.weight", (0.0, 0.02)),
    ("self_attn.wo_a.weight", (0.0, 0.01)), ("self_attn.wo_b.weight", (0.0, 0.005)),
    ("_fn", (0.0, 0.01)), ("_base", (0.0, 0.1)), ("_scale", (1.0, 0.1)),  # hc_{attn,ffn,head}_*
    ("mlp.gate.weight", (0.0, 0.02)), ("mlp.gate.e_score_correction_bias", (0.0, 0.1)),
    ("gate_proj.weight", (0.0, 0.03)), ("up_proj.weight", (0.0, 0.03)), ("down_proj.weight", (0.0, 0.05)),
    ("lm_head.weight", (0.0, 0.06)),
    ("norm.weight", (1.0, 0.1)),  # q_norm, model.norm, input_layernorm, post_attention_layernorm
]


def init_of(name: str) -> tuple[float, float]:
    """(mean, std) of the tensor called `name`."""
    for suffix, init in STD:
        if name.endswith(suffix):
            return init
    raise KeyError(f"no initialization for {name}")


def checkpoint_spec(config: dict) -> list[TensorSpec]:
    """Every tensor SGLang 0.5.17's DeepseekV4 loader takes for this config, in file order."""
    h, v, hc = config["hidden_size"], config["vocab_size"], config["hc_mult"]
    heads, hd, qlr = config["num_attention_heads"], config["head_dim"], config["q_lora_rank"]
    groups, olr = config["o_groups"], config["o_lora_rank"]
    ih, idim = config["index_n_heads"], config["index_head_dim"]
    experts, inter = config["n_routed_experts"], config["moe_intermediate_size"]
    shared = inter * config["n_shared_experts"]
    ratios = config["compress_ratios"]
    if len(ratios) != config["num_hidden_layers"] or not set(ratios) <= {0, 4, 128}:
        raise ValueError(f"compress_ratios {ratios}: one per layer (num_hidden_layers "
                         f"{config['num_hidden_layers']}), each 0, 4 or 128")
    if config.get("num_hash_layers", 0) or config.get("first_k_dense_replace", 0):
        raise ValueError("only noaux_tc MoE layers are written: num_hash_layers and first_k_dense_replace must be 0")
    mix = (2 + hc) * hc  # pre, post and the hc x hc combination, per copy

    def fp32(name: str, shape: tuple[int, ...]) -> TensorSpec:
        return TensorSpec(name, shape, "float32")

    def compressor(prefix: str, ratio: int, dim: int) -> list[TensorSpec]:
        width = (1 + (ratio == 4)) * dim  # C4 compresses overlapping windows: two halves per entry
        return [fp32(f"{prefix}.ape", (ratio, width)), TensorSpec(f"{prefix}.wkv.weight", (width, h)),
                TensorSpec(f"{prefix}.wgate.weight", (width, h)), fp32(f"{prefix}.norm.weight", (dim,))]

    specs = [TensorSpec("model.embed_tokens.weight", (v, h))]
    for i, ratio in enumerate(ratios):
        p, a = f"model.layers.{i}", f"model.layers.{i}.self_attn"
        specs += [
            TensorSpec(f"{p}.input_layernorm.weight", (h,)),
            TensorSpec(f"{p}.post_attention_layernorm.weight", (h,)),
            *(fp32(f"{p}.hc_{part}_fn", (mix, hc * h)) for part in ("attn", "ffn")),
            *(fp32(f"{p}.hc_{part}_base", (mix,)) for part in ("attn", "ffn")),
            *(fp32(f"{p}.hc_{part}_scale", (3,)) for part in ("attn", "ffn")),
            fp32(f"{a}.attn_sink", (heads,)),
            TensorSpec(f"{a}.wq_a.weight", (qlr, h)),
            TensorSpec(f"{a}.wkv.weight", (hd, h)),
            TensorSpec(f"{a}.q_norm.weight", (qlr,)),
            TensorSpec(f"{a}.wq_b.weight", (heads * hd, qlr)),
            TensorSpec(f"{a}.kv_norm.weight", (hd,)),
            TensorSpec(f"{a}.wo_a.weight", (groups * olr, heads * hd // groups)),
            TensorSpec(f"{a}.wo_b.weight", (h, groups * olr)),
        ]
        if ratio:
            specs += compressor(f"{a}.compressor", ratio, hd)
        if ratio == 4:
            specs += [TensorSpec(f"{a}.indexer.wq_b.weight", (ih * idim, qlr)),
                      TensorSpec(f"{a}.indexer.weights_proj.weight", (ih, h)),
                      *compressor(f"{a}.indexer.compressor", 4, idim)]
        m = f"{p}.mlp"
        specs += [TensorSpec(f"{m}.gate.weight", (experts, h)), fp32(f"{m}.gate.e_score_correction_bias", (experts,))]
        for e in range(experts):
            specs += [TensorSpec(f"{m}.experts.{e}.gate_proj.weight", (inter, h)),
                      TensorSpec(f"{m}.experts.{e}.up_proj.weight", (inter, h)),
                      TensorSpec(f"{m}.experts.{e}.down_proj.weight", (h, inter))]
        specs += [TensorSpec(f"{m}.shared_experts.gate_proj.weight", (shared, h)),
                  TensorSpec(f"{m}.shared_experts.up_proj.weight", (shared, h)),
                  TensorSpec(f"{m}.shared_experts.down_proj.weight", (h, shared))]
    specs += [TensorSpec("model.norm.weight", (h,)),
              fp32("model.hc_head_fn", (hc, hc * h)), fp32("model.hc_head_base", (hc,)),
              fp32("model.hc_head_scale", (1,)),
              TensorSpec("lm_head.weight", (v, h))]
    return specs


def v4_config(vocab_size: int, bos: int, eos: int, **overrides) -> dict:
    """BASE_CONFIG with the tokenizer's vocabulary; `overrides` shrink it for CPU tests of the file format."""
    unknown = set(overrides) - set(BASE_CONFIG)
    if unknown:
        raise KeyError(f"not config keys: {sorted(unknown)}")
    return {**BASE_CONFIG, **overrides, "vocab_size": vocab_size, "bos_token_id": bos, "eos_token_id": eos}


def deeper(layers: int) -> dict:
    """The config overrides of a `layers`-deep model: the base's four compress ratios repeated (window-only, C4,
    C128, C4, ...), so every kind of layer keeps its share as the model deepens."""
    base = BASE_CONFIG["compress_ratios"]
    return {"num_hidden_layers": layers, "compress_ratios": [base[i % len(base)] for i in range(layers)]}


def make_tiny_v4_model(directory: Path, *, seed: int = 0, layers: int | None = None, **overrides) -> Path:
    """config.json, the byte-level tokenizer of tests/gpu/tiny_model.py and model.safetensors in `directory`;
    `layers` for the deeper model of the decode-step measurement (steps.py)."""
    if layers is not None:
        overrides = {**deeper(layers), **overrides}
    return write_model_directory(directory, lambda v, b, e: v4_config(v, b, e, **overrides), checkpoint_spec,
                                 seed=seed, init=init_of, context_length=CONTEXT_LENGTH)


def make_v4_tensor(spec: TensorSpec, seed: int):
    return make_tensor(spec, seed, init_of)


# What SGLang's config loader must read back as config.json has it (the backend and pool assert most of them).
CHECKED_KEYS = ("head_dim", "num_key_value_heads", "num_attention_heads", "q_lora_rank", "o_groups", "o_lora_rank",
                "qk_rope_head_dim", "sliding_window", "compress_ratios", "index_topk", "index_n_heads",
                "index_head_dim", "hc_mult", "n_routed_experts", "num_hash_layers", "vocab_size")


def check_on_device(directory: Path) -> list[str]:
    """Read the directory back with the device's SGLang config loader (its deepseek_v4 alias of transformers'
    DeepseekV3Config, whose own head_dim default the json must override) and the safetensors package."""
    return check_directory(directory, checkpoint_spec, "DeepseekV4ForCausalLM", CHECKED_KEYS)


def main() -> int:
    return run_cli(__doc__, make_tiny_v4_model, check_on_device)


if __name__ == "__main__":
    raise SystemExit(main())
