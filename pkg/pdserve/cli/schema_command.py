"""`pdserve schema`: the deployment's JSON Schema."""

from __future__ import annotations

import click

from pdserve.cli.commands import short_help
from pdserve.schema import strict_json
from pdserve.schema.loading import json_schema


@click.command("schema", short_help=short_help("schema"))
def schema() -> None:
    """Print the deployment's JSON Schema."""
    click.echo(strict_json.dumps(json_schema(), indent=2, sort_keys=True))
