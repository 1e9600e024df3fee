"""A real systemd in a container, for the systemd test tier (facts/testing.md, "systemd").

debootstrap builds a minimal Debian rootfs once (cached under $PDSERVE_ROOTFS_CACHE when set, so
later runs copy it instead of downloading it again); `systemd-nspawn --boot` boots it sharing the
host's network, with the test's Python environment bind-mounted read-only at the same absolute paths;
`nsenter -t <PID 1 of the container> -a` runs commands in it. Every wait is bounded and the container
is powered off (then killed, if it does not go) by `Container.shutdown`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from pdserve.probes.systemctl import Systemctl
from tests.fixtures import waiting
from tests.fixtures.commands import run_bounded
from tests.fixtures.procstat import processes

SUITE = "bookworm"
BASE_PACKAGES = ("systemd", "systemd-sysv", "dbus", "numactl", "procps")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEBOOTSTRAP_TIMEOUT = 900
BOOT_TIMEOUT = 90
POWEROFF_TIMEOUT = 60
CONTAINER_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ContainerError(RuntimeError):
    pass


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.5) -> object:
    return waiting.wait_for(predicate, timeout, what, interval, error=ContainerError)


@dataclass(frozen=True)
class PythonEnv:
    """The interpreter running the tests, and what must be visible inside the container for it to run
    there at the same path: the virtual environment, its base interpreter, the editable sources."""

    python: str
    prefix: str
    base_prefix: str
    binds: tuple[str, ...]
    rootfs_packages: tuple[str, ...]
    # "HOST:INSIDE" read-only binds: this checkout's pkg/ where the venv's editable pdserve looks for it.
    overlays: tuple[str, ...] = ()

    @classmethod
    def current(cls, repo: Path) -> PythonEnv:
        prefix, base = sys.prefix, sys.base_prefix
        if prefix == base:
            raise ContainerError("the tests must run from a virtual environment (python -m venv), so that it can "
                                 "be bind-mounted into the container without the host's /usr")
        binds = [prefix, str(Path(prefix).resolve()), str(repo)]
        packages: list[str] = []
        if Path(base).resolve().is_relative_to("/usr"):
            # Debian's own python3 (CI's `python3 -m venv`): the venv's bin/python links to /usr/bin/python3.X,
            # which the rootfs provides when it has the same Debian python package.
            version = sysconfig.get_python_version()
            packages.append(f"python{version}")
        else:
            # pyenv, uv or a hand-built Python: the venv's bin/python is a symlink into the base prefix,
            # and the stdlib lives there too.
            # Both spellings: the venv's symlink names the base as it was given, which may pass through a link.
            binds += [base, str(Path(base).resolve())]
        binds = sorted(set(binds))
        # A bind inside another bind is already visible.
        binds = [b for b in binds if not any(b != o and Path(b).is_relative_to(o) for o in binds)]
        return cls(str(Path(prefix) / "bin" / "python"), prefix, base, tuple(binds), tuple(packages),
                   editable_overlays(repo, Path(sysconfig.get_paths()["purelib"])))

    def executable(self, name: str) -> str:
        return str(Path(self.prefix) / "bin" / name)


def editable_overlays(repo: Path, site: Path) -> tuple[str, ...]:
    """A venv whose editable pdserve was installed from another checkout (a git worktree sharing the main
    checkout's venv) names that checkout's pkg/ in a .pth file: the units' `pdserve` would import that code,
    or nothing, since only this checkout is bound in. Inside the container this checkout's pkg/ shows there."""
    ours = (repo / "pkg").resolve()
    found = []
    for pth in sorted(site.glob("*pdserve*.pth")):
        for line in pth.read_text(encoding="utf-8", errors="replace").splitlines():
            target = Path(line.strip())
            if target.is_absolute() and target.is_dir() and target.resolve() != ours:
                found.append(f"{ours}:{target}")
    return tuple(found)


def rootfs_key(packages: tuple[str, ...]) -> str:
    text = f"{SUITE} {' '.join(sorted(packages))} v1"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def host_mirror(sources: tuple[Path, ...] = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d")),
                suite: str = SUITE) -> str | None:
    """The Debian mirror this host's apt uses for the suite (CI may only reach that one)."""
    files: list[Path] = []
    for path in sources:
        files += sorted(path.glob("*.sources")) + sorted(path.glob("*.list")) if path.is_dir() else [path]
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        if path.suffix == ".sources":  # deb822: stanzas of "Key: value"
            for stanza in text.split("\n\n"):
                fields = dict(line.split(":", 1) for line in stanza.splitlines()
                              if ":" in line and not line.startswith(("#", " ")))
                suites = fields.get("Suites", "").split()
                wanted = suite in suites and "main" in fields.get("Components", "")
                if "deb" in fields.get("Types", "").split() and wanted:
                    return fields.get("URIs", "").split()[0] if fields.get("URIs", "").split() else None
        else:
            for line in text.splitlines():
                words = [w for w in line.split() if not w.startswith("[")]
                if len(words) >= 4 and words[0] == "deb" and words[2] == suite and "main" in words[3:]:
                    return words[1]
    return None


def build_rootfs(target: Path, packages: tuple[str, ...], log: Path, suite: str = SUITE) -> None:
    """debootstrap a minbase rootfs of `suite` into `target` (about 60 s with a nearby mirror)."""
    mirror = os.environ.get("PDSERVE_DEBIAN_MIRROR") or host_mirror(suite=suite) or DEFAULT_MIRROR
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(partial), mirror]
    with log.open("ab") as out:
        try:
            done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=DEBOOTSTRAP_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            raise ContainerError(f"debootstrap did not finish within {DEBOOTSTRAP_TIMEOUT} s; see {log}") from None
    if done.returncode != 0:
        raise ContainerError(f"debootstrap failed (exit {done.returncode}); see {log}")
    partial.rename(target)


def prepared_rootfs(work: Path, packages: tuple[str, ...]) -> Path:
    """A fresh rootfs for this session: a copy of the cached one, built first when the cache lacks it."""
    # Without a cache directory, one beside `work` (the session's pytest base directory when `work` came
    # from tmp_path_factory.mktemp): every container of the session then copies one debootstrap.
    cache_dir = Path(os.environ.get("PDSERVE_ROOTFS_CACHE") or work.parent / "rootfs-cache")
    cache_dir.mkdir(parents=True, exist_ok=True)
    cached = cache_dir / f"rootfs-{SUITE}-{rootfs_key(packages)}"
    if not (cached / "usr/lib/systemd/systemd").exists():
        shutil.rmtree(cached, ignore_errors=True)
        build_rootfs(cached, packages, work / "debootstrap.log")
    root = work / "rootfs"
    if root.exists():
        shutil.rmtree(root)
    subprocess.run(["cp", "-a", "--reflink=auto", str(cached), str(root)], check=True, timeout=300)
    return root


def customize(root: Path, env: PythonEnv, user: str) -> None:
    """Make the rootfs ready for the units: the service user, traversable bind paths, no console login."""
    def chroot(*argv: str) -> None:
        subprocess.run(["chroot", str(root), *argv], check=True, timeout=60, capture_output=True)

    if subprocess.run(["chroot", str(root), "id", "-u", user], capture_output=True, timeout=30).returncode != 0:
        chroot("useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
               "--shell", "/usr/sbin/nologin", user)
    # The service user must reach the bind-mounted interpreter, e.g. under /root (mode 0700 in Debian).
    for bind in env.binds:
        for parent in [*reversed(Path(bind).parents)][1:]:
            inside = root / parent.relative_to("/")
            if inside.is_dir() and not inside.is_symlink():
                inside.chmod(inside.stat().st_mode | 0o055)
    # No getty on the console: the container's console is a log, nobody logs in.
    (root / "etc/systemd/system/console-getty.service").unlink(missing_ok=True)
    (root / "etc/systemd/system/console-getty.service").symlink_to("/dev/null")
    (root / "etc/pdserve").mkdir(mode=0o755, exist_ok=True)


def fresh_container(work: Path, repo: Path, read_only_binds: tuple[str, ...] = (),
                    network_namespace: str | None = None) -> Container:
    """A container on a fresh copy of the cached rootfs, ready for the units, not booted yet."""
    env = PythonEnv.current(repo)
    root = prepared_rootfs(work, BASE_PACKAGES + env.rootfs_packages)
    customize(root, env, "pdserve")
    return Container(root, env, work / "console.log", read_only_binds=read_only_binds,
                     network_namespace=network_namespace)


@contextmanager
def booted(box: Container, *leftovers: Path) -> Iterator[Container]:
    """Boot `box`; however the block ends, power it off and delete its rootfs and `leftovers`."""
    box.boot()
    try:
        yield box
    finally:
        box.shutdown()
        for path in (box.root, *leftovers):
            shutil.rmtree(path, ignore_errors=True)


def _children(pid: int) -> list[tuple[int, str]]:
    return [(p.pid, p.comm) for p in processes() if p.ppid == pid]


@dataclass
class Container:
    root: Path
    env: PythonEnv
    log: Path
    proc: subprocess.Popen | None = None
    pid: int = 0
    boots: int = 0
    # Further read-only mounts, "HOST:INSIDE" as --bind-ro= takes them (a stand-in /nix/store).
    read_only_binds: tuple[str, ...] = ()
    # A named network namespace (`ip netns`) to boot in instead of the host's network: one host of the
    # multi-host tier (tests/integration/multihost). Its name is also the machine's.
    network_namespace: str | None = None
    # The nspawn program (a host without systemd-container runs the rootfs's own through its loader,
    # tests/gpu/systemd) and further options (device nodes, --link-journal=no, rlimits).
    nspawn: tuple[str, ...] = ("systemd-nspawn",)
    extra_args: tuple[str, ...] = ()
    _console: object = field(default=None, repr=False)

    # -- lifecycle --------------------------------------------------------------------------------

    def boot(self) -> None:
        machine = self.network_namespace or f"pdserve-test-{os.getpid()}"
        argv = [*self.nspawn, "-D", str(self.root), "--boot", "--register=no", "--keep-unit",
                "--console=read-only", f"--machine={machine}",
                *[f"--bind-ro={b}" for b in (*self.env.binds, *self.env.overlays, *self.read_only_binds)],
                *self.extra_args]
        if self.network_namespace:
            argv.append(f"--network-namespace-path=/run/netns/{self.network_namespace}")
        self.boots += 1
        self._console = self.log.open("ab")
        self._console.write(f"\n=== boot {self.boots}: {' '.join(argv)}\n".encode())
        self._console.flush()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._console, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:
            self.pid = int(wait_for(self._init_pid, 30, "the container's systemd (PID 1) to appear", 0.2))
            state = wait_for(self._booted, BOOT_TIMEOUT, "the container to finish booting", 0.5)
        except ContainerError:
            self.shutdown()
            raise
        if state not in {"running", "degraded"}:
            raise ContainerError(f"the container booted into state {state!r}; failed units: "
                                 + self.sh("systemctl --failed --no-legend", check=False).stdout)

    def _init_pid(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            raise ContainerError(f"systemd-nspawn exited with {self.proc and self.proc.returncode}; see {self.log}")
        for pid, comm in _children(self.proc.pid):
            if comm == "systemd":
                return pid
        return None

    def _booted(self) -> str | None:
        done = self.run(["systemctl", "is-system-running"], timeout=10, check=False)
        state = done.stdout.strip()
        return state if state in {"running", "degraded", "maintenance"} else None

    def shutdown(self) -> int | None:
        """Power off, bounded; terminate and then kill nspawn if it does not go. Returns its exit status."""
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        if proc.poll() is None and self.pid:
            self.run(["systemctl", "poweroff", "--no-block"], timeout=15, check=False)
        for sig, wait in ((None, POWEROFF_TIMEOUT), (signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            if sig is not None and proc.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        if self._console is not None:
            self._console.close()  # type: ignore[attr-defined]
            self._console = None
        self.pid = 0
        return proc.returncode

    def reboot(self) -> None:
        """A real reboot: systemd inside shuts down (nspawn exits 133), then the same rootfs boots again."""
        assert self.proc is not None
        proc = self.proc
        self.run(["systemctl", "reboot", "--no-block"], timeout=15)
        try:
            proc.wait(timeout=POWEROFF_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise ContainerError(
                f"the container did not shut down for the reboot within {POWEROFF_TIMEOUT} s") from None
        if proc.returncode != 133:
            raise ContainerError(f"systemd-nspawn exited with {proc.returncode}, not 133 (reboot); see {self.log}")
        self.proc = None
        if self._console is not None:
            self._console.close()  # type: ignore[attr-defined]
        self.boot()

    # -- commands inside --------------------------------------------------------------------------

    def run(self, argv: list[str], timeout: float = 60, check: bool = True,
            input: str | None = None) -> subprocess.CompletedProcess:
        full = ["nsenter", "-t", str(self.pid), "-a", "/usr/bin/env", "-i", CONTAINER_PATH, "LANG=C.UTF-8", *argv]
        return run_bounded(argv, full, "in the container", timeout, check, input, ContainerError)

    def sh(self, script: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        return self.run(["/bin/sh", "-c", script], timeout=timeout, check=check)

    @property
    def systemctl(self) -> Systemctl:
        """pdserve's own systemctl edge, pointed into the container."""
        return Systemctl(["nsenter", "-t", str(self.pid), "-a", "systemctl"], timeout=120)

    def journal(self, unit: str, lines: int = 40) -> str:
        return self.run(["journalctl", "--no-pager", "-o", "short-monotonic", "-n", str(lines), "-u", unit],
                        check=False).stdout

    def path(self, inside: str) -> Path:
        """The host path of a file inside the container (its root is a plain directory)."""
        return self.root / inside.lstrip("/")
