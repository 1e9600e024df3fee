"""What the DSA GPU tier (tests/gpu/dsa) feeds SGLang, checked on the CPU: the wheel set's pins and
trim, the tiny DeepSeek-V3.2 model (config, checkpoint names and shapes against SGLang 0.5.17's
loader, the file format, the weights' spread), the driver's command line against the real SGLang
parser, and the comparator and timing arithmetic on made-up runs."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import re
import struct
import zipfile

import pytest

from tests.conftest import require_or_skip
from tests.gpu import wheelhouse
from tests.gpu.dsa import client, compare, diff, safetensors_file, server
from tests.gpu.dsa.tiny_dsa_model import (
    BASE_CONFIG,
    TensorSpec,
    checkpoint_spec,
    dsa_config,
    make_tensor,
    make_tiny_dsa_model,
)

# --- the wheel set -----------------------------------------------------------------------------------


def test_dsa_pins_add_deepgemm_and_leave_out_pd_only_wheels():
    base = wheelhouse.PINS.read_text(encoding="utf-8")
    pins = wheelhouse.dsa_pins(base).splitlines()
    names = {wheelhouse._pin_name(p) for p in pins}
    assert "sgl_deep_gemm==0.1.5.post1" in pins
    assert names.isdisjoint({"nixl", "nixl_cu13", "smg"})
    # Everything else of the PD tier's set stays, at the same pins; its comments are no pins.
    kept = [p for p in base.splitlines()
            if p.strip() and not p.startswith("#") and wheelhouse._pin_name(p) not in wheelhouse.DSA_LEFT_OUT]
    assert pins == [*kept, "sgl_deep_gemm==0.1.5.post1"]
    assert "sglang==0.5.17" in pins and "sglang_kernel==0.4.5" in pins
    assert any(line.startswith("#") for line in base.splitlines()), "wheelhouse.txt has no comment to leave out"
    assert not any("#" in line for line in pins)


def _fake_wheel(path):
    with zipfile.ZipFile(path, "w") as z:
        for name in ("sgl_kernel/flashmla_ops.abi3.so", "sgl_kernel/flash_ops.abi3.so", "sgl_kernel/common_ops.so",
                     "sgl_kernel/sm100/x.so"):
            z.writestr(name, name.encode() * 10)
        z.writestr("sglang_kernel-0.4.5.dist-info/RECORD", "stale\n")
    return path


@pytest.mark.parametrize("dsa", [False, True])
def test_trim_keeps_flashmla_only_for_the_dsa_set(tmp_path, dsa):
    wheel = _fake_wheel(tmp_path / "sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl")
    wheelhouse.trim(wheel, wheelhouse.trim_patterns("sglang_kernel", dsa))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        record = z.read("sglang_kernel-0.4.5.dist-info/RECORD").decode().splitlines()
    assert ("sgl_kernel/flashmla_ops.abi3.so" in names) is dsa
    assert "sgl_kernel/flash_ops.abi3.so" not in names and "sgl_kernel/sm100/x.so" not in names
    assert {line.split(",")[0] for line in record} == names


def test_default_trim_is_unchanged():
    assert wheelhouse.trim_patterns("sglang_kernel", False) == wheelhouse.TRIM["sglang_kernel"]
    assert "sgl_kernel/flashmla_ops.*.so" in wheelhouse.TRIM["sglang_kernel"]
    assert wheelhouse.trim_patterns("xgrammar", True) == wheelhouse.TRIM["xgrammar"]


# --- the model -----------------------------------------------------------------------------------------

CONFIG = dsa_config(468, 0, 1)


def sglang_parameters(c: dict) -> dict[str, tuple[int, ...]]:
    """The parameters SGLang 0.5.17's DeepseekV32ForCausalLM has for this config (dense layers, q_lora
    set, NeoX indexer): models/deepseek_v2.py DeepseekV2AttentionMLA.__init__ (fused_qkv_a_proj_with_mqa,
    q_a_layernorm, q_b_proj, kv_b_proj, o_proj, kv_a_layernorm), DeepseekV2MLP (gate_up_proj,
    down_proj), the decoder layer's two RMSNorms, DeepseekV2Model (embed_tokens, norm), the LM head;
    layers/attention/dsa/dsa_indexer.py Indexer.__init__ (wq_b, wk, weights_proj, k_norm LayerNorm)."""
    h, v, heads = c["hidden_size"], c["vocab_size"], c["num_attention_heads"]
    qlr, kvlr, rope = c["q_lora_rank"], c["kv_lora_rank"], c["qk_rope_head_dim"]
    nope, vd, ih, idim, inter = (c["qk_nope_head_dim"], c["v_head_dim"], c["index_n_heads"], c["index_head_dim"],
                                 c["intermediate_size"])
    params = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for i in range(c["num_hidden_layers"]):
        p, a = f"model.layers.{i}", f"model.layers.{i}.self_attn"
        params.update({
            f"{p}.input_layernorm.weight": (h,), f"{p}.post_attention_layernorm.weight": (h,),
            f"{a}.fused_qkv_a_proj_with_mqa.weight": (qlr + kvlr + rope, h),
            f"{a}.q_a_layernorm.weight": (qlr,), f"{a}.q_b_proj.weight": (heads * (nope + rope), qlr),
            f"{a}.kv_a_layernorm.weight": (kvlr,), f"{a}.kv_b_proj.weight": (heads * (nope + vd), kvlr),
            f"{a}.o_proj.weight": (h, heads * vd),
            f"{a}.indexer.wq_b.weight": (ih * idim, qlr), f"{a}.indexer.wk.weight": (idim, h),
            f"{a}.indexer.weights_proj.weight": (ih, h),
            f"{a}.indexer.k_norm.weight": (idim,), f"{a}.indexer.k_norm.bias": (idim,),
            f"{p}.mlp.gate_up_proj.weight": (2 * inter, h), f"{p}.mlp.down_proj.weight": (h, inter),
        })
    return params


def load_like_sglang(specs: list[TensorSpec]) -> dict[str, tuple[int, ...]]:
    """Where SGLang 0.5.17's do_load_weights puts each checkpoint tensor (deepseek_weight_loader.py):
    gate_proj/up_proj are shards 0/1 of gate_up_proj; q_a_proj and kv_a_proj_with_mqa are concatenated
    along dim 0 into fused_qkv_a_proj_with_mqa once both are seen; every other name loads as it is."""
    loaded: dict[str, list[tuple[int, ...]]] = {}
    for s in specs:
        name = s.name
        for ckpt, param in (("gate_proj", "gate_up_proj"), ("up_proj", "gate_up_proj"),
                            ("q_a_proj", "fused_qkv_a_proj_with_mqa"),
                            ("kv_a_proj_with_mqa", "fused_qkv_a_proj_with_mqa")):
            if f".{ckpt}." in name:
                name = name.replace(ckpt, param)
                break
        loaded.setdefault(name, []).append(s.shape)
    out = {}
    for name, shapes in loaded.items():
        fused = "gate_up_proj" in name or "fused_qkv_a_proj_with_mqa" in name
        assert len(shapes) == (2 if fused else 1), f"{name}: {len(shapes)} shards"
        assert len({sh[1:] for sh in shapes}) == 1, f"{name}: shards disagree beyond dim 0: {shapes}"
        out[name] = (sum(sh[0] for sh in shapes), *shapes[0][1:])
    return out


def test_checkpoint_fills_exactly_the_parameters_sglang_loads():
    specs = checkpoint_spec(CONFIG)
    assert len({s.name for s in specs}) == len(specs)
    assert load_like_sglang(specs) == sglang_parameters(CONFIG)
    assert all(s.dtype == "bfloat16" for s in specs)


def test_config_is_the_probes_with_what_sglang_asserts():
    c = CONFIG
    assert {k: v for k, v in c.items() if k not in ("vocab_size", "bos_token_id", "eos_token_id")} == BASE_CONFIG
    # is_deepseek_dsa: the architecture and a non-null index_topk; deepseek_v32 is SGLang's alias model_type.
    assert c["architectures"] == ["DeepseekV32ForCausalLM"] and c["model_type"] == "deepseek_v32"
    assert c["index_topk"] == 2048
    # Hard asserts of DSATokenToKVPool and the FP8 KV quantizer (656 B per token).
    assert c["index_head_dim"] == 128 and c["kv_lora_rank"] == 512 and c["qk_rope_head_dim"] == 64
    assert c["kv_lora_rank"] + 4 * 4 + 2 * c["qk_rope_head_dim"] == 656
    for key in ("index_head_dim", "index_n_heads"):
        assert c[key] & (c[key] - 1) == 0, f"{key} must be a power of two"
    assert c["first_k_dense_replace"] == c["num_hidden_layers"]  # no MoE layer
    assert "quantization_config" not in c and c["torch_dtype"] == "bfloat16"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    require_or_skip(importlib.util.find_spec("tokenizers") is not None
                    and importlib.util.find_spec("torch") is not None,
                    "the tokenizers and torch packages are not installed", "PDSERVE_REQUIRE_PARSERS")
    return make_tiny_dsa_model(tmp_path_factory.mktemp("dsa") / "tiny-dsa", seed=0)


def test_written_directory_has_the_config_tokenizer_and_every_tensor(model_dir):
    from tokenizers import Tokenizer

    config = json.loads((model_dir / "config.json").read_text())
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert config["vocab_size"] == tokenizer.get_vocab_size() == 468
    assert (config["bos_token_id"], config["eos_token_id"]) == (tokenizer.token_to_id("<s>"),
                                                                 tokenizer.token_to_id("</s>"))
    path = model_dir / "model.safetensors"
    header = safetensors_file.read_header(path)
    assert header.pop("__metadata__") == {"format": "pt", "seed": "0"}
    specs = checkpoint_spec(config)
    assert list(header) == [s.name for s in specs]
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
    assert (8 + length) % safetensors_file.ALIGN == 0
    offset = 0
    for s in specs:
        entry = header[s.name]
        assert entry["dtype"] == "BF16" and tuple(entry["shape"]) == s.shape
        assert entry["data_offsets"] == [offset, offset + 2 * math.prod(s.shape)]
        offset = entry["data_offsets"][1]
    assert path.stat().st_size == 8 + length + offset


def test_file_bytes_are_the_seeded_tensors(model_dir):
    import torch

    path = model_dir / "model.safetensors"
    header = safetensors_file.read_header(path)
    spec = TensorSpec("model.layers.1.self_attn.indexer.k_norm.bias", (128,))
    begin, end = header[spec.name]["data_offsets"]
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        f.seek(8 + length + begin)
        stored = torch.frombuffer(bytearray(f.read(end - begin)), dtype=torch.bfloat16)
    assert torch.equal(stored, make_tensor(spec, 0))
    assert torch.equal(make_tensor(spec, 0), make_tensor(spec, 0))
    assert not torch.equal(make_tensor(spec, 0), make_tensor(spec, 1))


def test_real_safetensors_and_transformers_read_the_directory(model_dir, hf_config_alias):
    """Where the Hugging Face libraries are importable (not in the CI venv: its tokenizers and
    huggingface_hub are newer than transformers 5.12.1 accepts), they read what the device's SGLang
    will: the config through SGLang's alias of DeepseekV3Config, every tensor through safetensors."""
    from safetensors import safe_open

    config = hf_config_alias("deepseek_v32").from_pretrained(str(model_dir))
    assert (config.index_topk, config.index_n_heads, config.index_head_dim) == (2048, 64, 128)
    assert (config.q_lora_rank, config.kv_lora_rank, config.first_k_dense_replace) == (1536, 512, 2)
    specs = {s.name: s for s in checkpoint_spec(json.loads((model_dir / "config.json").read_text()))}
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        assert set(f.keys()) == set(specs)
        t = f.get_tensor("model.layers.1.self_attn.indexer.k_norm.bias")
        assert t.equal(make_tensor(specs["model.layers.1.self_attn.indexer.k_norm.bias"], 0))


def _rms_norm(x, w, eps=1e-6):
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * w


def _attention_logit_spread(weights: dict, c: dict, tokens: int = 1024) -> tuple[float, float]:
    """Layer 0's MLA logits (nope + un-rotated rope parts, softmax scale with the yarn mscale) of the
    last token over `tokens` keys: (std across keys averaged over heads, largest softmax weight x keys)."""
    import torch

    heads, nope, rope, kvlr = (c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                               c["kv_lora_rank"])
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(5, c["vocab_size"], (tokens,), generator=g)
    a = "model.layers.0.self_attn"
    x = _rms_norm(weights["model.embed_tokens.weight"][ids], weights["model.layers.0.input_layernorm.weight"])
    q = _rms_norm(x[-1:] @ weights[f"{a}.q_a_proj.weight"].T, weights[f"{a}.q_a_layernorm.weight"])
    q = (q @ weights[f"{a}.q_b_proj.weight"].T).view(heads, nope + rope)
    kv_a = x @ weights[f"{a}.kv_a_proj_with_mqa.weight"].T
    c_kv = _rms_norm(kv_a[:, :kvlr], weights[f"{a}.kv_a_layernorm.weight"])
    k_nope = (c_kv @ weights[f"{a}.kv_b_proj.weight"].T).view(tokens, heads, -1)[..., :nope]
    k_rope = kv_a[:, kvlr:]
    mscale = 0.1 * math.log(c["rope_scaling"]["factor"]) + 1.0
    scale = (nope + rope) ** -0.5 * mscale * mscale
    logits = scale * (torch.einsum("hd,thd->ht", q[:, :nope], k_nope) + q[:, nope:] @ k_rope.T)
    peak = torch.softmax(logits, dim=-1).max(dim=-1).values.mean().item() * tokens
    return logits.std(dim=-1).mean().item(), peak


@pytest.fixture(scope="module")
def fp32_weights():
    """The seed-0 weights, as the model file holds them (bf16), widened to fp32 for the CPU references."""
    require_or_skip(importlib.util.find_spec("torch") is not None, "torch is not installed", "PDSERVE_REQUIRE_PARSERS")
    return {s.name: make_tensor(s, 0).float() for s in checkpoint_spec(CONFIG)}


def test_weights_make_attention_far_from_uniform(fp32_weights):
    import torch

    specs = {s.name: s for s in checkpoint_spec(CONFIG) if ".layers.0." in s.name or "embed" in s.name}
    weights = {name: fp32_weights[name] for name in specs}
    std, peak = _attention_logit_spread(weights, CONFIG)
    # SGLang's dummy weights, uniform(-1e-3, 1e-3), for contrast.
    g = torch.Generator().manual_seed(1234)
    dummy = {name: (torch.rand(s.shape, generator=g) * 2e-3 - 1e-3) for name, s in specs.items()}
    dummy_std, dummy_peak = _attention_logit_spread(dummy, CONFIG)
    print(f"\nlayer-0 attention logits over 1024 keys: std {std:.2f}, top weight {peak:.0f}x uniform "
          f"(dummy weights: std {dummy_std:.2g}, top weight {dummy_peak:.2f}x uniform)")
    assert std > 1.5 and peak > 20  # most weight on few keys: which keys the top-k keeps matters
    assert dummy_std < 0.01 and dummy_peak < 1.1


def _reference_next_token_logprobs(weights: dict, c: dict, ids: list[int]):
    """An fp32 dense reference of the whole model (NeoX rope on the rope dims, no top-k, no FP8): the
    log-softmax over the vocabulary after the last of `ids`."""
    import torch

    heads, nope, rope, vd, kvlr = (c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                                   c["v_head_dim"], c["kv_lora_rank"])
    t = len(ids)
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, rope, 2).float() / rope))
    freqs = torch.arange(t)[:, None].float() * inv[None]
    cos, sin = freqs.cos(), freqs.sin()

    def rotate(x):
        x1, x2 = x[..., : rope // 2], x[..., rope // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    mscale = 0.1 * math.log(c["rope_scaling"]["factor"]) + 1.0
    scale = (nope + rope) ** -0.5 * mscale * mscale
    causal = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
    h = weights["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(c["num_hidden_layers"]):
        p, a = f"model.layers.{i}", f"model.layers.{i}.self_attn"
        x = _rms_norm(h, weights[f"{p}.input_layernorm.weight"])
        q = _rms_norm(x @ weights[f"{a}.q_a_proj.weight"].T, weights[f"{a}.q_a_layernorm.weight"])
        q = (q @ weights[f"{a}.q_b_proj.weight"].T).view(t, heads, nope + rope).transpose(0, 1)
        kv_a = x @ weights[f"{a}.kv_a_proj_with_mqa.weight"].T
        c_kv = _rms_norm(kv_a[:, :kvlr], weights[f"{a}.kv_a_layernorm.weight"])
        kv = (c_kv @ weights[f"{a}.kv_b_proj.weight"].T).view(t, heads, nope + vd).transpose(0, 1)
        logits = scale * (q[..., :nope] @ kv[..., :nope].transpose(1, 2)
                          + rotate(q[..., nope:]) @ rotate(kv_a[:, kvlr:]).T)
        o = torch.softmax(logits.masked_fill(causal, float("-inf")), -1) @ kv[..., nope:]
        h = h + o.transpose(0, 1).reshape(t, heads * vd) @ weights[f"{a}.o_proj.weight"].T
        x = _rms_norm(h, weights[f"{p}.post_attention_layernorm.weight"])
        gate, up = x @ weights[f"{p}.mlp.gate_proj.weight"].T, x @ weights[f"{p}.mlp.up_proj.weight"].T
        h = h + (torch.nn.functional.silu(gate) * up) @ weights[f"{p}.mlp.down_proj.weight"].T
    return torch.log_softmax(_rms_norm(h[-1], weights["model.norm.weight"]) @ weights["lm_head.weight"].T, -1)


def test_next_token_depends_on_the_context(fp32_weights):
    import random

    import torch

    weights = fp32_weights
    rng = random.Random(4)
    last = 123
    a = [rng.randrange(5, 468) for _ in range(63)] + [last]
    b = [rng.randrange(5, 468) for _ in range(63)] + [last]
    la, lb = _reference_next_token_logprobs(weights, CONFIG, a), _reference_next_token_logprobs(weights, CONFIG, b)
    tv = 0.5 * (la.exp() - lb.exp()).abs().sum().item()
    top = la.topk(5).values.tolist()
    print(f"\nsame last token, different contexts: total variation {tv:.2f} between next-token distributions; "
          f"top-5 logprobs {[round(x, 2) for x in top]}")
    # The context moves the next-token distribution a lot (total variation is at most 1).
    assert tv > 0.2
    assert top[0] - top[-1] > 0.5 and top[0] > -4.0  # a peaked distribution, not uniform (log 1/468 = -6.1)
    assert torch.isfinite(la).all()


# --- the driver ----------------------------------------------------------------------------------------


def test_driver_defaults_run_both_kernels_with_the_probes_fp8_flags(tmp_path):
    args = compare.parse_args(["--model", str(tmp_path), "--out", str(tmp_path / "o")])
    assert args.phase == "compare" and compare.kernel_choices(args) == ["sglang", "pdserve"]
    assert all(n > 2048 for n in args.prompt_lens) and len(args.prompt_lens) >= 4
    servers = compare.make_servers(args)
    for kernels, srv in servers.items():
        assert srv.argv[1:3] == ["-m", "sglang.launch_server"]
        joined = " ".join(srv.argv)
        for flag in ("--attention-backend dsa", "--kv-cache-dtype fp8_e4m3", "--dsa-prefill-backend flashmla_kv",
                     "--dsa-decode-backend flashmla_kv", "--page-size 64", "--sampling-backend pytorch",
                     "--cuda-graph-backend-prefill disabled", "--disable-radix-cache", "--load-format auto"):
            assert flag in joined
        assert srv.env["PDSERVE_DSA_KERNELS"] == kernels
        assert srv.env["SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD"] == "0"
        assert "PDSERVE_DSA_RECORD_DIR" not in srv.env
        assert srv.log == tmp_path / "o" / f"server-{kernels}.log"


def test_driver_options(tmp_path, capsys):
    base = ["--model", str(tmp_path), "--out", str(tmp_path)]
    args = compare.parse_args([*base, "--kernels", "pdserve", "--record-dir", str(tmp_path / "rec"),
                               "--graph-bs", "0", "--phase", "bench", "--bench-batches", "1,4"])
    (srv,) = compare.make_servers(args).values()
    assert srv.env["PDSERVE_DSA_RECORD_DIR"] == str(tmp_path / "rec" / "pdserve")
    assert " --cuda-graph-backend-decode disabled" in " ".join(srv.argv) and "--cuda-graph-bs-decode" not in srv.argv
    assert args.bench_batches == [1, 4]
    for bad in (["--prompt-lens", "2048"], ["--prompt-lens", "16370"], ["--bench-batches", "x"],
                ["--kernels", "triton"], ["--phase", "everything"]):
        with pytest.raises(SystemExit):
            compare.parse_args(base + bad)
    assert "--prompt-lens" in capsys.readouterr().err
    with pytest.raises(ValueError, match="kernels must be one of"):
        server.server_env("flashmla", None)


def test_dry_run_prints_both_commands(tmp_path, capsys):
    assert compare.main(["--model", str(tmp_path), "--out", str(tmp_path / "o"), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["sglang", "pdserve"]
    assert "PDSERVE_DSA_KERNELS=pdserve" in out[1] and not (tmp_path / "o").exists()


def test_server_command_accepted_by_the_real_sglang_parser(tmp_path):
    require_or_skip(importlib.util.find_spec("sglang") is not None, "sglang is not installed in this Python",
                    "PDSERVE_REQUIRE_PARSERS")
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = compare.parse_args(["--model", str(tmp_path), "--out", str(tmp_path)])
    srv = compare.make_servers(args)["pdserve"]
    parsed = parser.parse_args(srv.argv[3:])
    assert (parsed.attention_backend, parsed.kv_cache_dtype) == ("dsa", "fp8_e4m3")
    assert (parsed.dsa_prefill_backend, parsed.dsa_decode_backend) == ("flashmla_kv", "flashmla_kv")
    assert parsed.cuda_graph_bs_decode == list(server.DEFAULT_GRAPH_BS)
    assert (parsed.page_size, parsed.load_format, parsed.disable_radix_cache) == (64, "auto", True)
    assert parsed.context_length == server.CONTEXT_LENGTH and parsed.max_running_requests >= 16
    eager = compare.make_servers(compare.parse_args(["--model", str(tmp_path), "--out", str(tmp_path),
                                                     "--graph-bs", "0"]))["sglang"]
    assert parser.parse_args(eager.argv[3:]).cuda_graph_backend_decode == "disabled"


# --- client arithmetic and the comparator --------------------------------------------------------------


def test_prompts_are_seeded_and_avoid_special_tokens():
    a = client.prompts(0, [2100, 3000], 468)
    assert [len(p) for p in a] == [2100, 3000]
    assert a == client.prompts(0, [2100, 3000], 468) != client.prompts(1, [2100, 3000], 468)
    assert min(min(p) for p in a) >= client.FIRST_ID and max(max(p) for p in a) < 468


def test_parse_result_reads_sglangs_logprob_triples():
    out = {"output_ids": [7, 9], "meta_info": {
        "output_token_logprobs": [[-0.5, 7, None], [-1.25, 9, None]],
        "output_top_logprobs": [[[-0.5, 7, None], [-1.0, 8, None]], [[-1.25, 9, None], [-1.5, 7, None]]],
        "prompt_tokens": 2100, "completion_tokens": 2, "e2e_latency": 0.1}}
    r = client.parse_result(out)
    assert r["output_ids"] == [7, 9] and r["logprobs"] == [-0.5, -1.25]
    assert r["top_logprobs"] == [[[7, -0.5], [8, -1.0]], [[9, -1.25], [7, -1.5]]]
    out["output_ids"] = [7, 8]
    with pytest.raises(ValueError, match="disagree"):
        client.parse_result(out)


def test_decode_figures_count_only_the_common_decode_window():
    # Request A starts decoding at t=1 (one token per 10 ms); B is prefilled later, first token at t=1.5.
    a = [(1.0 + 0.01 * i, 1 + i) for i in range(200)]          # last token at 2.99
    b = [(1.5 + 0.01 * i, 1 + i) for i in range(100)]          # last token at 2.49
    fig = client.decode_figures([a, b], sent_at=0.5)
    assert fig.window_s == pytest.approx(0.99)
    assert fig.ms_per_step == pytest.approx(10.0, rel=0.02)
    assert fig.tokens_per_s == pytest.approx(200.0, rel=0.02)
    assert fig.ttft_s == pytest.approx(1.0)
    with pytest.raises(ValueError, match="never all decoded"):
        client.decode_figures([[(0.0, 1), (1.0, 2)], [(2.0, 1), (3.0, 2)]], 0.0)


def _req(ids, lps, top=None):
    return {"output_ids": ids, "logprobs": lps,
            "top_logprobs": top or [[[t, lp]] for t, lp in zip(ids, lps, strict=False)]}


def _record(kernels, reqs):
    return {"kernels": kernels, "compare": {"seed": 0, "prompt_lens": [2100] * len(reqs), "max_new_tokens": 3,
                                            "sets": {"sequential": reqs}}}


def test_comparator_finds_divergence_and_logprob_differences():
    assert diff.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert diff.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert diff.first_divergence([1, 2], [1, 2, 3]) == 2
    ref = _record("sglang", [_req([1, 2, 3], [-0.1, -0.2, -0.3]), _req([4, 5, 6], [-1.0, -1.0, -1.0])])
    other = _record("pdserve", [_req([1, 2, 3], [-0.1, -0.25, -0.3]),
                                _req([4, 7, 6], [-1.5, -2.0, -0.1],
                                     top=[[[4, -1.5]], [[7, -2.0], [5, -2.1]], [[6, -0.1]]])])
    result = diff.compare_runs(ref, other)
    rows = result["rows"]
    assert result["tokens_equal"] == 1 and result["requests"] == 2
    assert rows[0]["tokens_equal"] and rows[0]["max_abs_logprob_diff"] == pytest.approx(0.05)
    # Diverges at 1: chosen logprobs compared at 0 only; top logprobs up to and including 1 (token 5 in both).
    assert rows[1]["first_divergence"] == 1 and rows[1]["max_abs_logprob_diff"] == pytest.approx(0.5)
    assert rows[1]["max_abs_top_logprob_diff"] == pytest.approx(1.1)
    assert result["max_abs_logprob_diff"] == pytest.approx(0.5)
    table = re.sub(r" +", " ", diff.compare_table(result))
    assert "| sequential | 1 | 2100 | 3 | 3 | no | 1 | 0.5 | 1.1 |" in table
    assert "1/2 requests with equal tokens" in table
    assert "NaN" not in table
    other["compare"]["sets"]["sequential"][0]["logprobs"][1] = float("nan")
    assert "1 logprobs are NaN or infinite" in diff.compare_table(diff.compare_runs(ref, other))


def test_comparator_refuses_runs_of_different_prompts():
    ref = _record("sglang", [_req([1], [-0.1])])
    other = _record("pdserve", [_req([1], [-0.1])])
    other["compare"]["seed"] = 1
    with pytest.raises(ValueError, match="different seed"):
        diff.compare_runs(ref, other)


def test_comparator_command_line_exit_codes(tmp_path, capsys):
    ref = _record("sglang", [_req([1, 2], [-0.1, -0.2])])
    other = _record("pdserve", [_req([1, 3], [-0.3, -0.2])])
    (tmp_path / "compare-sglang.json").write_text(json.dumps(ref))
    (tmp_path / "compare-pdserve.json").write_text(json.dumps(other))
    bench = {"rows": [{"batch": 4, "context": 4096, "tokens_per_s": 1000.0, "ms_per_step": 4.0, "ttft_s": 0.2,
                       "server_log": {"lines": 3, "gen_throughput": [990.0, 1010.0, 1005.0],
                                      "graph": ["cuda graph: True"]}}],
             "recording": False}
    (tmp_path / "bench-pdserve.json").write_text(json.dumps({"kernels": "pdserve", "bench": bench}))
    slower = {"rows": [{"batch": 4, "context": 4096, "tokens_per_s": 500.0, "ms_per_step": 8.0, "ttft_s": 0.2},
                       {"batch": 16, "context": 4096, "error": "no token arrived inside the common decode window"}],
              "recording": True}
    (tmp_path / "bench-sglang.json").write_text(json.dumps({"kernels": "sglang", "bench": slower}))
    assert diff.main([str(tmp_path)]) == 0
    out = re.sub(r" +", " ", capsys.readouterr().out)
    assert "0/1 requests with equal tokens" in out
    assert "| pdserve | 4 | 4096 | 1000.0 | 4.000 | 0.200 | 1005.0 | cuda graph: True |" in out
    assert "| sglang (recording) | 16 | 4096 | - | - | no token arrived" in out
    assert "| 4 | 4096 | 8.000 | 4.000 | 2.00x |" in out
    assert diff.main([str(tmp_path), "--require-equal-tokens"]) == 1
    assert diff.main([str(tmp_path / "compare-sglang.json"), str(tmp_path / "compare-pdserve.json"),
                      "--max-logprob-diff", "0.1"]) == 1
    assert diff.main([str(tmp_path / "compare-sglang.json"), str(tmp_path / "compare-pdserve.json"),
                      "--max-logprob-diff", "0.3"]) == 0


def test_safetensors_header_is_aligned_and_exact():
    head, total = safetensors_file.header_for([("a", "bfloat16", (3,)), ("b", "float32", (2, 2))], {"format": "pt"})
    (length,) = struct.unpack("<Q", head[:8])
    assert len(head) == 8 + length and len(head) % 8 == 0 and total == 6 + 16
    parsed = json.load(io.BytesIO(head[8:]))
    assert parsed["b"] == {"dtype": "F32", "shape": [2, 2], "data_offsets": [6, 22]}


# --- the driver end to end, on a CPU stand-in of launch_server ----------------------------------------


def _standin_env(tmp_path) -> dict[str, str]:
    from tests.gpu.dsa.standin_server import launch_env

    return launch_env(tmp_path)


def test_driver_end_to_end_on_a_standin_server(tmp_path):
    import subprocess
    import sys

    from tests.fixtures.ports import free_ports

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 468}))
    out = tmp_path / "out"
    (port,) = free_ports(1)
    argv = [sys.executable, str(compare.__file__), "--model", str(model), "--out", str(out), "--phase", "all",
            "--port", str(port), "--ready-timeout", "60", "--request-timeout", "30", "--prompt-lens", "2100,2201",
            "--max-new-tokens", "6", "--bench-batches", "1,3", "--bench-contexts", "2100",
            "--bench-new-tokens", "150", "--record-dir", str(out / "record")]
    done = subprocess.run(argv, env=_standin_env(tmp_path), capture_output=True, text=True, timeout=240)
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 0
    for kernels in ("sglang", "pdserve"):
        record = json.loads((out / f"compare-{kernels}.json").read_text())
        assert record["ready_after_s"] < 60 and record["env"]["PDSERVE_DSA_KERNELS"] == kernels
        assert "standin = os:getcwd" in record["plugin_entry_points"]
        assert any("pdserve-kernels status" in line for line in record["plugin_lines"])
        assert [st["requested"] for st in record["plugin"]["status"]] == [kernels]
        ran = ["indexer_topk", "sparse_mla_decode"] if kernels == "pdserve" else []
        assert [r["op"] for r in record["plugin"]["ran"]] == ran
        assert record["env"]["PDSERVE_DSA_RECORD_DIR"] == str(out / "record" / kernels)
        summary = json.loads((out / f"records-summary-{kernels}.json").read_text())["rows"]
        assert [(r["op"], r["layer"], r["calls"]) for r in summary] == [("indexer_topk", 0, 1),
                                                                          ("sparse_mla_decode", 0, 1)]
        assert summary[0]["rows_identical_sets"] == 1 and summary[1]["rel_l2_max"] == 0.004
        assert [len(r["output_ids"]) for r in record["compare"]["sets"]["sequential"]] == [6, 6]
        assert len(record["compare"]["sets"]["batch"]) == 2
        assert record["compare"]["repeat"] == {"tokens_equal": 2, "requests": 2, "max_abs_logprob_diff": 0.0}
        bench = json.loads((out / f"bench-{kernels}.json").read_text())["bench"]
        assert [(r["batch"], r["context"]) for r in bench["rows"]] == [(1, 2100), (3, 2100)]
        assert all(r["ms_per_step"] > 1.0 and r["tokens_per_s"] > 0 for r in bench["rows"])
        assert (out / f"server-{kernels}.log").read_text().count("ready to roll") == 1
    result = json.loads((out / "diff.json").read_text())
    # The stand-in's pdserve run diverges at token 2 on the odd-length prompt, in both request sets.
    assert result["requests"] == 4 and result["tokens_equal"] == 2
    assert {r["first_divergence"] for r in result["rows"] if not r["tokens_equal"]} == {2}
    assert result["max_abs_logprob_diff"] == pytest.approx(1e-4, rel=0.01)
    assert "| kernels | batch | context | tokens/s | ms per step" in re.sub(r" +", " ", done.stdout)
    assert "| pdserve (recording) |" in re.sub(r" +", " ", done.stdout)  # bench under the shadow comparison
    assert "2/4 requests with equal tokens" in done.stdout
    assert "[pdserve] plugin status lines 1" in done.stdout and "ran pdserve's: indexer_topk" in done.stdout
    assert re.search(r"\| indexer_topk +\| 0 +\| 1 +\| 2 +\| 1/2 +\| 0.9990", done.stdout)


def test_plugin_line_prefixes_are_the_plugins(monkeypatch):
    """compare.py reads the plugin's lines by their prefixes; they must be the ones its writer uses."""
    import importlib.util as iu
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "kernels/python/pdserve_kernels/sglang_plugin/status.py"
    spec = iu.spec_from_file_location("dsa_tier_plugin_status", path)
    status = iu.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, status)  # its dataclasses look their module up
    spec.loader.exec_module(status)  # pure: no torch, no SGLang
    assert compare.PLUGIN_PREFIXES == {"status": status.STATUS_PREFIX, "fallback": status.FALLBACK_PREFIX,
                                       "ran": status.RAN_PREFIX}
    lines = ["INFO x " + status.Status(requested="pdserve", kernels={"indexer_topk": "pdserve"}).line(),
             "WARN " + status.FALLBACK_PREFIX + json.dumps({"op": "sparse_mla_decode", "reason": "r"}),
             status.RAN_PREFIX + "not json"]
    found = compare.plugin_report(lines)
    assert found["status"][0]["kernels"] == {"indexer_topk": "pdserve"}
    assert found["fallback"] == [{"op": "sparse_mla_decode", "reason": "r"}]
    assert found["ran"] == [{"unparsed": "not json"}]


def test_driver_refuses_a_pdserve_run_without_the_plugin(tmp_path, monkeypatch):
    monkeypatch.setattr(compare, "plugin_entry_points", list)
    args = compare.parse_args(["--model", str(tmp_path), "--out", str(tmp_path / "o"), "--kernels", "pdserve"])
    srv = compare.make_servers(args)["pdserve"]
    with pytest.raises(SystemExit, match=r"no sglang.srt.plugins entry point is installed"):
        compare.run_one("pdserve", srv, args)
    assert srv.proc is None  # refused before starting anything


def test_server_gate_fails_at_once_when_the_server_dies(tmp_path):
    import sys
    import time

    srv = server.Server(argv=[sys.executable, "-c", "print('boom'); raise SystemExit(3)"], env={},
                        log=tmp_path / "s.log", port=1)
    srv.start()
    started = time.monotonic()
    with pytest.raises(server.ServerFailed, match="exited with 3 before it was ready"):
        srv.wait_ready(60)
    assert time.monotonic() - started < 10
    srv.stop()


def test_server_stop_takes_the_whole_process_group(tmp_path):
    import os
    import sys
    import time

    child = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']);"
            f" open({str(child)!r}, 'w').write(str(p.pid)); time.sleep(300)")
    srv = server.Server(argv=[sys.executable, "-c", code], env={}, log=tmp_path / "s.log", port=1)
    srv.start()
    deadline = time.monotonic() + 30
    while not (child.exists() and child.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = int(child.read_text())
    srv.stop(timeout=10)
    assert srv.proc.poll() is not None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # killed, waiting for init to reap it
                break
        time.sleep(0.1)
    else:
        pytest.fail(f"child {pid} of the server survived stop()")


def test_records_summary_takes_the_worst_call_per_layer(tmp_path):
    recs = [{"op": "indexer_topk", "layer": 1, "rows": 4, "lengths": [3000, 2100], "overlap_min": 0.99,
             "overlap_mean": 0.995, "rows_identical_sets": 3},
            {"op": "indexer_topk", "layer": 1, "rows": 4, "lengths": [6000], "overlap_min": 0.97,
             "overlap_mean": 0.985, "rows_identical_sets": 2},
            {"op": "sparse_mla_decode", "variant": "fp8", "layer": 0, "rows": 4, "rel_l2": 0.002,
             "rel_l2_worst_row": 0.004, "max_abs": 0.01, "nonfinite": 0},
            {"op": "sparse_mla_decode", "variant": "fp8", "layer": 0, "rows": 4, "rel_l2": 0.003,
             "rel_l2_worst_row": 0.003, "max_abs": 0.02, "nonfinite": 1,
             "exact_rows": 2, "rel_l2_ours_vs_fp32": 0.0021, "rel_l2_sglang_vs_fp32": 0.0035}]
    (tmp_path / "records-11.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs[:3]))
    (tmp_path / "records-12.jsonl").write_text(json.dumps(recs[3]) + "\n\n")
    topk, mla = sorted(diff.summarize_records(tmp_path), key=lambda r: r["op"])
    assert (topk["calls"], topk["rows"], topk["rows_identical_sets"], topk["longest"]) == (2, 8, 5, 6000)
    assert topk["overlap_min"] == 0.97 and topk["overlap_mean"] == pytest.approx(0.99)
    assert (mla["variant"], mla["calls"], mla["rel_l2_max"], mla["rel_l2_worst_row"]) == ("fp8", 2, 0.003, 0.004)
    assert (mla["max_abs"], mla["nonfinite"]) == (0.02, 1)
    table = re.sub(r" +", " ", diff.records_table([topk, mla]))
    assert "| indexer_topk | 1 | 2 | 8 | 5/8 | 0.9700 |" in table and "| sparse_mla_decode (fp8) | 0 | 2 | 8 |" in table
    # Only the calls that carry the fp32 reference of their first rows count for it.
    assert (mla["exact_rows"], mla["ours_vs_fp32_max"], mla["sglang_vs_fp32_max"]) == (2, 0.0021, 0.0035)
    assert "| sparse_mla_decode (fp8) | 0 | 2 | 0.0021 | 0.0035 |" in table


def test_decode_log_stats_reads_sglangs_decode_lines():
    text = (
        "[2026-12-01 10:00:00] Decode batch, #running-req: 4, #token: 16640, token usage: 0.00, cuda graph: True, "
        "gen throughput (token/s): 1234.56, #queue-req: 0\n"
        "[2026-12-01 10:00:01] Prefill batch, #new-seq: 1, #new-token: 4096, #running-req: 4\n"
        "[2026-12-01 10:00:01] Decode batch, #running-req: 4, #token: 16800, token usage: 0.00, cuda graph: True, "
        "gen throughput (token/s): 1300.00, #queue-req: 0\n"
        "[2026-12-01 10:00:02] Decode batch, #running-req: 3, #token: 12000, token usage: 0.00, cuda graph: False, "
        "gen throughput (token/s): 900.00, #queue-req: 0\n")
    assert server.decode_log_stats(text, 4) == {"lines": 2, "gen_throughput": [1234.56, 1300.0],
                                                "graph": ["cuda graph: True"]}
    assert server.decode_log_stats(text, 3)["graph"] == ["cuda graph: False"]
    assert server.decode_log_stats(text, 16) == {"lines": 0, "gen_throughput": [], "graph": []}


# ---- what makes a run pass (tests/gpu/dsa/verdict.py) ----

def _verdict():
    from tests.gpu.dsa import verdict

    return verdict


def test_the_recorded_h200_runs_meet_the_criteria():
    import json
    import pathlib

    verdict = _verdict()
    results = pathlib.Path(__file__).parent / "dsa" / "results" / "2026-12-01-h200x1"
    for run in ("record-fp8", "record-bf16", "verdict-eager-both"):
        rows = json.loads((results / run / "records-summary-pdserve.json").read_text())["rows"]
        assert verdict.record_failures(rows) == [], run
    for run in ("repeat-graphs-both", "verdict-eager-both"):
        assert verdict.diff_failures(json.loads((results / run / "diff.json").read_text())) == [], run


def test_v32_records_need_both_ops_a_top_k_that_chose_and_finite_figures():
    verdict = _verdict()
    topk = {"op": "indexer_topk", "layer": 0, "overlap_min": 1.0, "longest": 6032}
    mla = {"op": "sparse_mla_decode", "layer": 0, "rel_l2_max": 2e-4, "nonfinite": 0, "ours_vs_fp32_max": 1.7e-3}
    assert verdict.record_failures([topk, mla]) == []
    assert verdict.record_failures([topk]) == ["sparse_mla_decode: no record"]
    assert verdict.record_failures([mla]) == ["indexer_topk: no record"]
    assert verdict.record_failures([{**topk, "longest": 2048}, mla]) == [
        "indexer_topk: no recorded row is longer than 2048: the top-k never chose"]
    nan = float("nan")
    for bad in ({**mla, "rel_l2_max": nan}, {**mla, "ours_vs_fp32_max": nan}):
        (fail,) = verdict.record_failures([topk, bad])
        assert fail.startswith("sparse_mla_decode layer 0") and "nan" in fail
    (fail,) = verdict.record_failures([{**topk, "overlap_min": nan}, mla])
    assert fail.startswith("indexer_topk layer 0")


def test_v32_off_against_on_fails_nan_logprobs():
    verdict = _verdict()
    ref = _record("sglang", [_req([1, 2], [-0.1, -0.2])])
    for other in (_record("pdserve", [_req([1, 2], [-0.1, float("nan")])]),
                  _record("pdserve", [_req([1, 2], [-0.1, -0.2], top=[[[1, -0.1]], [[2, float("inf")]]])])):
        (fail,) = verdict.diff_failures(diff.compare_runs(ref, other))
        assert "logprobs are NaN or infinite (1 requests; first: sequential request 0)" in fail


def test_a_server_that_did_not_run_what_it_asked_for_fails():
    verdict = _verdict()
    both = {"indexer_topk": "pdserve", "sparse_mla_decode": "pdserve"}
    good = {"status": [{"kernels": both}], "ran": [{"op": "indexer_topk"}, {"op": "sparse_mla_decode"}],
            "fallback": []}
    assert verdict.plugin_failures("pdserve", good) == []
    assert verdict.plugin_failures("pdserve", {**good, "status": []})
    assert verdict.plugin_failures("pdserve", {**good, "ran": [{"op": "indexer_topk"}]})
    assert verdict.plugin_failures("pdserve", {**good, "fallback": [{"op": "sparse_mla_decode"}]})
    assert verdict.plugin_failures("sglang", good)  # asked for SGLang's, got pdserve's
    off = {"status": [{"kernels": {"indexer_topk": "sglang", "sparse_mla_decode": "sglang"}}], "ran": [],
           "fallback": []}
    assert verdict.plugin_failures("sglang", off) == []


def test_records_outside_the_bounds_fail():
    verdict = _verdict()
    topk = {"op": "indexer_topk", "layer": 0, "overlap_min": 1.0, "longest": 6032}
    mla = {"op": "sparse_mla_decode", "layer": 0, "nonfinite": 0, "rel_l2_max": 5e-3, "ours_vs_fp32_max": 1.7e-3}
    assert verdict.record_failures([topk, mla]) == []
    assert verdict.record_failures([])
    for bad_topk, bad_mla, words in (({**topk, "overlap_min": 0.99}, mla, "shares only 0.9900"),
                                     (topk, {**mla, "ours_vs_fp32_max": 6e-3}, "from the fp32 reference"),
                                     (topk, {**mla, "rel_l2_max": 2e-2}, "from SGLang's kernel"),
                                     (topk, {**mla, "nonfinite": 1}, "1 non-finite outputs")):
        (fail,) = verdict.record_failures([bad_topk, bad_mla])
        assert words in fail
    (fail,) = verdict.diff_failures({"max_abs_logprob_diff": 0.9, "rows": []})
    assert "0.9000 > 0.5" in fail
