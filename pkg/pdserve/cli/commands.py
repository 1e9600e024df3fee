"""Every pdserve command: the module it lives in and its one-line help.

`pdserve --help` lists the commands from this table without importing any of them, and `pdserve NAME` imports
only NAME's module: each command pays for what it uses (pydantic's models, httpx, rich) when it runs, so the
help and a plan start fast. The commands take their short help from here, so the two never differ.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    module: str
    attribute: str
    short_help: str


COMMANDS: dict[str, Entry] = {
    "bench": Entry("pdserve.cli.bench", "bench",
                   "Measure how well it serves (TTFT, ITL, throughput, goodput); --compare single,pd."),
    "check": Entry("pdserve.cli.check", "check", "Validate deployment files (and this host, where it is the target)."),
    "cutover": Entry("pdserve.cli.cutover", "cutover_command",
                     "Move to TARGET (pd or single), rolling back on failure."),
    "leave-routers": Entry("pdserve.cli.leave_routers", "leave_routers_command",
                           "Take a prefill/decode server out of the routers (its unit's first step)."),
    "plan": Entry("pdserve.cli.plan", "plan", "Show what would run: topology, commands, environment, units."),
    "render": Entry("pdserve.cli.render", "render_command", "Write the unit files and the deployment JSON they read."),
    "schema": Entry("pdserve.cli.schema_command", "schema", "Print the deployment's JSON Schema."),
    "verify": Entry("pdserve.cli.verify", "verify", "Prove the running deployment works, check by check."),
    "wait-ready": Entry("pdserve.cli.wait_ready", "wait_ready", "Wait until ROLE answers as ready (the units' gate)."),
}


def short_help(name: str) -> str:
    return COMMANDS[name].short_help
