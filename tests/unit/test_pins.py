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
