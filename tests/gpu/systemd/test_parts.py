"""The systemd GPU tier's pure and local parts, on the CPU (CI): the rootfs manifest and its trimming, the
payload's pins, parts and reassembly, what the container is given (binds, devices, loader), the drop-ins,
the phase reader and the failure timing. What needs the GPU runs only through run_on_device.sh."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from pdserve.render.argv import SYSTEM_PATH
from tests.gpu.load import Outcome
from tests.gpu.systemd import dropins, host, payload, phases, rootfs, runner, table

# -- rootfs ----------------------------------------------------------------------------------------------

def _touch(root, relative: str, size: int = 10) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


def test_trim_cuts_docs_lto_and_sanitizers_but_keeps_what_the_runner_runs(tmp_path):
    cut = ["usr/share/doc/gcc/README", "usr/share/man/man1/cc.1.gz", "usr/libexec/gcc/x86_64-linux-gnu/14/lto1",
           "usr/lib/x86_64-linux-gnu/libasan.so.8.0.0", "var/lib/apt/lists/deb.debian.org_Packages"]
    kept = [host.LOADER, "usr/bin/systemd-nspawn", "usr/lib/x86_64-linux-gnu/systemd/libsystemd-shared-257.so",
            "usr/libexec/gcc/x86_64-linux-gnu/14/cc1", "usr/bin/x86_64-linux-gnu-gcc-14", "usr/lib/systemd/systemd",
            "usr/lib/x86_64-linux-gnu/libc.so.6", "usr/share/doc-base/keep"]
    for path in cut + kept:
        _touch(tmp_path, path, 100)
    freed = rootfs.trim(tmp_path)
    assert freed == 100 * len(cut)
    assert [p for p in cut if (tmp_path / p).exists()] == []
    assert [p for p in kept if not (tmp_path / p).exists()] == []


def test_the_manifest_holds_what_the_runner_needs_from_the_rootfs():
    # nspawn comes from the rootfs (the GPU machine has none), cc for Triton's launcher, numactl for ExecStart=.
    for package in ("systemd", "systemd-container", "gcc", "g++", "libc6-dev", "numactl", "dbus", "libbpf1"):
        assert package in rootfs.PACKAGES
    assert rootfs.SUITE == "trixie"


# -- payload ---------------------------------------------------------------------------------------------

def test_payload_pins_add_both_routers_and_replace_a_pin_of_the_same_distribution():
    pins = payload.payload_pins("sglang==0.5.17\nsglang-router==0.3.1\n\nxgrammar==0.2.1\n")
    lines = pins.splitlines()
    assert lines == ["sglang==0.5.17", "xgrammar==0.2.1", "smg==1.13.0", "sglang_router==0.3.2"]


@pytest.mark.parametrize("total,limit,expected", [
    (0, 5, []), (5, 5, [(0, 5)]), (11, 5, [(0, 5), (5, 5), (10, 1)]), (4, 5, [(0, 4)])])
def test_part_bounds_cover_the_stream_exactly(total, limit, expected):
    assert payload.part_bounds(total, limit) == expected


def test_part_bounds_refuse_an_empty_part():
    with pytest.raises(ValueError, match="at least one byte"):
        payload.part_bounds(10, 0)


def test_split_then_reassemble_gives_the_stream_back_and_a_bad_part_is_named(tmp_path):
    stream = tmp_path / "stream"
    data = os.urandom(3 * 1000 + 17)
    stream.write_bytes(data)
    parts_dir = tmp_path / "parts"
    parts_dir.mkdir()
    parts = payload.split(stream, parts_dir, 1000)
    assert [p.size for p in parts] == [1000, 1000, 1000, 17]
    manifest = json.loads((parts_dir / payload.MANIFEST).read_text())
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    joined = tmp_path / "joined"
    payload.reassemble(manifest, parts_dir, joined)
    assert joined.read_bytes() == data
    broken = parts_dir / parts[1].name
    data = broken.read_bytes()
    broken.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])  # a constant byte would match one run in 256
    (parts_dir / parts[3].name).unlink()
    problems = payload.missing_or_bad(manifest, parts_dir)
    assert problems == [f"{parts[1].name}: SHA-256 differs from the manifest's (a broken transfer)",
                        f"{parts[3].name}: missing (stage it: one device call per part)"]
    with pytest.raises(SystemExit, match="not usable"):
        payload.reassemble(manifest, parts_dir, joined)


@pytest.mark.skipif(shutil.which("zstd") is None, reason="zstd is not installed (apt-get install zstd)")
def test_pack_and_unpack_round_trip_through_tar_and_zstd(tmp_path):
    source = tmp_path / "tree"
    _touch(source, "rootfs/usr/bin/tool", 300)
    _touch(source, "site/pkg/__init__.py", 20)
    (source / "rootfs/usr/bin/tool").chmod(0o755)
    stream = tmp_path / "payload.tar.zst"
    payload.pack(source, ["rootfs", "site"], stream, threads=1)
    dest = tmp_path / "dest"
    payload.unpack(stream, dest)
    assert (dest / "rootfs/usr/bin/tool").read_bytes() == b"x" * 300
    assert os.access(dest / "rootfs/usr/bin/tool", os.X_OK)
    assert (dest / "site/pkg/__init__.py").exists()


# -- what the container is given -------------------------------------------------------------------------

def _layout(**changes) -> host.PythonLayout:
    base = dict(executable="/usr/bin/python3.12",
                links=("/opt/torch/.venv/bin/python3", "/opt/torch/.venv/bin/python", "/usr/bin/python3"),
                prefix="/opt/torch/.venv", base_prefix="/usr",
                stdlib="/usr/lib/python3.12", include="/usr/include/python3.12",
                multiarch_include="/usr/include/x86_64-linux-gnu/python3.12",
                path_entries=("/usr/lib/python3.12", "/usr/lib/python3.12/lib-dynload",
                              "/opt/torch/.venv/lib/python3.12/site-packages"))
    return host.PythonLayout(**{**base, **changes})


def test_python_binds_are_the_interpreters_own_files_and_headers_outermost_only():
    assert host.python_binds(_layout()) == [
        "/opt/torch/.venv", "/usr/bin/python3", "/usr/bin/python3.12", "/usr/include/python3.12",
        "/usr/include/x86_64-linux-gnu/python3.12", "/usr/lib/python3.12"]


def test_python_binds_refuse_a_system_directory():
    with pytest.raises(ValueError, match="/usr"):
        host.python_binds(_layout(prefix="/usr"))


def test_the_link_chain_names_every_symlink_on_the_way_to_the_interpreter(tmp_path):
    (tmp_path / "python3.12").write_text("")
    (tmp_path / "python3").symlink_to("python3.12")
    venv = tmp_path / "venv/bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(tmp_path / "python3")
    (venv / "python3").symlink_to("python")
    assert host.link_chain(str(venv / "python3")) == [str(venv / "python3"), str(venv / "python"),
                                                      str(tmp_path / "python3")]


def test_driver_dirs_come_from_ldconfig_and_ignore_32_bit_copies():
    text = ("\tlibcuda.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libcuda.so.1\n"
            "\tlibcuda.so.1 (libc6) => /usr/lib32/libcuda.so.1\n"
            "\tlibcuda.so.1 (libc6,x86-64) => /lib/libcuda.so.1\n"
            "\tlibnvidia-ml.so.1 (libc6,x86-64) => /opt/driver/libnvidia-ml.so.1\n"
            "\tlibcudart.so.13 (libc6,x86-64) => /opt/cuda/lib64/libcudart.so.13\n")
    # /lib too holds the driver on the GPU machine; bound over the rootfs's it would replace its C library.
    assert host.driver_dirs(text) == ["/opt/driver", "/usr/local/nvidia/lib64"]


def test_a_driver_only_in_system_directories_is_refused():
    with pytest.raises(ValueError, match="system directories"):
        host.driver_dirs("\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n")


def test_missing_libraries_are_read_from_ldd():
    text = ("/usr/lib/python3.12/lib-dynload/_decimal.cpython-312-x86_64-linux-gnu.so:\n"
            "\tlibmpdec.so.3 => not found\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x7f)\n"
            "/usr/bin/python3.12:\n\tlibexpat.so.1 => not found\n\tlibmpdec.so.3 => not found\n")
    assert host.missing_libraries(text) == ["libexpat.so.1", "libmpdec.so.3"]


def test_nspawn_gets_each_device_read_write_and_everything_else_read_only(tmp_path):
    facts = host.HostFacts(python=_layout(), devices=("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"),
                           driver_dirs=("/usr/local/nvidia/lib64",), site="/var/tmp/pdgpu/tree/site",
                           checkout="/root/repo")
    read_only, options = host.nspawn_options(facts, "/opt/site", "/opt/checkout")
    assert [o for o in options if o.startswith("--bind=")] == [
        "--bind=/dev/nvidia0", "--bind=/dev/nvidiactl", "--bind=/dev/nvidia-uvm"]
    assert "--link-journal=no" in options
    assert {"/usr/local/nvidia/lib64", "/var/tmp/pdgpu/tree/site:/opt/site", "/root/repo:/opt/checkout",
            "/opt/torch/.venv"} <= set(read_only)
    assert host.nspawn_command(tmp_path)[:2] == [str(tmp_path / host.LOADER), "--library-path"]


def test_the_cuda_toolkit_is_bound_at_cuda_home_when_the_machine_has_one(tmp_path, monkeypatch):
    toolkit = tmp_path / "cuda-13.0"
    toolkit.mkdir()
    (tmp_path / "cuda").symlink_to(toolkit)
    facts = host.HostFacts(python=_layout(), devices=(), driver_dirs=(), site="/s", checkout="/c")
    monkeypatch.setattr(host, "CUDA_HOME", str(tmp_path / "cuda"))
    assert f"{toolkit}:{tmp_path / 'cuda'}" in host.nspawn_options(facts, "/S", "/C")[0]
    monkeypatch.setattr(host, "CUDA_HOME", str(tmp_path / "absent"))
    assert not [b for b in host.nspawn_options(facts, "/S", "/C")[0] if "absent" in b]


def test_a_ninja_outside_the_python_environment_is_bound_where_the_units_path_finds_it(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    machine = tmp_path / "usr-bin-ninja"
    machine.touch()
    assert host.outside_ninja(str(venv), None) is None
    assert host.outside_ninja(str(venv), str(machine)) == str(machine)
    (venv / "bin" / "ninja").touch()  # as a host's SGLang env has it: the rendered PATH finds it, no bind
    assert host.outside_ninja(str(venv), str(machine)) is None
    facts = host.HostFacts(python=_layout(), devices=(), driver_dirs=(), site="/s", checkout="/c", ninja="/usr/x")
    assert f"/usr/x:{host.NINJA_INSIDE}" in host.nspawn_options(facts, "/S", "/C")[0]
    assert host.NINJA_INSIDE.rsplit("/", 1)[0] in SYSTEM_PATH.split(":")


def test_device_nodes_are_found_by_name(tmp_path):
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "null", "nvme0"):
        (tmp_path / name).touch()
    assert host.device_nodes(tmp_path) == [str(tmp_path / n) for n in ("nvidia0", "nvidia1", "nvidiactl",
                                                                        "nvidia-uvm")]


# -- drop-ins --------------------------------------------------------------------------------------------

def test_the_staged_site_reaches_every_unit_that_runs_python():
    facts = dropins.MachineFacts({}, "/usr/lib/x86_64-linux-gnu", "/x", "/opt/pdserve-gpu/site")
    found = dropins.needed("gputest", facts)
    assert sorted(d.unit for d in found) == ["sglang-gputest-decode.service", "sglang-gputest-prefill.service",
                                             "sglang-gputest-router.service", "sglang-gputest.service"]
    assert all(d.entries == (("Environment", '"PYTHONPATH=/opt/pdserve-gpu/site"'),) for d in found)


def test_no_drop_in_where_the_machine_is_like_a_host():
    facts = dropins.MachineFacts({"/dev/nvidia0": (0o20666, 0)}, "/usr/lib/x86_64-linux-gnu", "/usr/local/lib/x")
    assert dropins.needed("gputest", facts) == []


def test_closed_device_nodes_and_a_missing_libcuda_link_each_get_a_drop_in_on_every_gpu_unit(tmp_path):
    facts = dropins.MachineFacts({"/dev/nvidia0": (0o20660, 44), "/dev/nvidiactl": (0o20666, 0)}, None,
                                 "/usr/local/lib/pdserve-host")
    found = dropins.needed("gputest", facts)
    assert sorted(d.path for d in found) == [
        "sglang-gputest-decode.service.d/50-device-group.conf",
        "sglang-gputest-decode.service.d/50-triton-libcuda.conf",
        "sglang-gputest-prefill.service.d/50-device-group.conf",
        "sglang-gputest-prefill.service.d/50-triton-libcuda.conf",
        "sglang-gputest.service.d/50-device-group.conf",
        "sglang-gputest.service.d/50-triton-libcuda.conf"]
    written = dropins.install(found, tmp_path)
    text = (tmp_path / "sglang-gputest-prefill.service.d/50-device-group.conf").read_text()
    assert "[Service]\nSupplementaryGroups=44\n" in text
    assert all(line.startswith("#") for line in text.split("[Service]")[0].splitlines() if line)
    assert len(written) == 6
    if shutil.which("systemd-analyze"):
        unit = tmp_path / "x.service"
        unit.write_text("[Service]\nExecStart=/bin/true\n")
        for path in written[:2]:
            unit.write_text("[Service]\nExecStart=/bin/true\n" + path.read_text().split("\n", 1)[1])
            done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                                  timeout=60)
            assert "Unknown" not in done.stderr and "Invalid" not in done.stderr, done.stderr


def test_a_reason_with_line_breaks_stays_a_comment():
    dropin = dropins.DropIn("u.service", "50-x.conf", "one\n[Service]\nExecStart=/bin/evil", (("Nice", "1"),))
    text = dropin.text()
    assert text.count("[Service]\n") == 1 and "\nExecStart" not in text


# -- phases and timings ----------------------------------------------------------------------------------

def _journal(lines: list[tuple[int, str]]) -> str:
    return "\n".join(json.dumps({"__MONOTONIC_TIMESTAMP": str(t), "MESSAGE": m}) for t, m in lines)


def test_phases_are_read_after_the_process_start_and_graph_capture_ends_at_its_last_line():
    start = 100_000_000
    text = _journal([
        (start - 5_000_000, "[2026-12-05] Load weight begin. avail mem=70 GB"),  # an earlier start's
        (start + 20_000_000, "Init torch distributed begin."),
        (start + 21_000_000, "Load weight begin. avail mem=70.00 GB"),
        (start + 21_500_000, "Load weight end. type=LlamaForCausalLM"),
        (start + 22_000_000, "Capture prefill CUDA graph begin. This can take up to several minutes."),
        (start + 50_000_000, "Capture prefill CUDA graph end. Time elapsed: 28.00 s"),
        (start + 51_000_000, "Capture cuda graph begin. This can take up to several minutes."),
        (start + 80_000_000, "Capture cuda graph end. Time elapsed: 29.00 s"),
        (start + 90_000_000, "The server is fired up and ready to roll!"),
    ]) + "\nnot json\n"
    entries = phases.parse_journal_json(text)
    marks = phases.phases(entries, start, start + 95_000_000)
    assert marks == {"distributed_init_s": 20.0, "weights_begin_s": 21.0, "weights_end_s": 21.5,
                     "graphs_begin_s": 22.0, "graphs_end_s": 80.0, "fired_up_s": 90.0, "gate_passed_s": 95.0}
    spans = phases.spans(marks)
    assert spans["graph_capture_s"] == 58.0 and spans["weights_s"] == 0.5 and spans["fired_up_to_gate_s"] == 5.0


def test_a_phase_that_never_logged_is_none():
    marks = phases.phases(phases.parse_journal_json(_journal([(5, "Load weight begin.")])), 0, None)
    assert marks["weights_end_s"] is None and marks["gate_passed_s"] is None
    assert phases.spans(marks)["weights_s"] is None


def test_failure_timing_counts_retry_after_and_fast_answers():
    killed = 100.0
    outcomes = [Outcome(95, 99, "ok"), Outcome(101, 101.05, "HTTP 503", "no_available_workers", "1"),
                Outcome(102, 102.02, "HTTP 503", "no_available_workers", "1"),
                Outcome(103, 109.0, "HTTP 503", "no_available_workers", None), Outcome(104, 104.5, "timeout")]
    timing = runner.failure_timing(outcomes, killed)
    assert timing == {"failed_after_kill": 4, "http_5xx": 3, "with_retry_after": 2, "retry_after_values": ["1"],
                      "answered_within_1s": 3, "wait_s_median": 0.5, "wait_s_max": 6.0}


def test_the_table_shows_each_router_as_a_column():
    row = {"sent": 40, "ok": 30, "failed": 10, "failed_by_cause": {"HTTP 503": 10}, "failed_in_flight_at_kill": 1,
           "failed_sent_after_kill": 9, "failed_before_kill": 0, "with_retry_after": 9, "http_5xx": 10,
           "retry_after_values": ["1"], "answered_within_1s": 9, "failed_after_kill": 10, "wait_s_median": 0.02,
           "wait_s_max": 6.0, "longest_refused_s": 0.0, "first_successful_answer_after_kill_s": 80.1,
           "successful_answer_after_worker_ready_s": 7.1, "slowest_success_sent_after_kill_s": 9.0}
    report = {"prefill_kill_under_load": {"killed_main_pid": 5, "kill_to_restart_s": 5.1, "kill_to_gate_ready_s": 73.0,
                                          "restart_to_gate_ready_s": 67.9, "n_restarts": "1",
                                          "routers": {"smg": row, "0.3.2": {**row, "with_retry_after": 0}}}}
    text = table.render(report)
    assert "5xx answers with Retry-After" in text and "9 of 10 (1) | 0 of 10 (1)" in text
    assert "smg | 0.3.2" in text and "73.0 s after the kill" in text


def test_the_smoke_unit_gets_the_rendered_sandbox_and_nothing_that_starts_a_server():
    text = ("[Unit]\nDescription=x\n[Service]\nType=exec\nUser=pdserve\nExecStart=/usr/bin/python3 -m sglang\n"
            "ExecStartPost=/usr/local/bin/pdserve wait-ready prefill\nEnvironment=\"HOME=%S/x\"\n"
            "DevicePolicy=closed\nDeviceAllow=char-nvidia* rw\nSystemCallFilter=~@clock @mount\n"
            "LimitMEMLOCK=infinity\n[Install]\nWantedBy=multi-user.target\n")
    assert runner.sandbox_properties(text) == ["User=pdserve", "DevicePolicy=closed", "DeviceAllow=char-nvidia* rw",
                                               "SystemCallFilter=~@clock @mount", "LimitMEMLOCK=infinity"]


def test_a_container_left_by_an_earlier_call_is_ended_before_the_next_boot(tmp_path):
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    try:
        (tmp_path / "state.json").write_text(json.dumps({"init_pid": sleepers[0].pid,
                                                         "nspawn_pid": sleepers[1].pid}))
        runner.end_previous(tmp_path)
        assert [p.wait(timeout=10) for p in sleepers] == [-9, -9]
    finally:
        for p in sleepers:
            p.kill()
            p.wait(timeout=10)


def test_the_container_binds_a_copy_of_the_checkout_that_outlives_the_next_device_call(tmp_path):
    checkout, work = tmp_path / "checkout", tmp_path / "work"
    for part in ("pkg/pdserve", "tests/gpu", "kernels"):
        (checkout / part).mkdir(parents=True)
    (checkout / "pkg/pdserve/__init__.py").write_text("v1")
    staged = runner.stage_checkout(checkout, work)
    assert staged == work / "checkout" and sorted(p.name for p in staged.iterdir()) == ["pkg", "tests"]
    shutil.rmtree(checkout)  # what the next call's copy of the working tree does to the old one
    assert (staged / "pkg/pdserve/__init__.py").read_text() == "v1"


def test_the_bench_workload_file_is_one_pdserve_bench_accepts_and_fits_the_tiny_model():
    import tomllib

    from pdserve.bench import workload

    tables, problems = workload.workloads(tomllib.loads(runner.BENCH_WORKLOADS.read_text()))
    assert problems == []
    chosen, problems = workload.pick(tables, "gpu-tier")
    assert problems == [] and chosen is not None
    assert len(chosen.points()) == 3
    assert chosen.input_len + chosen.output_len <= 4096  # tests/gpu/tiny_model.py's context


def test_the_bench_unit_passes_hostile_arguments_through_the_real_shell_and_keeps_output_and_status(tmp_path):
    """The transient unit's shell (what systemd-run would start), run here by the real /bin/sh: arguments that
    are shell syntax reach the program as they are; stdout, stderr and the exit status land in the files, also
    in a directory whose name needs quoting."""
    directory = tmp_path / "bench dir; $(touch pwned)"
    directory.mkdir()
    hostile = ["$(touch pwned)", "a b", "'\"", "; exit 7", "*"]
    program = [sys.executable, "-c", "import sys; print(sys.argv[1:]); print('progress', file=sys.stderr); "
               "sys.exit(5)", *hostile]
    argv = runner.bench_unit_argv(program, str(directory))
    assert argv[:2] == ["systemd-run", f"--unit={runner.BENCH_UNIT}"]
    shell = argv[argv.index("/bin/sh"):]
    done = subprocess.run(shell, cwd=tmp_path, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0 and done.stdout == done.stderr == ""
    assert (directory / "bench.stdout").read_text() == f"{hostile}\n"
    assert (directory / "bench.stderr").read_text() == "progress\n"
    assert (directory / "bench.exit").read_text() == "5\n"
    assert not (tmp_path / "pwned").exists() and not (directory / "pwned").exists()


def test_the_bench_record_table_is_what_pdserve_bench_prints_read_back_from_its_json():
    """The README's table comes from `pdserve bench --json`'s output: read back into pdserve's types it prints
    the same lines as the run without --json (both layouts, side by side, a failed point, the notes)."""
    import tomllib

    from pdserve.bench import workload
    from pdserve.bench.figures import PointResult
    from pdserve.bench.layouts import Compared
    from pdserve.bench.runs import Outcome as BenchOutcome
    from pdserve.bench.sweep import Sweep
    from pdserve.probes.http import parse_json
    from pdserve.schema import strict_json

    tables, _ = workload.workloads(tomllib.loads(runner.BENCH_WORKLOADS.read_text()))
    chosen, _ = workload.pick(tables, "gpu-tier")
    assert chosen is not None

    def sweep(layout: str, scale: float, kv: bool) -> Sweep:
        results = [PointResult(p, {"ttft_p50_ms": 12.0 * scale * (i + 1), "output_tok_s": 120.0 * (i + 1) / scale,
                                   "errors": 0.0, **({"kv_transfer_ms": 5.25} if kv else {})},
                               p.prompts, 24.0, 128 * p.prompts) for i, p in enumerate(chosen.points()[:2])]
        results.append(PointResult(chosen.points()[2], failure="the client timed out after 120 s"))
        return Sweep(layout, "http://127.0.0.1:30001", results, notes=[f"{layout} note"])

    sweeps = [sweep("pd", 1.0, True), sweep("single", 1.5, False)]
    outcome = BenchOutcome("gputest", chosen, sweeps, ["a run note"],
                           Compared("pd", sweeps, ["restored pd, the layout that served at the start"]))
    report = outcome.report("2026-12-06T18:34:16+00:00", None, None, None)
    data = parse_json(strict_json.dumps(report.data).encode())
    text = table.bench_text(data).splitlines()
    assert text == [line for line in report.lines[1:] if not line.startswith("note: ")] + \
        [line for line in report.lines if line.startswith("note: ")]
    assert any(line.startswith("single at") for line in text) and "side by side" in "".join(text)
    assert any("no figures: the client timed out" in line for line in text)
