"""What the GPU tier feeds SGLang, checked on the CPU: the tiny model directory and the deployment."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys

import pytest

from pdserve.check.parsers import check_with_parsers
from pdserve.render.argv import launches
from pdserve.render.toolchain import Toolchain
from pdserve.schema import pins
from pdserve.schema.loading import load
from tests.conftest import require_or_skip
from tests.gpu.pd_run import TEST_SERVER_FLAGS, write_api_key, write_deployment
from tests.gpu.tiny_model import CHAT_TEMPLATE, make_tiny_model

PORTS = {"prefill": 31000, "decode": 31002, "router": 31001, "bootstrap": 31998, "prometheus": 31900}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    require_or_skip(importlib.util.find_spec("tokenizers") is not None, "the tokenizers package is not installed",
                    "PDSERVE_REQUIRE_PARSERS")
    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


def test_tiny_model_is_a_consistent_llama_directory(tiny):
    from tokenizers import Tokenizer

    config = json.loads((tiny / "config.json").read_text())
    tokenizer = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["vocab_size"] == tokenizer.get_vocab_size()
    assert config["num_attention_heads"] * config["head_dim"] == config["hidden_size"]
    assert config["eos_token_id"] == tokenizer.token_to_id("</s>")
    text = "say hello to the router"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
    # The trained merges compress the corpus words: far fewer tokens than bytes.
    assert len(tokenizer.encode(text).ids) < len(text) // 2


def test_chat_template_renders_a_generation_prompt(tiny):
    import jinja2

    template = json.loads((tiny / "tokenizer_config.json").read_text())["chat_template"]
    assert template == CHAT_TEMPLATE
    out = jinja2.Template(template).render(messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert out == "<|user|>hi</s><|assistant|>"


def test_two_gpu_deployment_loads_and_renders_the_test_flags(tmp_path):
    config = write_deployment(tmp_path, tmp_path / "tiny", PORTS, numa_node=0)
    loaded = load(config)
    assert loaded.warnings == []
    tools = Toolchain(sglang_python=sys.executable, numactl="/usr/bin/numactl", pdserve="/usr/bin/pdserve")
    argv = {role: launch.argv for role, launch in launches(loaded.deployment, tools).items()}
    assert argv["prefill"][:4] == ("/usr/bin/numactl", "--cpunodebind=0", "--membind=0", "--")
    for role in ("prefill", "decode"):
        joined = " ".join(argv[role])
        assert " ".join(TEST_SERVER_FLAGS) in joined
        assert f"--disaggregation-mode {role} --disaggregation-transfer-backend nixl" in joined
    assert "--pd-disaggregation" in argv["router"]


def test_one_gpu_deployment_shares_gpu_0_and_keys_the_router(tmp_path):
    key = write_api_key(tmp_path)
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_text().strip()) >= 24
    loaded = load(write_deployment(tmp_path, tmp_path / "tiny", PORTS, numa_node=None, gpus=1, api_key_file=key))
    assert loaded.warnings == []
    dep = loaded.deployment
    assert dep.allow_shared_gpus and dep.prefill.gpus == dep.decode.gpus == dep.fallback.gpus == [0]
    tools = Toolchain(sglang_python=sys.executable, numactl="/usr/bin/numactl", pdserve="/usr/bin/pdserve")
    run = launches(dep, tools)
    assert run["router"].credentials == {"api-key": str(key)}
    assert run["router"].argv[1:5] == (tools.keyed_launcher, "router", "api-key", "--")
    assert key.read_text().strip() not in " ".join(run["router"].argv)
    # The workers take no key: they listen on loopback only and the router holds it.
    assert run["prefill"].credentials == run["decode"].credentials == {}


def test_test_flags_pass_the_pinned_sglang_parser(tmp_path):
    have = all(importlib.util.find_spec(m) is not None for m in ("sglang", "smg"))
    require_or_skip(have, "sglang and smg are not installed in this Python", "PDSERVE_REQUIRE_PARSERS")
    installed = importlib.metadata.version("sglang")
    if installed != pins.SGLANG_VERSION:
        # The GPU machines run the release that matches their torch; its parser reads the model directory.
        pytest.skip(f"sglang {installed} is installed; this checks the pinned parser ({pins.SGLANG_VERSION})")
    deployment = load(write_deployment(tmp_path, tmp_path / "tiny", PORTS, numa_node=None)).deployment
    report = check_with_parsers(deployment, sys.executable)
    assert report.problems == [] and sorted(report.checked) == ["decode", "fallback", "prefill", "router"]
