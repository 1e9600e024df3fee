"""What each role runs, as rendered for the reference deployment and for edits of it."""

from __future__ import annotations

from pdserve.render.argv import launch, launches, router_args, server_args
from pdserve.schema.loading import deployment_from_data
from pdserve.schema.placement import place


def flag_value(args, flag):
    return args[args.index(flag) + 1]


def test_parsers_on_both_servers_and_never_on_the_router(reference):
    for role in ("prefill", "decode", "fallback"):
        args = server_args(reference, role)
        assert flag_value(args, "--reasoning-parser") == "deepseek-v4"
        assert flag_value(args, "--tool-call-parser") == "deepseekv4"
    router = router_args(reference)
    assert not any("parser" in arg for arg in router)
    assert "--model-path" not in router  # it would make the router fetch a tokenizer


def test_worker_placement_and_pd_flags(reference):
    prefill = server_args(reference, "prefill")
    decode = server_args(reference, "decode")
    assert (flag_value(prefill, "--tp-size"), flag_value(prefill, "--base-gpu-id")) == ("4", "0")
    assert (flag_value(decode, "--tp-size"), flag_value(decode, "--base-gpu-id")) == ("4", "4")
    assert flag_value(prefill, "--disaggregation-mode") == "prefill"
    assert flag_value(decode, "--disaggregation-mode") == "decode"
    assert flag_value(prefill, "--disaggregation-transfer-backend") == "nixl"
    # Only the prefill binds the bootstrap port.
    assert flag_value(prefill, "--disaggregation-bootstrap-port") == "8998"
    assert "--disaggregation-bootstrap-port" not in decode
    assert flag_value(prefill, "--host") == "127.0.0.1"
    assert "--gpu-id-step" not in prefill


def test_fallback_is_a_plain_server_on_the_router_port(reference):
    args = server_args(reference, "fallback")
    assert not any(arg.startswith("--disaggregation") for arg in args)
    assert flag_value(args, "--port") == "30001"
    assert flag_value(args, "--tp-size") == "8"


def test_fallback_listens_where_the_file_says_else_where_the_router_does(reference_data):
    reference_data["router"]["host"] = "0.0.0.0"
    reference_data["fallback"]["port"] = 30100
    dep = deployment_from_data(reference_data, "t").deployment
    (fallback,) = place(dep).of_role("fallback")
    assert (fallback.listen_host, fallback.port) == ("0.0.0.0", 30100)   # host from the router, port its own
    args = server_args(dep, "fallback")
    assert (flag_value(args, "--host"), flag_value(args, "--port")) == ("0.0.0.0", "30100")
    assert flag_value(args, "--tp-size") == "8" and fallback.spec is dep.fallback
    (decode,) = place(dep).of_role("decode")
    assert (decode.listen_host, decode.port) == ("127.0.0.1", 30002) and decode.spec is dep.decode


def test_router_targets_workers_with_bootstrap_port(reference):
    args = router_args(reference)
    assert args[0] == "--pd-disaggregation"
    i = args.index("--prefill")
    assert args[i + 1 : i + 3] == ["http://127.0.0.1:30000", "8998"]
    assert flag_value(args, "--decode") == "http://127.0.0.1:30002"
    assert flag_value(args, "--port") == "30001"
    assert flag_value(args, "--prometheus-port") == "29000"
    assert flag_value(args, "--health-check-timeout-secs") == "30"


def test_gpu_step_rendered_for_spaced_gpus(reference_data):
    reference_data["prefill"]["gpus"] = [0, 2, 4, 6]
    reference_data["decode"]["gpus"] = [1, 3, 5, 7]
    dep = deployment_from_data(reference_data, "t").deployment
    args = server_args(dep, "decode")
    assert (flag_value(args, "--base-gpu-id"), flag_value(args, "--gpu-id-step")) == ("1", "2")


def test_numa_binding_wraps_workers_only(reference, tools):
    runs = launches(reference, tools)
    assert runs["prefill"].argv[:4] == ("/usr/bin/numactl", "--cpunodebind=0", "--membind=0", "--")
    assert runs["decode"].argv[:4] == ("/usr/bin/numactl", "--cpunodebind=1", "--membind=1", "--")
    assert runs["router"].argv[0] == "/opt/sglang/bin/python"
    assert runs["fallback"].argv[0] == "/opt/sglang/bin/python"  # spans both nodes: not bound
    assert runs["prefill"].argv[4:7] == ("/opt/sglang/bin/python", "-m", "sglang.launch_server")
    assert runs["router"].argv[1:3] == ("-m", "smg.launch_router")


def test_environment_is_pinned_and_per_role(reference_data, tools):
    reference_data["decode"]["env"] = {"NCCL_DEBUG": "INFO"}
    dep = deployment_from_data(reference_data, "t").deployment
    runs = launches(dep, tools)
    assert runs["prefill"].env["UCX_TLS"] == "cuda_copy,cuda_ipc,tcp"
    assert runs["prefill"].env["NCCL_DEBUG"] == "WARN"
    assert runs["decode"].env["NCCL_DEBUG"] == "INFO"  # the role's own value wins
    assert "UCX_TLS" not in runs["router"].env


def test_api_key_goes_through_a_credential_never_argv(reference_data, tools):
    reference_data["router"]["api_key_file"] = "/etc/pdserve/router.key"
    dep = deployment_from_data(reference_data, "t").deployment
    for role in ("router", "fallback"):
        run = launch(dep, role, tools)
        assert run.credentials == {"api-key": "/etc/pdserve/router.key"}
        assert run.argv[1:5] == (tools.keyed_launcher, "router" if role == "router" else "server", "api-key", "--")
        assert not any("key" in arg.lower() for arg in run.argv[5:])
    assert launch(dep, "prefill", tools).credentials == {}


def test_mem_fraction_static_reaches_the_flag_as_the_same_float(reference_data):
    # `:g` once rendered 0.9999999999999999 as 1 and 0.1234567 as 0.123457: the flag must read back exactly.
    for fraction in (0.9999999999999999, 0.1234567, 0.85):
        reference_data["decode"]["mem_fraction_static"] = fraction
        dep = deployment_from_data(reference_data, "t").deployment
        assert float(flag_value(server_args(dep, "decode"), "--mem-fraction-static")) == fraction
