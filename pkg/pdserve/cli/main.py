"""The `pdserve` command line: a thin layer over the pure core.

Every command exits by one table (pdserve.cli.exits, printed by `pdserve --help`): a deployment file
with problems is Exit.PROBLEMS from every command, a wrong command line is click's Exit.USAGE, and an
exception that escapes a command is Exit.INTERNAL with its reason, never a traceback or a pass.
"""

from __future__ import annotations

import errno
import importlib
import sys

import click

from pdserve import __version__
from pdserve.cli.commands import COMMANDS
from pdserve.cli.exits import Exit, help_epilog


class Commands(click.Group):
    """click's group, with Exit.INTERNAL for an exception that escapes a command: what broke, not a
    traceback, and never an exit code that reads as success or as a problem of the deployment.

    Its commands are pdserve.cli.commands' table: each module is imported when its command runs (or its own
    --help is asked for), and the group's --help lists them from the table alone."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        command: click.Command = getattr(importlib.import_module(entry.module), entry.attribute)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, entry.short_help) for name, entry in sorted(COMMANDS.items())]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort,
                SystemExit, KeyboardInterrupt):
            raise
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # `pdserve plan | head`: click's own handling of a closed pipe
                raise
            _internal(ctx, exc)
        except Exception as exc:  # noqa: BLE001 - the contract is Exit.INTERNAL with the reason
            _internal(ctx, exc)


def _internal(ctx: click.Context, exc: BaseException) -> None:
    command = ctx.invoked_subcommand or "pdserve"
    click.echo(f"pdserve {command}: internal error: {type(exc).__name__}: {exc}; this is a bug in pdserve "
               f"(exit {int(Exit.INTERNAL)})", err=True)
    raise SystemExit(Exit.INTERNAL) from None


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]}, epilog=help_epilog())
@click.version_option(__version__, prog_name="pdserve")
def main() -> None:
    """Deploy an SGLang model as a prefill/decode disaggregated service, and prove it works."""


if __name__ == "__main__":
    main(sys.argv[1:])
