"""Whether the units can reach, on this host, what they execute and read: as their user (User=, Group=,
the supplementary groups), through every directory above each path, and through every link.

The file's paths are already checked against the sandbox by name (pdserve.render.reach); here a link is
followed as the service would follow it (a venv's bin/python that leads into /tmp fails like /tmp itself),
and the kernel, in a process running as the units' user, says what that user may do (pdserve.probes.paths).
The API key file is not asked about: systemd reads it as root, before the sandbox (LoadCredential=).
"""

from __future__ import annotations

from pdserve.probes import paths
from pdserve.render.reach import gpu_servers, normalized, runners, unreachable
from pdserve.render.toolchain import Toolchain
from pdserve.schema.config import Deployment, Role
from pdserve.schema.problems import Problem, Severity
from pdserve.schema.topology import servers

_VERBS = {"execute": "execute", "read": "read", "read-dir": "read the directory"}


def unit_paths(dep: Deployment, tools: Toolchain) -> list[tuple[str, str, paths.Need, tuple[Role, ...]]]:
    """(field, path, what the unit does with it, the roles whose units do) of the paths the units use."""
    every = runners(dep)
    rows: list[tuple[str, str, paths.Need, tuple[Role, ...]]] = [
        ("tools.sglang_python", tools.sglang_python, "execute", every),
        ("tools.pdserve", tools.pdserve, "execute", every),
    ]
    specs = [server.spec for server in servers(dep)] + ([dep.fallback] if dep.fallback else [])
    if any(spec.numa_node is not None for spec in specs):
        rows.append(("tools.numactl", tools.numactl, "execute", gpu_servers(dep)))
    if dep.router.api_key_file is not None:
        rows.append(("(pdserve's keyed launcher)", tools.keyed_launcher, "read", ("router", "fallback")))
    model = dep.model
    if model.path.startswith("/"):
        rows.append(("model.path", model.path, "read-dir", gpu_servers(dep)))
    if model.chat_template and model.chat_template.startswith("/"):
        rows.append(("model.chat_template", model.chat_template, "read", gpu_servers(dep)))
    return rows


def _links_problems(rows: list[tuple[str, str, paths.Need, tuple[Role, ...]]]) -> list[Problem]:
    problems = []
    for field, path, need, roles in rows:
        target = paths.resolved(path)
        if target is None or normalized(target) == normalized(path):
            continue
        hidden = unreachable(target, roles, "execute" if need == "execute" else "read")
        if hidden:
            problems.append(Problem(field, path, f"leads (through a link) to {target}: it {hidden[0]}",
                                    f"point {field} at a path whose links stay outside that directory, or move "
                                    "what it links to"))
    return problems


def _denied(field: str, path: str, answer: paths.Reach, user: str) -> Problem:
    where = answer.blocked_at
    owned = ""
    if answer.uid >= 0:
        owned = f" (mode {answer.mode & 0o7777:04o}, owner {paths.owner(answer.uid, answer.gid)})"
    message = f"user {user} (the units' User=) cannot {_VERBS[answer.need]}: {where} {answer.why}{owned}"
    if "noexec" in answer.why:
        fix = f"put it on a file system mounted without noexec and point {field} there"
    elif "enter" in answer.why and where != path:
        fix = f"let {user} pass {where}: chmod o+x {where}, or give it a group {user} is in (g+x)"
    elif answer.need == "execute" or (answer.need == "read-dir" and where == path):
        fix = f"chmod o+rx {where}, or give it a group {user} is in (g+rx)"
    else:
        fix = f"chmod o+r {where}, or give it a group {user} is in (g+r)"
    return Problem(field, path, message, fix)


def check_access(dep: Deployment, tools: Toolchain, problems: list[Problem], passed: list[str],
                 skipped: list[str]) -> None:
    rows = unit_paths(dep, tools)
    problems += _links_problems(rows)
    sd = dep.systemd
    who = paths.account(sd.user, sd.group, sd.supplementary_groups)
    if isinstance(who, str):
        problems.append(Problem("systemd.user", sd.user, f"{who}: the units would fail to start (status 217/USER)",
                                f"create it (e.g. useradd --system --user-group {sd.user}), or set systemd.user and "
                                "systemd.group to an existing user and group", Severity.WARNING))
        skipped.append(f"what user {sd.user} may execute and read: {who}")
        return
    answers = paths.reach_as(who, [(path, need) for _, path, need, _ in rows])
    if isinstance(answers, str):
        skipped.append(f"what user {sd.user} may execute and read: {answers}")
        return
    # A missing path is check_files' to report (pdserve.check.host), once.
    denied = [_denied(field, path, answer, sd.user) for (field, path, _, _), answer in zip(rows, answers, strict=True)
              if not answer.ok and not answer.missing]
    problems += denied
    if not denied:
        passed.append(f"user {sd.user} may execute the tools and read the model ({len(rows)} paths, every "
                      "directory above them included)")
