"""The shell as the consumer of `pdserve plan`'s plain output.

- `bash -n` and `sh -n` (dash, POSIX) parse every plan;
- every plan is run, whole, by bash as it is (each command passes its environment with env(1)), in a
  throwaway root: an overlay of this machine's / in a private mount
  namespace, with a recording stub at every tool path the plan runs. The stub writes down the argv and the
  environment it received; the here-documents write the unit files and the ruleset. Nothing the plan does
  reaches the real filesystem, whatever a value injects;
- `shlex.split` of each command (Python's reading of the same shell syntax), its `env NAME=value` words apart.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

TIMEOUT_S = 120
HEREDOC_END = "PDSERVE_UNIT_END"  # what the plan's here-documents end with (its documented format)

# Runs as root in a private mount namespace: a tmpfs holds the overlay's writable layer, / (and the batch
# directory, which may be on another mount) is seen through it, and each plan runs chrooted there.
_DRIVER = r"""
set -eu
batch=$1; layer=$batch/.layer
mkdir "$layer"; mount -t tmpfs pdserve-prop "$layer"
mkdir "$layer/upper" "$layer/work" "$layer/merged"
mount -t overlay overlay -o "lowerdir=/,upperdir=$layer/upper,workdir=$layer/work" "$layer/merged"
# A /dev of its own (a tool path may point under /dev/shm; its stub must not land in the host's), with the
# devices a shell uses; the host's /proc.
mount -t tmpfs pdserve-prop-dev "$layer/merged/dev"
mkdir "$layer/merged/dev/shm"
for dev in null zero random urandom; do
  touch "$layer/merged/dev/$dev"; mount --bind "/dev/$dev" "$layer/merged/dev/$dev"
done
mount --rbind /proc "$layer/merged/proc"
# Not recursive: the layer's own tmpfs, mounted inside the batch directory, stays out of the root.
mkdir -p "$layer/merged$batch"; mount --bind "$batch" "$layer/merged$batch"
# A tool path where no file can be made (under /proc, say) gets no stub: its plans then fail on their own.
while IFS= read -r -d '' tool; do
  { mkdir -p -- "$layer/merged$(dirname -- "$tool")" && cp -- "$batch/stub" "$layer/merged$tool" &&
    chmod 755 -- "$layer/merged$tool"; } 2>>"$batch/stub-errors" || true
done < "$batch/tools"
# Two chroots, one per core, for all plans: each runs in its own directory, after bash -n and sh -n (dash)
# have parsed it.
printf '%s\0' "$batch"/p*/ | xargs -0 -n 64 -P 2 chroot "$layer/merged" /bin/bash -c '
  for dir in "$@"; do
    cd "$dir" && mkdir calls
    /bin/bash -n plan.sh 2>syntax.bash; /bin/sh -n plan.sh 2>syntax.sh
    /bin/bash ./plan.sh >stdout 2>stderr; echo $? >rc
  done' _
"""

# The recording stub: argv (with the path it was run as) and environment, NUL-separated, one directory per call.
# POSIX sh, not bash: an environment may hold SHELLOPTS or BASHOPTS, which bash would obey.
_STUB = r"""#!/bin/sh
n=0; while [ -e "calls/$n.argv" ]; do n=$((n + 1)); done
printf '%s\0' "$0" "$@" >"calls/$n.argv"
exec /usr/bin/env -0 >"calls/$n.env"
"""


def usable() -> str | None:
    for tool in ("bash", "sh", "unshare", "chroot", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if os.geteuid() != 0:
        return "running the plans in a throwaway root needs root (mount namespaces, overlayfs)"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "d=$(mktemp -d) && mount -t tmpfs x $d && mkdir $d/u $d/w $d/m && "
                            "mount -t overlay overlay -o lowerdir=/,upperdir=$d/u,workdir=$d/w $d/m"],
                           capture_output=True, text=True, timeout=30, check=False)
    if probe.returncode != 0:
        return f"no overlayfs in a private mount namespace here: {probe.stderr.strip()[-300:]}"
    return None


def syntax(text: str, shell: str) -> str | None:
    """The shell's complaint about the text's syntax (None: it parses)."""
    done = subprocess.run([shell, "-n"], input=text.encode("utf-8", "surrogateescape"), capture_output=True,
                          timeout=TIMEOUT_S, check=False)
    return None if done.returncode == 0 else done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"


@dataclass
class Call:
    argv: list[str]
    env: dict[str, str]


@dataclass
class Run:
    rc: str
    stderr: str
    calls: list[Call] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # what the plan wrote beside the calls
    syntax: dict[str, str] = field(default_factory=dict)  # shell -> its complaint from `-n` ("" for none)


def run_plans(plans: dict[str, str], tools: set[str], batch: Path) -> dict[str, Run]:
    """Run every plan (key -> text) in one throwaway root with stubs at `tools`; what each did."""
    batch.mkdir(parents=True, exist_ok=True)
    (batch / "stub").write_text(_STUB)
    (batch / "tools").write_bytes(b"".join(t.encode("utf-8", "surrogateescape") + b"\0" for t in sorted(tools)))
    dirs = {}
    for i, (key, text) in enumerate(plans.items()):
        dirs[key] = batch / f"p{i:05d}"
        dirs[key].mkdir()
        (dirs[key] / "plan.sh").write_text(text, encoding="utf-8")
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", _DRIVER, "_", str(batch)],
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, f"the plan runner failed: {done.stderr[-3000:]}"
    return {key: _collect(path) for key, path in dirs.items()}


def _collect(path: Path) -> Run:
    rc = (path / "rc").read_text().strip() if (path / "rc").exists() else "(no exit status)"
    run = Run(rc, (path / "stderr").read_text(errors="replace"))
    run.syntax = {sh: (path / f"syntax.{sh}").read_text(errors="replace").strip() for sh in ("bash", "sh")
                  if (path / f"syntax.{sh}").exists()}
    calls = path / "calls"
    for n in range(len(list(calls.glob("*.argv")))):
        argv = (calls / f"{n}.argv").read_bytes().decode("utf-8", "surrogateescape").split("\0")[:-1]
        env_items = (calls / f"{n}.env").read_bytes().decode("utf-8", "surrogateescape").split("\0")[:-1]
        run.calls.append(Call(argv, dict(item.split("=", 1) for item in env_items)))
    for item in sorted(path.rglob("*")):
        name = str(item.relative_to(path))
        if item.is_file() and name not in {"plan.sh", "stdout", "stderr", "rc", "syntax.bash", "syntax.sh"} \
                and not name.startswith("calls/"):
            run.files[name] = item.read_text(encoding="utf-8", errors="surrogateescape")
    return run


@dataclass
class PlanBlocks:
    """The plain plan, cut where its documented format says: per process, its command (continued with
    backslash-newline, its environment in front of it); per file, its here-document."""

    commands: list[str] = field(default_factory=list)
    heredocs: dict[str, str] = field(default_factory=dict)


def blocks(text: str) -> PlanBlocks:
    found = PlanBlocks()
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("# command"):
            command = [lines[i + 1]]
            i += 1
            while lines[i].endswith("\\"):
                i += 1
                command.append(lines[i])
            found.commands.append("\n".join(command))
        elif line.startswith("cat > ") and line.endswith(f"<<'{HEREDOC_END}'"):
            name = shlex.split(line[len("cat > "):-len(f"<<'{HEREDOC_END}'")])[0]
            end = lines.index(HEREDOC_END, i + 1)
            found.heredocs[name] = "\n".join(lines[i + 1:end]) + "\n"
            i = end
        i += 1
    return found


def shlex_words(command: str) -> list[str]:
    """A command as the shell reads it: backslash-newline joins lines (outside quotes, where the plan puts
    it), then words."""
    return shlex.split(command.replace("\\\n", ""))


# How plan starts a program whose path holds `=` (which env(1) would take for an assignment).
EXEC_AS_GIVEN = ["/bin/sh", "-c", 'exec "$0" "$@"']


def split_environment(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """A command's words as env(1) reads them: `env NAME=value ... program args` is the environment it adds
    and the argv it runs (the program through EXEC_AS_GIVEN where its path holds `=`)."""
    if not words or words[0] != "env":
        return {}, words
    env, rest = {}, words[1:]
    while rest and "=" in rest[0]:
        name, value = rest.pop(0).split("=", 1)
        env[name] = value
    if rest[:3] == EXEC_AS_GIVEN:
        rest = rest[3:]
    return env, rest
