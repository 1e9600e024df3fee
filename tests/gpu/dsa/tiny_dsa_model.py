"""A tiny DeepseekV32ForCausalLM with non-degenerate random weights, made on the spot.

The geometry is V3.2's attention (128 heads, kv_lora_rank 512, rope 64, q_lora_rank 1536; indexer of
64 heads x 128, top-k 2048) with a tiny hidden size and two dense layers (facts/sglang-dsa.md §4).
SGLang's `--load-format dummy` fills weights with uniform(-1e-3, 1e-3): attention logits are then ~0,
attention ~uniform, and every kernel gives the same tokens. Here every weight SGLang 0.5.17's loader
takes is written to model.safetensors (bf16, no quantization_config), seeded and deterministic, with
scales chosen so the model's computations have spread (see STD below).

Checkpoint names are the HF DeepSeek-V3.2 names, which SGLang 0.5.17 maps as follows
(models/deepseek_common/deepseek_weight_loader.py, do_load_weights; models/deepseek_v2.py):
- self_attn.q_a_proj + self_attn.kv_a_proj_with_mqa are concatenated into fused_qkv_a_proj_with_mqa
  (q_lora_rank is set); both must be present or neither loads;
- mlp.gate_proj / mlp.up_proj are stacked into mlp.gate_up_proj (dense layers: first_k_dense_replace=2);
- self_attn.indexer.wk and .weights_proj load as they are (the config has no indexer_rope_interleave,
  so the indexer is NeoX-style and not fused into wk_weights_proj); weights_proj is a bf16 parameter;
- self_attn.indexer.k_norm is a LayerNorm: weight and bias (fp32 parameters; bf16 is copied in);
- kv_b_proj is split into w_kc / w_vc after loading (post_load_weights);
- a name the model lacks is only warned about and a parameter nobody loads keeps its init, so the CPU
  test checks the names and shapes here against that mapping.

    python3 tests/gpu/dsa/tiny_dsa_model.py DIR [--seed 0] [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # the repository root, so `tests.gpu` imports when run as a script

from tests.gpu.dsa import safetensors_file  # noqa: E402
from tests.gpu.tiny_model import make_tiny_model  # noqa: E402

CONTEXT_LENGTH = 16384

# facts/sglang-dsa.md §4, the config that served; vocab and special ids come from the tokenizer.
BASE_CONFIG = {
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
    "hidden_size": 1024, "intermediate_size": 2048, "moe_intermediate_size": 256,
    "num_hidden_layers": 2, "first_k_dense_replace": 2, "moe_layer_freq": 1,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True,
    "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048,
    "hidden_act": "silu", "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True,
}

# Standard deviations of the N(0, std) weights, per checkpoint-name suffix. Why these values:
# - Every projection whose output is normalized next (q_a_proj -> q_a_layernorm, the c_kv part of
#   kv_a_proj -> kv_a_layernorm, indexer wk -> k_norm) sees unit-RMS input: its scale hardly matters.
# - Attention logits: q = q_b_proj(unit-RMS q_lora) has per-element std sqrt(1536)*0.04 = 1.57;
#   k_nope = kv_b_proj(unit-RMS c_kv) std sqrt(512)*0.04 = 0.91; k_rope = kv_a_proj(unit-RMS x)
#   std sqrt(1024)*0.04 = 1.28. q.k over 128 nope + 64 rope dims has std ~22.7, times the softmax
#   scale 192^-0.5 * yarn mscale^2 (1.874) = 0.135: logits with std ~3 across keys (the CPU test
#   measures layer 0 of the written weights: std 3.1, the top key 158x the uniform weight over 1024
#   keys). Far from uniform, so which keys the indexer's top-k keeps changes the output. (With 0.02
#   everywhere the std would be ~0.7; SGLang's dummy weights give ~1e-12.)
# - Residual stream: embeddings N(0, 1); the attention output (v std 0.91 mixed over the kept keys,
#   o_proj over 16384 inputs at 0.02) adds a comparable ~0.5-0.8, so the next token depends on the
#   context, not just the current token (dummy weights give 2-cycles).
# - lm_head 0.08 on the unit-RMS final hidden: vocabulary logits with std ~2.6, so logprobs have spread.
# - Norm weights are 1 + N(0, 0.1) and the indexer's k_norm bias N(0, 0.1), not the modules' default
#   ones/zeros, so a norm the loader silently skipped would change the outputs.
STD = {
    "embed_tokens.weight": 1.0,
    "q_a_proj.weight": 0.02, "q_b_proj.weight": 0.04,
    "kv_a_proj_with_mqa.weight": 0.04, "kv_b_proj.weight": 0.04, "o_proj.weight": 0.02,
    "indexer.wq_b.weight": 0.02, "indexer.wk.weight": 0.02, "indexer.weights_proj.weight": 0.02,
    "indexer.k_norm.bias": 0.1,
    "gate_proj.weight": 0.03, "up_proj.weight": 0.03, "down_proj.weight": 0.03,
    "lm_head.weight": 0.08,
}
NORM_SUFFIXES = ("layernorm.weight", "k_norm.weight", "model.norm.weight")
NORM_JITTER = 0.1


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str = "bfloat16"


def checkpoint_spec(config: dict) -> list[TensorSpec]:
    """Every tensor SGLang 0.5.17's DeepseekV32 loader takes for this config, in file order."""
    h, v = config["hidden_size"], config["vocab_size"]
    heads, qlr, kvlr = config["num_attention_heads"], config["q_lora_rank"], config["kv_lora_rank"]
    nope, rope, vdim = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
    ih, idim, inter = config["index_n_heads"], config["index_head_dim"], config["intermediate_size"]
    if config["first_k_dense_replace"] < config["num_hidden_layers"]:
        raise ValueError("only dense layers are written: first_k_dense_replace must be >= num_hidden_layers")
    specs = [TensorSpec("model.embed_tokens.weight", (v, h))]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        specs += [
            TensorSpec(f"{p}.input_layernorm.weight", (h,)),
            TensorSpec(f"{a}.q_a_proj.weight", (qlr, h)),
            TensorSpec(f"{a}.q_a_layernorm.weight", (qlr,)),
            TensorSpec(f"{a}.q_b_proj.weight", (heads * (nope + rope), qlr)),
            TensorSpec(f"{a}.kv_a_proj_with_mqa.weight", (kvlr + rope, h)),
            TensorSpec(f"{a}.kv_a_layernorm.weight", (kvlr,)),
            TensorSpec(f"{a}.kv_b_proj.weight", (heads * (nope + vdim), kvlr)),
            TensorSpec(f"{a}.o_proj.weight", (h, heads * vdim)),
            TensorSpec(f"{a}.indexer.wq_b.weight", (ih * idim, qlr)),
            TensorSpec(f"{a}.indexer.wk.weight", (idim, h)),
            TensorSpec(f"{a}.indexer.k_norm.weight", (idim,)),
            TensorSpec(f"{a}.indexer.k_norm.bias", (idim,)),
            TensorSpec(f"{a}.indexer.weights_proj.weight", (ih, h)),
            TensorSpec(f"{p}.post_attention_layernorm.weight", (h,)),
            TensorSpec(f"{p}.mlp.gate_proj.weight", (inter, h)),
            TensorSpec(f"{p}.mlp.up_proj.weight", (inter, h)),
            TensorSpec(f"{p}.mlp.down_proj.weight", (h, inter)),
        ]
    specs += [TensorSpec("model.norm.weight", (h,)), TensorSpec("lm_head.weight", (v, h))]
    return specs


def init_of(name: str) -> tuple[float, float]:
    """(mean, std) of the tensor called `name`."""
    if name.endswith(NORM_SUFFIXES):
        return 1.0, NORM_JITTER
    for suffix, std in STD.items():
        if name.endswith(suffix):
            return 0.0, std
    raise KeyError(f"no initialization for {name}")


def make_tensor(spec: TensorSpec, seed: int, init: Callable[[str], tuple[float, float]] | None = None):
    """The tensor for `spec`: drawn in fp32 on the CPU from a generator seeded by (seed, name), so it is
    the same on every machine and does not depend on which other tensors exist. `init` gives (mean, std)
    per name (default: this model's init_of; tiny_v4_model.py passes its own)."""
    import torch

    mean, std = (init or init_of)(spec.name)
    g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(spec.name.encode())) % 2**63)
    t = torch.randn(spec.shape, generator=g, dtype=torch.float32).mul_(std).add_(mean)
    return t.to(getattr(torch, spec.dtype))


def dsa_config(vocab_size: int, bos: int, eos: int, layers: int | None = None) -> dict:
    """BASE_CONFIG with the tokenizer's vocabulary; `layers` deepens it (every layer dense, as the base's two)."""
    depth = {} if layers is None else {"num_hidden_layers": layers, "first_k_dense_replace": layers}
    return {**BASE_CONFIG, **depth, "vocab_size": vocab_size, "bos_token_id": bos, "eos_token_id": eos}


def make_tiny_dsa_model(directory: Path, *, seed: int = 0, layers: int | None = None) -> Path:
    """config.json, the byte-level tokenizer of tests/gpu/tiny_model.py and model.safetensors in `directory`;
    `layers` for the deeper model of the decode-step measurement (steps.py)."""
    return write_model_directory(directory, lambda v, b, e: dsa_config(v, b, e, layers), checkpoint_spec,
                                 seed=seed, init=init_of, context_length=CONTEXT_LENGTH)


def write_model_directory(directory: Path, make_config: Callable[[int, int, int], dict],
                          spec_of: Callable[[dict], list[TensorSpec]], *, seed: int,
                          init: Callable[[str], tuple[float, float]], context_length: int) -> Path:
    """The tokenizer files of tests/gpu/tiny_model.py, `make_config(vocab, bos, eos)` as config.json and
    every tensor of `spec_of(config)` as model.safetensors (one tensor in memory at a time)."""
    make_tiny_model(directory, context_length=context_length)  # tokenizer files (and a Llama config, replaced)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    config = make_config(tokenizer.get_vocab_size(), tokenizer.token_to_id("<s>"), tokenizer.token_to_id("</s>"))
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    specs = spec_of(config)
    safetensors_file.write(directory / "model.safetensors",
                           [(s.name, s.dtype, s.shape, lambda s=s: make_tensor(s, seed, init)) for s in specs],
                           metadata={"format": "pt", "seed": str(seed)})
    return directory


def check_on_device(directory: Path) -> list[str]:
    """Read the directory back with the real libraries of the device's SGLang: the config through
    SGLang's config loader (its deepseek_v32 alias of transformers' DeepseekV3Config) and the weights
    with the safetensors package. Returns the problems (empty: all good)."""
    return check_directory(directory, checkpoint_spec, "DeepseekV32ForCausalLM",
                           ("index_topk", "index_n_heads", "index_head_dim", "kv_lora_rank", "qk_rope_head_dim",
                            "q_lora_rank", "num_attention_heads", "vocab_size", "first_k_dense_replace"))


def check_directory(directory: Path, spec_of: Callable[[dict], list[TensorSpec]], architecture: str,
                    keys: tuple[str, ...]) -> list[str]:
    """The problems found reading `directory` back with SGLang's config loader (`keys` must read back as
    config.json has them) and the safetensors package (names, shapes and dtypes as `spec_of` says)."""
    problems = []
    from safetensors import safe_open
    from sglang.srt.utils.hf_transformers_utils import get_config

    config = get_config(str(directory), trust_remote_code=True)
    expected = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    for key in keys:
        if getattr(config, key, None) != expected[key]:
            problems.append(f"config {key}: SGLang read {getattr(config, key, None)!r}, file has {expected[key]!r}")
    if list(getattr(config, "architectures", None) or []) != [architecture]:
        problems.append(f"config architectures: {config.architectures!r}")
    specs = {s.name: s for s in spec_of(expected)}
    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        if names != set(specs):
            problems.append(f"tensor names: missing {sorted(set(specs) - names)}, extra {sorted(names - set(specs))}")
        for name in sorted(names & set(specs)):
            t = f.get_tensor(name)
            if tuple(t.shape) != specs[name].shape or str(t.dtype) != f"torch.{specs[name].dtype}":
                problems.append(f"{name}: {t.dtype} {tuple(t.shape)}, expected {specs[name].dtype} {specs[name].shape}")
    return problems


def run_cli(doc: str, make: Callable[..., Path], check: Callable[[Path], list[str]],
            argv: list[str] | None = None) -> int:
    """The command line of a tiny-model writer: DIR [--seed N] [--layers N] [--check]."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=None,
                        help="this many layers, not the base config's (the decode-step measurement's deeper model)")
    parser.add_argument("--check", action="store_true",
                        help="read it back with SGLang's config loader and the safetensors package (device)")
    args = parser.parse_args(argv)
    if args.layers is not None and args.layers < 1:
        parser.error(f"--layers: need at least 1 layer, got {args.layers}")
    started = time.monotonic()
    make(args.directory, seed=args.seed, **({} if args.layers is None else {"layers": args.layers}))
    size = (args.directory / "model.safetensors").stat().st_size
    print(f"wrote {args.directory} ({size / 2**20:.0f} MiB of weights, seed {args.seed}) "
          f"in {time.monotonic() - started:.1f} s")
    if args.check:
        problems = check(args.directory)
        for problem in problems:
            print(f"check: {problem}")
        print("check: config and weights read back as written" if not problems else "check: FAILED")
        return 1 if problems else 0
    return 0


def main() -> int:
    return run_cli(__doc__, make_tiny_dsa_model, check_on_device)


if __name__ == "__main__":
    raise SystemExit(main())
