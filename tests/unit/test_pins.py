"""pdserve's copy of the parser names matches the pinned SGLang, when SGLang is importable."""

from __future__ import annotations

import importlib.util

from pdserve.schema import pins
from tests.conftest import require_or_skip


def test_parser_names_match_installed_sglang():
    require_or_skip(importlib.util.find_spec("sglang") is not None, "sglang is not installed here",
                    "PDSERVE_REQUIRE_PARSERS")
    from importlib.metadata import version

    from sglang.srt.function_call.parser_names import TOOL_CALL_PARSER_NAMES
    from sglang.srt.parser.reasoning_parser_names import REASONING_PARSER_NAMES

    assert version("sglang") == pins.SGLANG_VERSION
    assert set(REASONING_PARSER_NAMES) == pins.REASONING_PARSERS
    assert set(TOOL_CALL_PARSER_NAMES) == pins.TOOL_CALL_PARSERS


def _choices(add_cli_args, dest: str) -> set[str]:
    import argparse

    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    (action,) = [a for a in parser._actions if a.dest == dest]
    return set(action.choices)


def test_schema_choices_match_the_pinned_parsers():
    # The schema's Literals are pdserve's copy of these choices, so `pdserve check` refuses a bad value
    # without SGLang; the pinned parsers are what the units actually run.
    require_or_skip(importlib.util.find_spec("sglang") is not None
                    and importlib.util.find_spec("smg") is not None,
                    "sglang and smg are not installed here", "PDSERVE_REQUIRE_PARSERS")
    from typing import get_args

    from sglang.srt.server_args import ServerArgs
    from smg.router_args import RouterArgs

    from pdserve.schema.config import Policy, TransferSpec

    backends = set(get_args(TransferSpec.model_fields["backend"].annotation))
    assert backends == _choices(ServerArgs.add_cli_args, "disaggregation_transfer_backend") - {"fake"}
    router = lambda parser: RouterArgs.add_cli_args(parser, use_router_prefix=False)  # noqa: E731
    assert set(get_args(Policy)) == _choices(router, "policy")
