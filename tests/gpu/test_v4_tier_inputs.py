"""What the DeepSeek-V4 variant of the DSA GPU tier (tests/gpu/dsa, --arch v4) feeds SGLang, checked on the CPU:
the wheel set (the DSA set + TileLang, z3, the DLPack extension) and its staging check, the tiny
DeepseekV4ForCausalLM (config, checkpoint names and shapes against SGLang 0.5.17's V4 loader, the file format,
the weights' spread in attention and in the indexer), the driver's command line against the real SGLang parser,
the verdict's arithmetic on made-up records, and the driver end to end on a CPU stand-in of launch_server."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import require_or_skip
from tests.gpu import wheelhouse
from tests.gpu.dsa import compare, diff, safetensors_file, server, verdict
from tests.gpu.dsa.tiny_dsa_model import TensorSpec
from tests.gpu.dsa.tiny_v4_model import (
    BASE_CONFIG,
    checkpoint_spec,
    init_of,
    make_tiny_v4_model,
    make_v4_tensor,
    v4_config,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# --- the wheel set -----------------------------------------------------------------------------------


def test_v4_pins_are_the_dsa_set_plus_tilelang_z3_and_dlpack():
    base = wheelhouse.PINS.read_text(encoding="utf-8")
    pins = wheelhouse.pin_lines(wheelhouse.v4_pins(base))
    assert pins == [*wheelhouse.pin_lines(wheelhouse.dsa_pins(base)),
                    "tilelang==0.1.11", "z3_solver==4.15.4.0", "torch_c_dlpack_ext==0.1.5"]
    assert "sglang==0.5.17" in pins and "sgl_deep_gemm==0.1.5.post1" in pins
    assert len(pins) == len(set(pins)) == 71  # the probe's 72 wheels less the plugin's
    assert not any("#" in p for p in wheelhouse.v4_pins(base).splitlines())


def test_comment_lines_are_no_pins(tmp_path, monkeypatch):
    pins = tmp_path / "pins.txt"
    pins.write_text("# a comment: with words, and == signs\nfoo==1.0  # trailing\n\n   \nBar-Baz==2.0\n")
    assert wheelhouse.pin_lines(pins.read_text()) == ["foo==1.0", "Bar-Baz==2.0"]
    assert wheelhouse.pin_names(pins.read_text()) == ["foo", "bar_baz"]
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / "foo-1.0-py3-none-any.whl").write_bytes(b"")
    monkeypatch.setitem(wheelhouse.TIERS, "as-is", lambda text: text)
    assert wheelhouse.unstaged("as-is", staged, pins) == ["bar_baz"]


def _stage_run(tmp_path: Path, staged: Path, mode: str = "run", chunks: Path | None = None, tier: str = "--v4",
               **env_vars: str) -> subprocess.CompletedProcess:
    """run_on_device.sh [--v4] MODE with `chunks` carried (default nothing) and `staged` as what earlier calls left."""
    env = dict(os.environ, PDSERVE_WHEEL_CHUNKS=str(chunks or tmp_path / "no-chunks"),
               PDSERVE_WHEEL_STAGE=str(staged), OUT=str(tmp_path / "out"),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env_vars)
    for name in ("RUN_ARCH", "STEPS_ARCH", "STEPS_LAYERS"):
        if name not in env_vars:
            env.pop(name, None)
    argv = ["bash", str(HERE / "dsa" / "run_on_device.sh"), *([tier] if tier else []), mode]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, check=False)


@pytest.mark.parametrize("tier, mode, env_vars, words", [
    ("--v4", "run", {"RUN_ARCH": "v5"}, "RUN_ARCH must be v4 or dsa, not 'v5'"),
    ("--v4", "steps", {"STEPS_ARCH": "dsa; rm -rf /"}, "STEPS_ARCH must be v4 or dsa, not 'dsa; rm -rf /'"),
    ("--v4", "steps", {"STEPS_LAYERS": "0"}, "STEPS_LAYERS must be a whole number of layers (1 or more), not '0'"),
    ("--v4", "steps", {"STEPS_LAYERS": "16 --x"}, "not '16 --x'"),
    ("", "run", {"RUN_ARCH": "v4"}, "RUN_ARCH=v4 needs the V4 wheel set"),
])
def test_a_bad_choice_of_model_is_refused_before_anything_is_installed(tmp_path, tier, mode, env_vars, words):
    staged = tmp_path / "staged"  # nothing staged: the check must come before the staging check
    done = _stage_run(tmp_path, staged, mode, tier=tier, **env_vars)
    assert done.returncode == 2 and words in done.stdout, done.stdout + done.stderr
    assert "not staged" not in done.stdout


def test_run_arch_dsa_on_the_v4_set_gets_past_the_checks(tmp_path):
    staged = tmp_path / "staged"
    done = _stage_run(tmp_path, staged, "run", RUN_ARCH="dsa")
    assert done.returncode == 1 and "not staged:" in done.stdout, done.stdout + done.stderr


def test_staging_keeps_the_carried_plugin_wheel_for_later_calls(tmp_path):
    staged = tmp_path / "staged"
    carried = tmp_path / "carried"
    (carried / "c1").mkdir(parents=True)
    (carried / "plugin").mkdir()
    (carried / "c1" / "foo-1-py3-none-any.whl").write_bytes(b"foo")
    wheel = carried / "plugin" / "pdserve_kernels-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"first build")
    assert _stage_run(tmp_path, staged, "stage", carried).returncode == 0
    kept = tmp_path / "staged-plugin" / wheel.name
    assert kept.read_bytes() == b"first build" and (staged / "foo-1-py3-none-any.whl").exists()
    wheel.write_bytes(b"rebuilt")  # the same file name: the carried one wins
    assert _stage_run(tmp_path, staged, "stage", carried).returncode == 0 and kept.read_bytes() == b"rebuilt"
    assert _stage_run(tmp_path, staged, "stage").returncode == 0 and kept.read_bytes() == b"rebuilt"
    bad = _stage_run(tmp_path, staged, "install")
    assert bad.returncode == 2 and "stage|prepare|run" in bad.stdout


def test_run_names_exactly_the_unstaged_wheels_and_no_comment(tmp_path):
    """The bug a previous session hit: wheelhouse.txt's comment line came out as an unstaged 'distribution'."""
    staged = tmp_path / "staged"
    staged.mkdir()
    names = wheelhouse.pin_names(wheelhouse.v4_pins(wheelhouse.PINS.read_text(encoding="utf-8")))
    for name in names:
        if name not in ("tilelang", "z3_solver"):
            (staged / f"{name}-0-py3-none-any.whl").write_bytes(b"")
    done = _stage_run(tmp_path, staged)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "not staged: tilelang z3_solver (stage each of" in done.stdout
    assert "#" not in done.stdout.split("not staged:", 1)[1].split("(", 1)[0]


def _fake_wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name in ("sgl_kernel/flashmla_ops.abi3.so", "sgl_kernel/flash_ops.abi3.so", "sgl_kernel/common_ops.so"):
            z.writestr(name, name.encode() * 10)
        z.writestr("sglang_kernel-0.4.5.dist-info/RECORD", "stale\n")
    return path


def test_v4_set_is_built_in_its_own_pool_keeping_flashmla(tmp_path):
    out = tmp_path / "v4"
    (out / "all").mkdir(parents=True)
    _fake_wheel(out / "all" / "sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl")
    (out / "all" / "tilelang-0.1.11-cp38-abi3-manylinux_2_28_x86_64.whl").write_bytes(os.urandom(3000))
    done = subprocess.run([sys.executable, str(HERE / "wheelhouse.py"), "--v4", "--out", str(out), "--no-download",
                           "--chunk-mib", "1"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "pins.txt").read_text() == wheelhouse.v4_pins(wheelhouse.PINS.read_text(encoding="utf-8"))
    with zipfile.ZipFile(out / "all" / "sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl") as z:
        assert "sgl_kernel/flashmla_ops.abi3.so" in z.namelist()  # V4 decodes with FlashMLA
        assert "sgl_kernel/flash_ops.abi3.so" not in z.namelist()
    chunked = sorted(f.name for c in out.glob("c[0-9]*") for f in c.iterdir())
    assert chunked == sorted(f.name for f in (out / "all").iterdir())
    bad = subprocess.run([sys.executable, str(HERE / "wheelhouse.py"), "--v4", "--dsa", "--no-download"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "not allowed with" in bad.stderr


# --- the model -----------------------------------------------------------------------------------------

CONFIG = v4_config(468, 0, 1)


def sglang_v4_parameters(c: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """(shape, dtype) of every parameter SGLang 0.5.17's DeepseekV4ForCausalLM has for this config (TP 1,
    bf16, no quantization, SGLANG_OPT_FP8_WO_A_GEMM=0, shared experts not fused, wq_a/wkv fused), read from
    models/deepseek_v4.py: make_hc_mixing_params / make_hc_head_params (fp32), MqaAttentionBase.__init__
    (attn_sink fp32, wqkv_a, q_norm, wq_b, kv_norm, wo_a, wo_b), layers/attention/dsv4/compressor.py Compressor
    (ape fp32 [ratio, coff x head_dim], wkv_gate [2 x coff x head_dim, hidden], norm fp32), indexer.py C4Indexer
    (wq_b, weights_proj, a ratio-4 Compressor over index_head_dim), models/deepseek_v2.py MoEGate (weight,
    e_score_correction_bias fp32 for noaux_tc), FusedMoE (w13_weight, w2_weight), DeepseekV2MLP
    (gate_up_proj, down_proj), DeepseekV4Model (embed_tokens, norm, hc_head_*), the LM head."""
    h, v, hc = c["hidden_size"], c["vocab_size"], c["hc_mult"]
    heads, hd, qlr, groups, olr = (c["num_attention_heads"], c["head_dim"], c["q_lora_rank"], c["o_groups"],
                                   c["o_lora_rank"])
    ih, idim = c["index_n_heads"], c["index_head_dim"]
    experts, inter = c["n_routed_experts"], c["moe_intermediate_size"]
    mix = (2 + hc) * hc
    bf, f32 = "bfloat16", "float32"
    params = {"model.embed_tokens.weight": ((v, h), bf), "model.norm.weight": ((h,), bf),
              "model.hc_head_fn": ((hc, hc * h), f32), "model.hc_head_base": ((hc,), f32),
              "model.hc_head_scale": ((1,), f32), "lm_head.weight": ((v, h), bf)}

    def compressor(prefix, ratio, dim):
        coff = 1 + (ratio == 4)
        return {f"{prefix}.ape": ((ratio, coff * dim), f32), f"{prefix}.wkv_gate.weight": ((2 * coff * dim, h), bf),
                f"{prefix}.norm.weight": ((dim,), f32)}

    for i, ratio in enumerate(c["compress_ratios"]):
        p, a, m = f"model.layers.{i}", f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        params.update({
            f"{p}.input_layernorm.weight": ((h,), bf), f"{p}.post_attention_layernorm.weight": ((h,), bf),
            f"{p}.hc_attn_fn": ((mix, hc * h), f32), f"{p}.hc_ffn_fn": ((mix, hc * h), f32),
            f"{p}.hc_attn_base": ((mix,), f32), f"{p}.hc_ffn_base": ((mix,), f32),
            f"{p}.hc_attn_scale": ((3,), f32), f"{p}.hc_ffn_scale": ((3,), f32),
            f"{a}.attn_sink": ((heads,), f32), f"{a}.wqkv_a.weight": ((qlr + hd, h), bf),
            f"{a}.q_norm.weight": ((qlr,), bf), f"{a}.wq_b.weight": ((heads * hd, qlr), bf),
            f"{a}.kv_norm.weight": ((hd,), bf), f"{a}.wo_a.weight": ((groups * olr, heads * hd // groups), bf),
            f"{a}.wo_b.weight": ((h, groups * olr), bf),
            f"{m}.gate.weight": ((experts, h), bf), f"{m}.gate.e_score_correction_bias": ((experts,), f32),
            f"{m}.experts.w13_weight": ((experts, 2 * inter, h), bf),
            f"{m}.experts.w2_weight": ((experts, h, inter), bf),
            f"{m}.shared_experts.gate_up_proj.weight": ((2 * inter, h), bf),
            f"{m}.shared_experts.down_proj.weight": ((h, inter), bf),
        })
        if ratio:
            params.update(compressor(f"{a}.compressor", ratio, hd))
        if ratio == 4:
            params.update({f"{a}.indexer.wq_b.weight": ((ih * idim, qlr), bf),
                           f"{a}.indexer.weights_proj.weight": ((ih, h), bf),
                           **compressor(f"{a}.indexer.compressor", 4, idim)})
    return params


_EXPERT = re.compile(r"(?P<m>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<w>gate_proj|up_proj|down_proj)\.weight")


def load_like_sglang_v4(specs: list[TensorSpec], experts: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Where DeepseekV4ForCausalLM.load_weights (0.5.17) puts each checkpoint tensor: wq_a + wkv concatenated
    (dim 0) into wqkv_a, compressor wkv + wgate concatenated into wkv_gate, shared experts' gate_proj/up_proj
    stacked into gate_up_proj, expert E's gate_proj/up_proj into w13_weight[E] (halves) and down_proj into
    w2_weight[E]; every other name as it is. Each fused parameter must get all its parts exactly once."""
    parts: dict[str, list[TensorSpec]] = {}
    expert_parts: dict[str, dict[tuple[int, str], TensorSpec]] = {}
    for s in specs:
        if (m := _EXPERT.fullmatch(s.name)) is not None:
            key = (int(m["e"]), m["w"])
            bucket = expert_parts.setdefault(m["m"], {})
            assert key not in bucket, f"{s.name} twice"
            bucket[key] = s
            continue
        name = s.name
        for old, new in ((".wq_a.weight", ".wqkv_a.weight"), (".self_attn.wkv.weight", ".self_attn.wqkv_a.weight"),
                         (".compressor.wkv.weight", ".compressor.wkv_gate.weight"),
                         (".compressor.wgate.weight", ".compressor.wkv_gate.weight"),
                         ("shared_experts.gate_proj.weight", "shared_experts.gate_up_proj.weight"),
                         ("shared_experts.up_proj.weight", "shared_experts.gate_up_proj.weight")):
            if name.endswith(old):
                name = name[: -len(old)] + new
                break
        parts.setdefault(name, []).append(s)
    out = {}
    for name, shards in parts.items():
        fused = name.endswith((".wqkv_a.weight", ".wkv_gate.weight", ".gate_up_proj.weight"))
        assert len(shards) == (2 if fused else 1), f"{name}: {[s.name for s in shards]}"
        assert len({(s.shape[1:], s.dtype) for s in shards}) == 1, f"{name}: shards disagree: {shards}"
        out[name] = ((sum(s.shape[0] for s in shards), *shards[0].shape[1:]), shards[0].dtype)
    for prefix, bucket in expert_parts.items():
        assert set(bucket) == {(e, w) for e in range(experts) for w in ("gate_proj", "up_proj", "down_proj")}
        gate, down = bucket[(0, "gate_proj")], bucket[(0, "down_proj")]
        assert all(bucket[(e, w)].shape == bucket[(0, w)].shape for e, w in bucket)
        out[f"{prefix}.w13_weight"] = ((experts, 2 * gate.shape[0], gate.shape[1]), gate.dtype)
        out[f"{prefix}.w2_weight"] = ((experts, *down.shape), down.dtype)
    return out


def test_checkpoint_fills_exactly_the_parameters_sglang_loads():
    specs = checkpoint_spec(CONFIG)
    assert len({s.name for s in specs}) == len(specs)
    assert load_like_sglang_v4(specs, CONFIG["n_routed_experts"]) == sglang_v4_parameters(CONFIG)
    size = sum(math.prod(s.shape) * (2 if s.dtype == "bfloat16" else 4) for s in specs)
    assert size == 2_387_219_316  # 2.22 GiB: the probe's model.safetensors was 2.22 GiB too (facts §2)
    for s in specs:
        init_of(s.name)  # every tensor has a scale


def test_the_names_are_0517s(tmp_path):
    """The parameter and attribute names the spec relies on, in SGLang 0.5.17's own V4 sources (unpacked by
    .ci/setup into .venv/sglang-0.5.17): a renamed attribute would leave a parameter unloaded."""
    src = Path(os.environ.get("PDSERVE_SGLANG_0517_SRC", ROOT / ".venv" / "sglang-0.5.17")) / "sglang"
    require_or_skip((src / "srt/models/deepseek_v4.py").exists(), f"SGLang 0.5.17's sources are not in {src.parent} "
                    "(.ci/setup unpacks them there)", "PDSERVE_REQUIRE_SGLANG_0517")
    model = (src / "srt/models/deepseek_v4.py").read_text()
    for attr in ("attn_sink", "wqkv_a", "wq_a", "wkv", "q_norm", "wq_b", "kv_norm", "wo_a", "wo_b", "compressor",
                 "indexer", "input_layernorm", "post_attention_layernorm", "hc_attn_fn", "hc_ffn_fn",
                 "hc_attn_base", "hc_ffn_base", "hc_attn_scale", "hc_ffn_scale", "embed_tokens", "norm",
                 "hc_head_fn", "hc_head_base", "hc_head_scale", "lm_head", "mlp"):
        assert re.search(rf"\bself\.{attr}\s*(=|,|\))", model), attr
    assert 'COMPRESSOR_PART = ".compressor.w"' in model and 'param_name = key + ".wkv_gate.weight"' in model
    assert '("gate_up_proj", "gate_proj", 0)' in model and "mix_hc = (2 + hc_mult) * hc_mult" in model
    compressor = (src / "srt/layers/attention/dsv4/compressor.py").read_text()
    assert "torch.empty(self.ratio, coff * self.head_dim, dtype=torch.float32)" in compressor
    assert "self.wkv_gate = ReplicatedLinear(" in compressor and "weight_dtype=torch.float32" in compressor
    indexer = (src / "srt/layers/attention/dsv4/indexer.py").read_text()
    assert "self.weights_proj = ReplicatedLinear(" in indexer and "compress_ratio=4," in indexer
    moe = (src / "srt/models/deepseek_v2.py").read_text()
    assert 'getattr(config, "num_hash_layers", 0)' in moe and "self.e_score_correction_bias = nn.Parameter(" in moe


def test_config_is_the_probes_with_what_sglang_asserts():
    c = CONFIG
    assert {k: v for k, v in c.items() if k not in ("vocab_size", "bos_token_id", "eos_token_id")} == BASE_CONFIG
    assert c["architectures"] == ["DeepseekV4ForCausalLM"] and c["model_type"] == "deepseek_v4"
    assert c["head_dim"] == 512 == c["qk_nope_head_dim"] + c["qk_rope_head_dim"] and c["num_key_value_heads"] == 1
    assert c["qk_nope_head_dim"] + 2 * c["qk_rope_head_dim"] + 8 == 584  # the pool's bytes per token
    assert c["index_topk"] in (512, 1024) and "original_max_position_embeddings" in c["rope_scaling"]
    assert set(c["compress_ratios"]) == {0, 4, 128} and len(c["compress_ratios"]) == c["num_hidden_layers"]
    assert c["sliding_window"] == c["window_size"] == 128 and c["num_hash_layers"] == 0
    assert "quantization_config" not in c and c["torch_dtype"] == "bfloat16"
    with pytest.raises(KeyError, match="not config keys"):
        v4_config(468, 0, 1, hidden=1)
    with pytest.raises(ValueError, match="compress_ratios"):
        checkpoint_spec(v4_config(468, 0, 1, compress_ratios=[0, 4, 64, 4]))
    with pytest.raises(ValueError, match="num_hash_layers"):
        checkpoint_spec(v4_config(468, 0, 1, num_hash_layers=1))


# A shrunken V4 (same tensor names and layout rules, small sizes) for the file-format test: the real one is 2.2 GiB.
SMALL = {"hidden_size": 64, "q_lora_rank": 32, "o_lora_rank": 16, "n_routed_experts": 3, "moe_intermediate_size": 8,
         "num_attention_heads": 2, "index_n_heads": 2}


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    require_or_skip(importlib.util.find_spec("tokenizers") is not None
                    and importlib.util.find_spec("torch") is not None,
                    "the tokenizers and torch packages are not installed", "PDSERVE_REQUIRE_PARSERS")
    return make_tiny_v4_model(tmp_path_factory.mktemp("v4") / "tiny-v4", seed=0, **SMALL)


def test_written_directory_has_the_config_and_every_tensor_in_order(small_model):
    import torch

    config = json.loads((small_model / "config.json").read_text())
    assert config["architectures"] == ["DeepseekV4ForCausalLM"] and config["vocab_size"] == 468
    header = safetensors_file.read_header(small_model / "model.safetensors")
    assert header.pop("__metadata__") == {"format": "pt", "seed": "0"}
    specs = checkpoint_spec(config)
    assert list(header) == [s.name for s in specs]
    offset = 0
    for s in specs:
        entry = header[s.name]
        size = {"bfloat16": 2, "float32": 4}[s.dtype]
        assert entry["dtype"] == {"bfloat16": "BF16", "float32": "F32"}[s.dtype] and tuple(entry["shape"]) == s.shape
        assert entry["data_offsets"] == [offset, offset + size * math.prod(s.shape)]
        offset = entry["data_offsets"][1]
    # fp32 where SGLang keeps fp32 (the mHC mixing, the sink, the compressors' ape and norm, the router bias).
    assert {s.name.rsplit(".", 1)[-1] if "hc_" in s.name else s.name.split("self_attn.")[-1].split("mlp.")[-1]
            for s in specs if s.dtype == "float32" and "layers.1." in s.name} == {
        "hc_attn_fn", "hc_ffn_fn", "hc_attn_base", "hc_ffn_base", "hc_attn_scale", "hc_ffn_scale", "attn_sink",
        "compressor.ape", "compressor.norm.weight", "indexer.compressor.ape", "indexer.compressor.norm.weight",
        "gate.e_score_correction_bias"}
    path = small_model / "model.safetensors"
    name = "model.layers.1.self_attn.compressor.ape"
    begin, end = header[name]["data_offsets"]
    with open(path, "rb") as f:
        f.seek(8 + int.from_bytes(f.read(8), "little") + begin)
        stored = torch.frombuffer(bytearray(f.read(end - begin)), dtype=torch.float32)
    spec = next(s for s in specs if s.name == name)
    assert torch.equal(stored.view(spec.shape), make_v4_tensor(spec, 0))
    assert not torch.equal(make_v4_tensor(spec, 0), make_v4_tensor(spec, 1))


# --- the weights' spread (a CPU reference of layer 0-2's attention inputs) -------------------------------


def _rms(x, w=None, eps=1e-6):
    y = x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt()
    return y if w is None else y * w


class Layer:
    """The tensors of one layer of the seed-0 model, fp32, generated on demand."""

    def __init__(self, i: int, weights=None):
        self.i, self.prefix, self.weights = i, f"model.layers.{i}", weights
        self.specs = {s.name: s for s in checkpoint_spec(CONFIG)}

    def __call__(self, suffix: str):
        name = suffix if suffix.startswith(("model.", "lm_head.")) else f"{self.prefix}.{suffix}"
        if self.weights is not None:
            return self.weights(self.specs[name])
        return make_v4_tensor(self.specs[name], 0).float()


def _x(layer: Layer, tokens: int, seed: int = 5):
    """The attention input of `tokens` random ids at layer 0: the 4 mHC copies are equal there, so the
    pre-weighted sum is a multiple of the embedding and input_layernorm removes the multiple."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, CONFIG["vocab_size"], (tokens,), generator=g)
    return _rms(layer("model.embed_tokens.weight")[ids], layer("input_layernorm.weight"))


def _q(layer: Layer, x):
    """The last token's query heads: q_norm(wq_a x), wq_b, then each head RMS-normalized without a weight."""
    heads, hd = CONFIG["num_attention_heads"], CONFIG["head_dim"]
    q_lora = _rms(x[-1:] @ layer("self_attn.wq_a.weight").T, layer("self_attn.q_norm.weight"))
    return _rms((q_lora @ layer("self_attn.wq_b.weight").T).view(heads, hd)), q_lora


def _compress(layer: Layer, x, prefix: str, ratio: int, dim: int):
    """Compressed keys as SGLang's compressor makes them (compressor_v2.py's C128 fallback; C4 with the
    overlap as its ape layout implies): per channel a softmax over the window's tokens of (wgate x + ape),
    the kv of those tokens weighted by it, then RMSNorm x norm. C4 windows are 8 tokens: the previous 4
    through the first half of the channels, the current 4 through the second. RoPE is left out (it turns
    the 64 rope channels of q and k alike)."""
    import torch

    coff = 1 + (ratio == 4)
    kv, score = x @ layer(f"{prefix}.wkv.weight").T, x @ layer(f"{prefix}.wgate.weight").T  # [T, coff * dim]
    ape = layer(f"{prefix}.ape")  # [ratio, coff * dim]
    blocks = x.shape[0] // ratio
    kv, score = kv[: blocks * ratio].view(blocks, ratio, coff * dim), score[: blocks * ratio].view(blocks, ratio, -1)
    score = score + ape
    if coff == 2:
        prev_kv = torch.cat([torch.zeros_like(kv[:1, :, :dim]), kv[:-1, :, :dim]])
        prev_score = torch.cat([torch.full_like(score[:1, :, :dim], float("-inf")), score[:-1, :, :dim]])
        kv = torch.cat([prev_kv, kv[:, :, dim:]], dim=1)  # [blocks, 2 x ratio, dim]
        score = torch.cat([prev_score, score[:, :, dim:]], dim=1)
    pooled = (score.softmax(dim=1) * kv).sum(dim=1)
    return _rms(pooled, layer(f"{prefix}.norm.weight"))


def _spread(q, keys) -> tuple[float, float]:
    """Attention logits of the query heads over `keys` (softmax scale 512^-0.5): (std across keys, averaged
    over heads; the largest softmax weight times the number of keys, averaged over heads)."""
    import torch

    logits = (q @ keys.T) * CONFIG["head_dim"] ** -0.5
    peak = torch.softmax(logits, -1).max(-1).values.mean().item() * keys.shape[0]
    return logits.std(-1).mean().item(), peak


def test_window_attention_is_far_from_uniform():
    """Layer 0 (window only): the last token's logits over the 128 window keys (kv_norm(wkv x))."""
    import torch

    layer = Layer(0)
    x = _x(layer, 128)
    q, _ = _q(layer, x)
    std, peak = _spread(q, _rms(x @ layer("self_attn.wkv.weight").T, layer("self_attn.kv_norm.weight")))
    g = torch.Generator().manual_seed(1234)
    dummy = Layer(0, weights=lambda s: torch.rand(s.shape, generator=g) * 2e-3 - 1e-3)  # SGLang's dummy weights
    xd = _x(dummy, 128)
    qd, _ = _q(dummy, xd)
    dstd, dpeak = _spread(qd, _rms(xd @ dummy("self_attn.wkv.weight").T, dummy("self_attn.kv_norm.weight")))
    print(f"\nlayer 0 window logits over 128 keys: std {std:.2f}, top weight {peak:.0f}x uniform "
          f"(dummy weights: std {dstd:.2g}, top {dpeak:.2f}x)")
    assert std > 1.5 and peak > 10
    assert dstd < 0.05 and dpeak < 1.2


def test_compressed_attention_and_the_indexer_have_spread():
    """Layer 1 (C4) over 2600 tokens: the logits over its 650 compressed keys, and the indexer's scores
    (sum over 64 heads of w_h relu(q_h . k), k from its own compressor): its top-512 has a real boundary.
    Layer 2 (C128) over 4096 tokens: the logits over its 32 compressed keys."""
    import torch

    layer = Layer(1)
    x = _x(layer, 2600)
    q, q_lora = _q(layer, x)
    keys = _compress(layer, x, "self_attn.compressor", 4, CONFIG["head_dim"])
    std, peak = _spread(q, keys)
    ih, idim = CONFIG["index_n_heads"], CONFIG["index_head_dim"]
    iq = (q_lora @ layer("self_attn.indexer.wq_b.weight").T).view(ih, idim)
    ik = _compress(layer, x, "self_attn.indexer.compressor", 4, idim)
    w = (x[-1:] @ layer("self_attn.indexer.weights_proj.weight").T).view(ih) * idim ** -0.5 * ih ** -0.5
    scores = (torch.relu(iq @ ik.T) * w[:, None]).sum(0)
    ranked = scores.sort(descending=True).values
    gap = (ranked[511] - ranked[512]).item() / scores.std().item()
    layer2 = Layer(2)
    x2 = _x(layer2, 4096)
    q2, _ = _q(layer2, x2)
    keys2 = _compress(layer2, x2, "self_attn.compressor", 128, CONFIG["head_dim"])
    std2, peak2 = _spread(q2, keys2)
    print(f"\nlayer 1 (C4) logits over {keys.shape[0]} compressed keys: std {std:.2f}, top weight {peak:.0f}x uniform; "
          f"indexer scores std {scores.std().item():.3g}, gap at the 512th {gap:.2e} std; "
          f"layer 2 (C128) over {keys2.shape[0]} keys: std {std2:.2f}, top {peak2:.1f}x")
    assert keys.shape[0] == 650 and std > 1.5 and peak > 10
    assert scores.std().item() > 0.1 * scores.abs().mean().item()  # not one score for all keys
    assert len(set(scores.tolist())) == scores.numel() and gap > 0  # no ties: the top-512 is well defined
    assert keys2.shape[0] == 32 and std2 > 1.5 and peak2 > 3


def test_vocabulary_logprobs_have_spread():
    import torch

    layer = Layer(0)
    g = torch.Generator().manual_seed(3)
    hidden = _rms(torch.randn(8, CONFIG["hidden_size"], generator=g), layer("model.norm.weight"))
    logprobs = torch.log_softmax(hidden @ layer("lm_head.weight").T, -1)
    top = logprobs.topk(5, -1).values
    print(f"\nvocabulary top-5 logprobs over 8 random final states: {top[0].tolist()}")
    assert (top[:, 0] > -4.0).all() and (top[:, 0] - top[:, 4] > 0.5).all()  # log(1/468) = -6.1


# --- the driver ----------------------------------------------------------------------------------------


def test_v4_driver_defaults(tmp_path):
    args = compare.parse_args(["--model", str(tmp_path), "--out", str(tmp_path / "o"), "--arch", "v4"])
    assert compare.kernel_choices(args) == ["sglang", "pdserve"]  # SGLang's first: the gate
    assert args.graph_bs == [] and args.record_dir == tmp_path / "o" / "record" and args.ready_timeout == 420
    assert compare.parse_args(["--model", str(tmp_path), "--out", str(tmp_path)]).ready_timeout == 330  # dsa
    assert all(n > 2048 for n in args.prompt_lens) and max(args.prompt_lens) + args.max_new_tokens <= 8192
    for kernels, srv in compare.make_servers(args).items():
        joined = " ".join(srv.argv)
        for flag in ("--disable-radix-cache", "--cuda-graph-backend-decode disabled", "--context-length 8192",
                     "--mem-fraction-static 0.3", "--max-running-requests 16", "--chunked-prefill-size 4096",
                     "--sampling-backend pytorch", "--cuda-graph-backend-prefill disabled", "--load-format auto"):
            assert flag in joined
        assert "--attention-backend" not in joined and "--page-size" not in joined  # SGLang picks dsv4 and 256
        assert srv.env == {"SGLANG_OPT_FP8_WO_A_GEMM": "0", "SGLANG_DSV4_FP4_EXPERTS": "0",
                           "SGLANG_DSV4_MHC_PREWARM": "0", "PDSERVE_DSA_KERNELS": kernels, "PYTHONUNBUFFERED": "1",
                           "PDSERVE_DSA_RECORD_DIR": str(tmp_path / "o" / "record" / kernels)}
    radix = compare.make_servers(compare.parse_args(["--model", str(tmp_path), "--out", str(tmp_path), "--arch",
                                                     "v4", "--radix-cache"]))["sglang"]
    assert "--disable-radix-cache" not in radix.argv


def test_v4_driver_refuses_what_it_cannot_do(tmp_path, capsys):
    base = ["--model", str(tmp_path), "--out", str(tmp_path)]
    for bad in (["--arch", "v4", "--phase", "bench"], ["--arch", "v4", "--prompt-lens", "2000"],
                ["--arch", "v4", "--prompt-lens", "8180"], ["--radix-cache"], ["--strict-gate"], ["--no-warmup"],
                ["--arch", "v5"]):
        with pytest.raises(SystemExit):
            compare.parse_args(base + bad)
    err = capsys.readouterr().err
    assert "compare phase only" in err and "longer than 2048 tokens for --arch v4" in err
    with pytest.raises(ValueError, match="arch must be one of"):
        server.server_args(tmp_path, 1, arch="v5")


def test_v4_server_command_accepted_by_the_real_sglang_parser(tmp_path):
    require_or_skip(importlib.util.find_spec("sglang") is not None, "sglang is not installed in this Python",
                    "PDSERVE_REQUIRE_PARSERS")
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    srv = compare.make_servers(compare.parse_args(["--model", str(tmp_path), "--out", str(tmp_path),
                                                   "--arch", "v4"]))["pdserve"]
    parsed = parser.parse_args(srv.argv[3:])
    assert parsed.disable_radix_cache is True and parsed.cuda_graph_backend_decode == "disabled"
    assert (parsed.context_length, parsed.mem_fraction_static, parsed.max_running_requests) == (8192, 0.3, 16)
    assert (parsed.chunked_prefill_size, parsed.sampling_backend, parsed.load_format) == (4096, "pytorch", "auto")
    assert parsed.attention_backend is None and parsed.page_size is None  # left to SGLang (dsv4, 256)
    graphs = compare.make_servers(compare.parse_args(["--model", str(tmp_path), "--out", str(tmp_path), "--arch",
                                                      "v4", "--graph-bs", "1,2,4"]))["sglang"]
    assert parser.parse_args(graphs.argv[3:]).cuda_graph_bs_decode == [1, 2, 4]


def test_weight_problem_lines_stop_a_v4_run_only_for_v4(tmp_path):
    log = tmp_path / "s.log"
    log.write_text("x\n[2026] Some weights are not initialized from checkpoints: {'model.layers.0.x'}\n"
                   "Tree cache initialized: source=default impl=SWAChunkCache hybrid_swa=True\n")
    srv = server.Server(argv=[], env={}, log=log, port=1)
    assert compare.log_findings(srv, "v4")["unknown_weights"]
    assert not compare.log_findings(srv, "dsa")["unknown_weights"]
    assert compare.log_findings(srv, "v4")["tree_cache_impl"] == "SWAChunkCache"


# ---- what makes a V4 run pass (verdict.py) ----

CONFIG_RATIOS = {"compress_ratios": [0, 4, 128, 4], "index_topk": 512}


def _v4_rows(changes: dict | None = None):
    rows = []
    for layer, ratio in enumerate(CONFIG_RATIOS["compress_ratios"]):
        if ratio == 4:
            rows.append({"op": "indexer_topk", "variant": "", "layer": layer, "overlap_min": 1.0, "longest": 1750})
        rows.append({"op": "sparse_mla_decode", "variant": "v4", "layer": layer, "nonfinite": 0, "rel_l2_max": 1e-3,
                     "ours_vs_fp32_max": 1.2e-3})
    for (op, layer), fields in (changes or {}).items():
        next(r for r in rows if (r["op"], r["layer"]) == (op, layer)).update(fields)
    return rows


def test_v4_records_pass_and_fail_per_layer():
    assert verdict.v4_record_failures(_v4_rows(), CONFIG_RATIOS) == []
    # 2 of 512 entries differ: allowed; 3: not.
    two, three = 1 - 2 / 512, 1 - 3 / 512
    assert verdict.v4_record_failures(_v4_rows({("indexer_topk", 1): {"overlap_min": two}}), CONFIG_RATIOS) == []
    (fail,) = verdict.v4_record_failures(_v4_rows({("indexer_topk", 3): {"overlap_min": three}}), CONFIG_RATIOS)
    assert fail.startswith("indexer_topk layer 3") and "3 of 512" in fail
    for fields, text in (({"rel_l2_max": 1.1e-2}, "from SGLang's kernel"), ({"ours_vs_fp32_max": 3.1e-3}, "fp32"),
                         ({"nonfinite": 2}, "non-finite")):
        (fail,) = verdict.v4_record_failures(_v4_rows({("sparse_mla_decode", 2): fields}), CONFIG_RATIOS)
        assert fail.startswith("sparse_mla_decode layer 2") and text in fail
    without = [r for r in _v4_rows() if (r["op"], r["layer"]) != ("sparse_mla_decode", 0)]
    assert verdict.v4_record_failures(without, CONFIG_RATIOS) == [
        "sparse_mla_decode layer 0 (compress ratio 0): no record"]
    without = [r for r in _v4_rows() if (r["op"], r["layer"]) != ("indexer_topk", 3)]
    assert verdict.v4_record_failures(without, CONFIG_RATIOS) == ["indexer_topk layer 3 (C4): no record"]
    stray = [*_v4_rows(), {"op": "indexer_topk", "layer": 2, "overlap_min": 1.0, "longest": 900}]
    assert verdict.v4_record_failures(stray, CONFIG_RATIOS) == [
        "indexer_topk layer 2: an indexer record on a layer of compress ratio 128"]
    short = _v4_rows({("indexer_topk", 1): {"longest": 512}, ("indexer_topk", 3): {"longest": 400}})
    assert verdict.v4_record_failures(short, CONFIG_RATIOS) == [
        "indexer_topk: no recorded row is longer than 512 compressed entries: the top-k never chose"]
    no_fp32 = _v4_rows()
    del no_fp32[0]["ours_vs_fp32_max"]
    assert verdict.v4_record_failures(no_fp32, CONFIG_RATIOS) == [
        "sparse_mla_decode layer 0: no fp32 reference rows recorded"]
    assert verdict.v4_record_failures([], CONFIG_RATIOS)


def test_v4_records_with_a_nan_figure_fail():
    """A NaN in SGLang's output or the reference makes a figure NaN, which no `>` comparison catches."""
    nan = float("nan")
    for fields in ({"rel_l2_max": nan}, {"ours_vs_fp32_max": nan}):
        (fail,) = verdict.v4_record_failures(_v4_rows({("sparse_mla_decode", 2): fields}), CONFIG_RATIOS)
        assert fail.startswith("sparse_mla_decode layer 2") and "nan" in fail
    (fail,) = verdict.v4_record_failures(_v4_rows({("indexer_topk", 1): {"overlap_min": nan}}), CONFIG_RATIOS)
    assert fail.startswith("indexer_topk layer 1")


def test_top_k_rows_with_a_repeated_slot_or_another_count_fail_however_large_the_overlap(tmp_path):
    for field, words in (("rows_with_repeats", "rows hold a slot twice"),
                         ("rows_selecting_another_count", "another number of slots")):
        (fail,) = verdict.v4_record_failures(_v4_rows({("indexer_topk", 1): {field: 2}}), CONFIG_RATIOS)
        assert fail.startswith("indexer_topk layer 1: 2 rows ") and words in fail
        topk = {"op": "indexer_topk", "layer": 0, "overlap_min": 1.0, "longest": 6032, field: 1}
        mla = {"op": "sparse_mla_decode", "layer": 0, "rel_l2_max": 2e-4, "nonfinite": 0, "ours_vs_fp32_max": 1e-3}
        (fail,) = verdict.record_failures([topk, mla])
        assert words in fail
    # The summary sums them where every record has them, and leaves them out of a summary of older records.
    base = {"op": "indexer_topk", "layer": 0, "rows": 2, "lengths": [600, 700], "overlap_min": 1.0,
            "overlap_mean": 1.0, "rows_identical_sets": 2}
    new = {**base, "rows_with_repeats": 1, "rows_selecting_another_count": 0}
    (tmp_path / "records-1.jsonl").write_text(json.dumps(new) + "\n" + json.dumps(new) + "\n")
    (row,) = diff.summarize_records(tmp_path)
    assert (row["rows_with_repeats"], row["rows_selecting_another_count"]) == (2, 0)
    (tmp_path / "records-2.jsonl").write_text(json.dumps(base) + "\n")
    (row,) = diff.summarize_records(tmp_path)
    assert "rows_with_repeats" not in row


@pytest.mark.parametrize("run", ["2026-12-06-h200x1", "2026-12-07-h100x1", "2026-12-07-h100x1-a2cfefc"])
def test_the_committed_gzipped_records_summarize_to_the_runs_own_summary(run):
    """The raw records of the committed V4 runs are kept gzipped (the working tree travels with every device call
    beside a wheel chunk); read back, they fold into exactly the summary the run wrote on the device."""
    on = HERE / "dsa" / "results" / run / "v4-on"
    (raw,) = sorted((on / "record" / "pdserve").glob("records-*.jsonl.gz"))
    assert not list((on / "record" / "pdserve").glob("records-*.jsonl"))
    summary = json.loads((on / "records-summary-pdserve.json").read_text(encoding="utf-8"))
    rows = summary["rows"] if isinstance(summary, dict) else summary
    assert diff.summarize_records(raw.parent) == rows


def test_the_records_summary_keeps_a_nan_wherever_it_falls(tmp_path):
    lines = [{"op": "sparse_mla_decode", "layer": 0, "rows": 4, "rel_l2": v, "rel_l2_worst_row": v, "max_abs": 0.1,
              "nonfinite": 0} for v in (1e-4, float("nan"), 2e-4)]
    (tmp_path / "records-1.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (row,) = diff.summarize_records(tmp_path)
    assert math.isnan(row["rel_l2_max"]) and math.isnan(row["rel_l2_worst_row"]) and row["max_abs"] == 0.1
    assert diff.worst([0.1, 0.3]) == 0.3 and diff.worst([]) is None


def test_v4_verdict_fails_nan_logprobs_off_against_on():
    ok = _result([-0.1, -0.2])
    nan_top = _result([-0.1, -0.2], top=[[[7, -0.1]], [[8, float("nan")]]])
    for other in (_result([-0.1, float("nan")]), nan_top, _result([-0.1, float("-inf")])):
        result = diff.compare_runs(_run([ok]), _run([other]))
        failures, _ = verdict.v4_verdict({}, None, None, result, CONFIG_RATIOS)
        assert any("NaN or infinite" in f for f in failures), other


def _run(results: list[dict]) -> dict:
    return {"compare": {"seed": 0, "prompt_lens": [10] * len(results), "max_new_tokens": 2,
                        "sets": {"sequential": results}}}


def _result(lps, ids=(7, 8), top=None):
    return {"output_ids": list(ids), "logprobs": list(lps),
            "top_logprobs": top or [[[t, lp]] for t, lp in zip(ids, lps, strict=True)]}


def test_the_gate_passes_identical_tensors_only():
    a = {"sequential": [_result([-0.5, -1.25]), _result([-0.1, -0.2], ids=(9, 9))], "batch": [_result([-0.5, -1.0])]}
    same = json.loads(json.dumps(a))  # what the server's JSON would give again
    gate = diff.repeat_check(a, same)
    assert verdict.gate_failures(gate) == [] and gate["sets"]["sequential"]["identical"] == 2
    # One logprob one ulp off, the tokens equal: the tensors differ.
    off = json.loads(json.dumps(a))
    off["sequential"][1]["logprobs"][1] = math.nextafter(-0.2, 0.0)
    gate = diff.repeat_check(a, off)
    (fail,) = verdict.gate_failures(gate)
    assert "1/2 differed (request 1: same tokens, chosen-token |dlogprob| up to 2.78e-17" in fail
    assert "None" not in fail
    # A top logprob alone differs.
    top = json.loads(json.dumps(a))
    top["sequential"][0]["top_logprobs"][0] = [[7, -0.5], [8, -3.0]]
    assert verdict.gate_failures(diff.repeat_check(a, top))
    # The all-in-one set is shown, not gated.
    batch = json.loads(json.dumps(a))
    batch["batch"][0]["logprobs"][0] = -0.6
    gate = diff.repeat_check(a, batch)
    assert verdict.gate_failures(gate) == [] and gate["sets"]["batch"]["identical"] == 0
    assert "| batch | 1 vs 2 | 0/1 | - | 0.1 | 0 | request 0: same tokens" in re.sub(r" +", " ", diff.gate_table(gate))
    with pytest.raises(ValueError, match="request set 'batch'"):
        diff.repeat_check(a, {"sequential": a["sequential"]})
    assert verdict.gate_failures({"sets": {}})


def test_a_gate_that_differs_at_the_first_token_says_so():
    """Diverging at token 0 leaves no shared prefix: the message gives the first token's top-logprob difference
    (the first GPU run printed "largest |dlogprob| None" there)."""
    a = {"sequential": [_result([-0.7, -1.0], ids=(7, 8), top=[[[7, -0.7], [9, -0.75]], [[8, -1.0]]])]}
    b = {"sequential": [_result([-0.72, -1.0], ids=(9, 8), top=[[[9, -0.72], [7, -0.75]], [[8, -1.0]]])]}
    gate = diff.repeat_check(a, b)
    row = gate["sets"]["sequential"]["rows"][0]
    assert row["first_divergence"] == 0 and row["max_abs_logprob_diff"] is None
    assert row["first_token_top_logprob_diff"] == pytest.approx(0.05)
    (fail,) = verdict.gate_failures(gate)
    assert "request 0: tokens differ from the first generated token on (no shared prefix); the top logprobs " \
           "there differ by up to 0.05;" in fail
    assert "largest |dlogprob| on a shared prefix - (none shared)" in fail and "None" not in fail


V4_RUN = HERE / "dsa" / "results" / "2026-12-06-h100x1" / "v4-gate-fail"


def test_the_first_gpu_runs_gate_is_what_the_comparator_computes_from_its_passes(capsys):
    """The 2026-12-06 H100 record: both passes' tensors (compare-sglang.json) give the recorded gate.json again,
    and the figures the README quotes."""
    run = json.loads((V4_RUN / "compare-sglang.json").read_text())["compare"]
    gate = diff.repeat_check(run["sets"], run["repeats"])
    recorded = json.loads((V4_RUN / "gate.json").read_text())
    for name, st in recorded["sets"].items():
        assert (gate["sets"][name]["identical"], gate["sets"][name]["max_abs_logprob_diff"]) == (
            st["identical"], st["max_abs_logprob_diff"])
        assert [r["first_divergence"] for r in gate["sets"][name]["rows"]] == [
            r["first_divergence"] for r in st["rows"]]
    seq, batch = gate["sets"]["sequential"], gate["sets"]["batch"]
    assert [r["first_divergence"] for r in seq["rows"]] == [0, 6, 9, 0]
    assert (round(seq["max_abs_logprob_diff"], 3), round(seq["max_first_token_top_logprob_diff"], 3)) == (0.36, 0.484)
    assert (round(batch["max_abs_logprob_diff"], 3), round(batch["max_first_token_top_logprob_diff"], 3)) == (
        0.446, 0.591)
    (fail,) = verdict.gate_failures(gate)
    assert "no shared prefix); the top logprobs there differ by up to 0.0603;" in fail
    assert diff.main([str(V4_RUN)]) == 0  # its directory offline: the gate's table (the run has no verdict to redo)
    assert "| sequential | 1 vs 2 | 0/4 | 0 | 0.36 | 0.484 | request 0: tokens differ from the first generated " \
           "token on" in _table(capsys.readouterr().out)


def _rows(set_name: str, *figures: tuple) -> list[dict]:
    """compare_runs rows of one set: (first divergence, chosen |dlogprob| on the shared prefix, first-token top)."""
    return [{"set": set_name, "request": i, "first_divergence": d, "max_abs_logprob_diff": chosen,
             "first_token_top_logprob_diff": first} for i, (d, chosen, first) in enumerate(figures)]


def _gate_set(*figures: tuple) -> dict:
    rows = [{**r, "identical": False} for r in _rows("x", *figures)]
    return {"requests": len(rows), "identical": 0, **diff.set_figures(rows), "rows": rows}


def test_the_floor_rule_passes_and_fails():
    # SGLang repeated itself (floor 0): the DSA tier's 0.5 holds.
    gate = {"sets": {"sequential": _gate_set((None, 0.0, 0.0))}}
    assert verdict.noise_floors(gate) == {"sequential": 0.0}
    assert verdict.logprob_floor_failures({"rows": _rows("sequential", (3, 0.49, 0.2))}, gate) == ([], [])
    (fail,), _ = verdict.logprob_floor_failures({"rows": _rows("sequential", (3, 0.51, 0.2))}, gate)
    assert "largest logprob difference 0.5100 > 0.5000" in fail
    # A floor of 0.3 (its first-token top logprobs, the larger figure) allows 0.6, per set.
    gate = {"sets": {"sequential": _gate_set((0, None, 0.3), (4, 0.2, 0.1)), "batch": _gate_set((None, 0.0, 0.0))}}
    assert verdict.noise_floors(gate) == {"sequential": 0.3, "batch": 0.0}
    off_on = {"rows": _rows("sequential", (0, None, 0.59), (5, 0.4, 0.1)) + _rows("batch", (2, 0.45, 0.3))}
    assert verdict.logprob_floor_failures(off_on, gate) == ([], [])
    off_on = {"rows": _rows("sequential", (0, None, 0.61)) + _rows("batch", (2, 0.55, 0.3))}
    fails, notes = verdict.logprob_floor_failures(off_on, gate)
    assert [f.split(":")[0] for f in fails] == ["plugin off against on, sequential requests",
                                                "plugin off against on, batch requests"]
    assert "0.6100 > 0.6000 (the larger of 0.5 and 2 x SGLang's own noise floor 0.3000)" in fails[0] and not notes
    # A set the gate did not measure has floor 0; a floor of 0.5 or more makes the limit a whole nat: a note.
    gate = {"sets": {"sequential": _gate_set((0, None, 0.55))}}
    fails, (note,) = verdict.logprob_floor_failures({"rows": _rows("sequential", (1, 1.05, 0.2))}, gate)
    assert fails == [] and note.startswith("sequential requests: SGLang's own noise floor 0.5500 makes the logprob "
                                           "limit 1.1000 nats") and "only the per-layer records judge" in note
    (fail,), _ = verdict.logprob_floor_failures({"rows": _rows("batch", (1, 0.7, 0.2))}, gate)
    assert fail.startswith("plugin off against on, batch requests: largest logprob difference 0.7000 > 0.5000")


def test_the_first_gpu_runs_floor_and_what_it_would_allow():
    """The 2026-12-06 run's passes as a floor: what the next run's off-against-on logprobs will be held to."""
    run = json.loads((V4_RUN / "compare-sglang.json").read_text())["compare"]
    gate = diff.repeat_check(run["sets"], run["repeats"])
    floors = verdict.noise_floors(gate)
    assert (round(floors["sequential"], 3), round(floors["batch"], 3)) == (0.484, 0.591)
    # pdserve's off-against-on figures equal to SGLang's own noise pass; 2.1x the noise fails both sets.
    as_noise = {"rows": [{"set": n, **r} for n, st in gate["sets"].items() for r in st["rows"]]}
    fails, notes = verdict.logprob_floor_failures(as_noise, gate)
    assert fails == [] and [n.split(":")[0] for n in notes] == ["batch requests"]  # 2 x 0.591 > 1 nat
    beyond = {"rows": [{**r, "first_token_top_logprob_diff": 2.1 * r["first_token_top_logprob_diff"]}
                        for r in as_noise["rows"]]}
    fails, _ = verdict.logprob_floor_failures(beyond, gate)
    assert [f.split(":")[0] for f in fails] == ["plugin off against on, sequential requests",
                                                "plugin off against on, batch requests"]


def test_the_v4_verdict_strict_or_not():
    both = {"indexer_topk": "pdserve", "sparse_mla_decode": "pdserve"}
    off_ops = {"indexer_topk": "sglang", "sparse_mla_decode": "sglang"}
    runs = {"sglang": {"plugin": {"status": [{"kernels": off_ops, "model": "deepseek_v4"}], "ran": [], "fallback": []},
                       "tree_cache_impl": "SWAChunkCache", "argv": ["--disable-radix-cache"]},
            "pdserve": {"plugin": {"status": [{"kernels": both, "model": "deepseek_v4"}], "fallback": [],
                                   "ran": [{"op": "indexer_topk"}, {"op": "sparse_mla_decode"}]},
                        "tree_cache_impl": "SWAChunkCache", "argv": ["--disable-radix-cache"]}}
    gate = {"sets": {"sequential": _gate_set((0, None, 0.1))}}
    result = {"rows": _rows("sequential", (2, 0.3, 0.1))}
    fails, (note,) = verdict.v4_verdict(runs, gate, _v4_rows(), result, CONFIG_RATIOS)
    assert fails == [] and note.startswith("SGLang did not repeat itself (not required without --strict-gate): "
                                           "SGLang's own server (plugin off) served")
    (fail,), notes = verdict.v4_verdict(runs, gate, _v4_rows(), result, CONFIG_RATIOS, strict_gate=True)
    assert fail.startswith("repeatability gate:") and notes == []
    # The records are judged whatever the gate says.
    bad = _v4_rows({("sparse_mla_decode", 1): {"rel_l2_max": 0.5}})
    (fail,), _ = verdict.v4_verdict(runs, gate, bad, result, CONFIG_RATIOS)
    assert fail.startswith("sparse_mla_decode layer 1: rel L2 0.5")
    (fail,), _ = verdict.v4_verdict(runs, gate, None, result, CONFIG_RATIOS)
    assert fail.startswith("no records were written")
    # One call's files: what it has is judged, and the note says what it lacks.
    fails, (note,) = verdict.v4_verdict({"pdserve": runs["pdserve"]}, None, _v4_rows(), None, CONFIG_RATIOS)
    assert fails == [] and note.startswith("only pdserve server in these files: no comparison off against on")


def test_prefix_cache_and_plugin_model_checks():
    assert verdict.prefix_cache_failures("SWAChunkCache", radix_cache=False) == []
    assert verdict.prefix_cache_failures("UnifiedRadixCache", radix_cache=False)
    assert verdict.prefix_cache_failures("UnifiedRadixCache", radix_cache=True) == []
    assert verdict.prefix_cache_failures(None, radix_cache=False) == []  # not logged: nothing to judge
    both = {"indexer_topk": "pdserve", "sparse_mla_decode": "pdserve"}
    plugin = {"status": [{"kernels": both, "model": "deepseek_v4"}],
              "ran": [{"op": "indexer_topk"}, {"op": "sparse_mla_decode"}], "fallback": []}
    assert verdict.plugin_failures("pdserve", plugin, model="deepseek_v4") == []
    v32 = {**plugin, "status": [{"kernels": both, "model": "deepseek_v32"}]}
    assert verdict.plugin_failures("pdserve", v32, model="deepseek_v4") == [
        "[pdserve] a status line from a 'deepseek_v32' backend, expected 'deepseek_v4'"]


# --- the driver end to end, on a CPU stand-in of launch_server ----------------------------------------


def _standin_env(tmp_path, **extra) -> dict[str, str]:
    from tests.gpu.dsa.standin_server import launch_env

    return {**launch_env(tmp_path), **extra}


def _drive(tmp_path, *more, **env) -> tuple[subprocess.CompletedProcess, Path]:
    from tests.fixtures.ports import free_ports

    model = tmp_path / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(CONFIG))
    out = tmp_path / "out"
    (port,) = free_ports(1)
    argv = [sys.executable, str(compare.__file__), "--arch", "v4", "--model", str(model), "--out", str(out),
            "--port", str(port), "--ready-timeout", "60", "--request-timeout", "30", "--prompt-lens", "2100,2201",
            "--max-new-tokens", "6", *more]
    done = subprocess.run(argv, env=_standin_env(tmp_path, **env), capture_output=True, text=True, timeout=240)
    print(done.stdout[-3000:], done.stderr[-3000:])
    return done, out


def _table(text: str) -> str:
    return re.sub(r" +", " ", text)


def test_v4_driver_end_to_end_on_a_standin_server(tmp_path):
    done, out = _drive(tmp_path)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("PASS") and "NOTE" not in done.stdout
    gate = json.loads((out / "gate.json").read_text())
    assert gate["gated"] == "2 vs 3" and len(gate["pass_s"]) == 3  # a warm-up, then the two compared passes
    assert {k: (v["identical"], v["requests"]) for k, v in gate["sets"].items()} == {"sequential": (2, 2),
                                                                                      "batch": (2, 2)}
    assert {k: v["identical"] for k, v in gate["warmup"].items()} == {"sequential": 2, "batch": 2}
    assert gate["floor"] == {"sequential": 0.0, "batch": 0.0}
    off = json.loads((out / "compare-sglang.json").read_text())
    on = json.loads((out / "compare-pdserve.json").read_text())
    assert set(off["compare"]["repeats"]) == {"sequential", "batch"} and "repeats" not in on["compare"]
    assert "warmup" in on["compare"] and len(on["compare"]["pass_s"]) == 2  # pdserve's server warms up too
    assert "repeat" not in on["compare"]  # no third pass under the recorder
    assert off["arch"] == on["arch"] == "v4" and on["model_config"]["compress_ratios"] == CONFIG["compress_ratios"]
    assert off["tree_cache_impl"] == on["tree_cache_impl"] == "SWAChunkCache"
    assert "--disable-radix-cache" in off["argv"] and off["env"]["SGLANG_OPT_FP8_WO_A_GEMM"] == "0"
    assert [s["model"] for s in on["plugin"]["status"]] == ["deepseek_v4"]
    summary = json.loads((out / "records-summary-pdserve.json").read_text())["rows"]
    assert sorted((r["op"], r["layer"]) for r in summary) == [("indexer_topk", 1), ("indexer_topk", 3),
                                                              *[("sparse_mla_decode", i) for i in range(4)]]
    assert json.loads((out / "records-summary-sglang.json").read_text())["rows"] == []
    result = json.loads((out / "diff.json").read_text())
    assert result["requests"] == 4 and result["max_abs_logprob_diff"] == pytest.approx(1e-4, rel=0.01)
    assert "| sequential | 2 vs 3 | 2/2 |" in _table(done.stdout)  # the gate's table, printed
    assert "| sequential | 1 (warm-up) vs 2 | 2/2 |" in _table(done.stdout)
    assert "passes " in done.stdout and "(the first a warm-up)" in done.stdout


def test_v4_warmup_pass_absorbs_a_server_that_settles(tmp_path):
    """A server whose first pass differs (JIT, autotuning) and which then repeats itself: the gate compares passes
    2 and 3 and shows the warm-up's difference beside them; without the warm-up the same server does not repeat."""
    done, out = _drive(tmp_path / "warm", STANDIN_SETTLE_AFTER="4")  # 2 prompts one at a time + 2 in one call
    assert done.returncode == 0 and "NOTE" not in done.stdout
    gate = json.loads((out / "gate.json").read_text())
    assert gate["sets"]["sequential"]["identical"] == 2 and gate["warmup"]["sequential"]["identical"] == 0
    assert gate["warmup"]["sequential"]["max_abs_logprob_diff"] == pytest.approx(0.01)
    assert "| sequential | 1 (warm-up) vs 2 | 0/2 | - | 0.01 | 0.01 | request 0: same tokens" in _table(done.stdout)
    done, out = _drive(tmp_path / "cold", "--no-warmup", STANDIN_SETTLE_AFTER="4")
    gate = json.loads((out / "gate.json").read_text())
    assert gate["gated"] == "1 vs 2" and "warmup" not in gate and gate["sets"]["sequential"]["identical"] == 0
    # Not --strict-gate: recorded, said plainly, not a failure; pdserve's server ran and was judged.
    assert done.returncode == 0 and "NOTE: SGLang did not repeat itself (not required without --strict-gate)" \
        in done.stdout and (out / "records-summary-pdserve.json").exists()


def test_v4_driver_goes_on_past_a_gate_that_differs_and_judges_against_the_floor(tmp_path):
    done, out = _drive(tmp_path, STANDIN_NOT_REPEATABLE="first-token")
    gate = json.loads((out / "gate.json").read_text())
    assert gate["sets"]["sequential"]["identical"] == 0 and gate["sets"]["sequential"]["first_divergence"] == 0
    assert gate["floor"] == {"sequential": pytest.approx(0.2), "batch": pytest.approx(0.1)}
    assert "STOP" not in done.stdout and (out / "server-pdserve.log").exists() and (out / "diff.json").exists()
    assert "[sglang] did not repeat itself; noise floor per set: sequential 0.2, batch 0.1; going on" in done.stdout
    note = next(line for line in done.stdout.splitlines() if line.startswith("NOTE: SGLang did not repeat itself"))
    assert ("SGLang's own server (plugin off) served the same requests twice and 2/2 differed (request 0: same "
            "tokens, chosen-token |dlogprob| up to 0.05, top logprobs at token 0 up to 0.1; over the set: tokens "
            "first diverge at token 0, largest |dlogprob| on a shared prefix 0.05, top logprobs at token 0 up to 0.2)"
            ) in note
    assert "bounded only by that floor" in note and "the proof is the per-layer records" in note
    assert "FAIL" not in done.stdout and done.stdout.rstrip().endswith("PASS") and done.returncode == 0


def test_v4_driver_fails_a_plugin_beyond_the_floor(tmp_path):
    done, _ = _drive(tmp_path, STANDIN_NOT_REPEATABLE="first-token", STANDIN_PDSERVE_SHIFT="1.5")
    assert done.returncode == 1
    fails = [line for line in done.stdout.splitlines() if line.startswith("FAIL: ")]
    assert fails == [
        "FAIL: plugin off against on, sequential requests: largest logprob difference 1.5000 > 0.5000 (the larger "
        "of 0.5 and 2 x SGLang's own noise floor 0.2000)",
        "FAIL: plugin off against on, batch requests: largest logprob difference 1.5000 > 0.5000 (the larger "
        "of 0.5 and 2 x SGLang's own noise floor 0.1000)"]


def test_v4_strict_gate_stops_when_sglang_does_not_repeat_itself(tmp_path):
    done, out = _drive(tmp_path, "--strict-gate", STANDIN_NOT_REPEATABLE="1")
    assert done.returncode == 1
    assert "STOP: SGLang's own server did not repeat itself on the same inputs and --strict-gate" in done.stdout
    assert ("FAIL: repeatability gate: SGLang's own server (plugin off) served the same requests twice and "
            "2/2 differed (request 0: same tokens") in done.stdout
    assert not (out / "server-pdserve.log").exists() and not (out / "diff.json").exists()
    gate = json.loads((out / "gate.json").read_text())
    assert gate["sets"]["sequential"]["identical"] == 0
    assert gate["sets"]["sequential"]["rows"][0]["tokens_equal"]  # same tokens, other logprobs: tensors differ


def test_v4_two_calls_judged_offline_together(tmp_path):
    """The documented default on the device: plugin off in one call, plugin on in the next, then diff.py over the
    two calls' output directories gives compare.py's whole verdict."""
    off, out1 = _drive(tmp_path / "c1", "--kernels", "sglang", STANDIN_NOT_REPEATABLE="first-token")
    assert off.returncode == 0 and (out1 / "gate.json").exists() and not (out1 / "diff.json").exists()
    assert "only sglang server in these files" in off.stdout
    on, out2 = _drive(tmp_path / "c2", "--kernels", "pdserve", STANDIN_NOT_REPEATABLE="first-token")
    assert on.returncode == 0 and "no repeatability gate and no plugin-off comparison in this call" in on.stdout
    bad, out3 = _drive(tmp_path / "c3", "--kernels", "pdserve", STANDIN_NOT_REPEATABLE="first-token",
                       STANDIN_PDSERVE_SHIFT="1.5")
    assert bad.returncode == 0  # alone it has nothing to compare its logprobs with

    def offline(*paths: Path, strict: bool = False) -> subprocess.CompletedProcess:
        # As a script, with no PYTHONPATH: diff.py finds verdict.py itself.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        argv = [sys.executable, str(Path(diff.__file__)), *map(str, paths), *(["--strict-gate"] if strict else [])]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)

    done = offline(out1, out2)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| sequential | 2 vs 3 | 0/2 |" in _table(done.stdout) and "| indexer_topk | 1 |" in _table(done.stdout)
    assert "NOTE: SGLang did not repeat itself" in done.stdout and done.stdout.rstrip().endswith("PASS")
    done = offline(out1, out3)
    assert done.returncode == 1 and "FAIL: plugin off against on, sequential requests" in done.stdout
    done = offline(out1, out2, strict=True)
    assert done.returncode == 1 and "FAIL: repeatability gate" in done.stdout
    # The plugin-off call's directory twice (a plugin-on call that left nothing): no pass.
    done = offline(out1, out1)
    assert done.returncode == 1 and "FAIL: no pdserve server's compare record: the plugin-on run" in done.stdout
    done = offline(out2, out2)
    assert done.returncode == 1 and "FAIL: no sglang server's compare record: the plugin-off run" in done.stdout


def test_real_safetensors_and_transformers_read_the_directory(small_model, hf_config_alias):
    """Where the Hugging Face libraries are importable, they read what the device's SGLang will: the config
    through SGLang's deepseek_v4 alias of DeepseekV3Config (whose own head_dim default the json overrides, and
    whose unknown keys survive as attributes), every tensor through safetensors at its dtype."""
    from safetensors import safe_open

    config = hf_config_alias("deepseek_v4").from_pretrained(str(small_model))
    assert (config.head_dim, config.num_key_value_heads, config.index_topk) == (512, 1, 512)
    assert (config.compress_ratios, config.sliding_window, config.num_hash_layers) == ([0, 4, 128, 4], 128, 0)
    assert (config.o_groups, config.hc_mult) == (8, 4)
    expected = json.loads((small_model / "config.json").read_text())
    specs = {s.name: s for s in checkpoint_spec(expected)}
    with safe_open(str(small_model / "model.safetensors"), framework="pt") as f:
        assert set(f.keys()) == set(specs)
        for name in ("model.layers.3.self_attn.indexer.compressor.norm.weight", "model.layers.2.self_attn.wo_a.weight"):
            t = f.get_tensor(name)
            assert str(t.dtype) == f"torch.{specs[name].dtype}" and t.equal(make_v4_tensor(specs[name], 0))
