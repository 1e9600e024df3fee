"""pdserve's reading of extra args against the real parsers of sglang 0.5.23 and smg 1.13.0 (the router)
(issue 14, item 2): every abbreviation the real parser takes for a rendered or secret flag is refused by
pdserve's own rules, and a bad extra arg is reported as that extra arg's problem, not a rendering bug."""

from __future__ import annotations

import argparse
import importlib.util
import sys

import pytest

from pdserve.check.parsers import check_with_parsers
from pdserve.render.renderable import renderable_from_data
from pdserve.schema.rules import RENDERED_ROUTER_FLAGS, RENDERED_SERVER_FLAGS
from tests.conftest import require_or_skip

PROGRAMS = ("router", "server")


@pytest.fixture(scope="module")
def parsers_available():
    have = importlib.util.find_spec("sglang") is not None and importlib.util.find_spec("smg") is not None
    require_or_skip(have, "sglang and smg are not installed in this Python", "PDSERVE_REQUIRE_PARSERS")


class _Refused(Exception):
    pass


def _real_parser(program: str) -> argparse.ArgumentParser:
    """The parsers as prepare_server_args / parse_router_args build them, with errors raised, not exited."""
    if program == "server":
        from sglang.srt.server_args import ServerArgs

        parser = argparse.ArgumentParser(prog="sglang serve")
        ServerArgs.add_cli_args(parser)
    else:
        from smg.router_args import RouterArgs

        parser = argparse.ArgumentParser()
        RouterArgs.add_cli_args(parser, use_router_prefix=False)

    def error(message):
        raise _Refused(message)

    parser.error = error  # type: ignore[method-assign]
    return parser


def _dest(parser: argparse.ArgumentParser, arg: str) -> str | None:
    """The destination the real parser stores `arg` in, or None (positional, ambiguous or unknown)."""
    try:
        found = parser._parse_optional(arg)
    except _Refused:
        return None
    return found[0].dest if found and found[0] is not None else None


def _guarded(program: str):
    """(rendered flags, secret flags, exact real flags that prefix them) as pdserve knows them."""
    from pdserve.schema import extra_args

    if program == "server":
        return RENDERED_SERVER_FLAGS, extra_args.SERVER_SECRET_FLAGS, extra_args.SERVER_EXACT_FLAGS
    return RENDERED_ROUTER_FLAGS, extra_args.ROUTER_SECRET_FLAGS, extra_args.ROUTER_EXACT_FLAGS


@pytest.mark.parametrize("program", PROGRAMS)
def test_both_real_parsers_take_abbreviations(parsers_available, program):
    parser = _real_parser(program)
    assert parser.allow_abbrev
    assert _dest(parser, "--api-k") == "api_key"
    assert _dest(parser, "--api-k=x") == "api_key"


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_prefix_the_real_parser_reads_as_a_guarded_flag_is_refused_by_pdserve(parsers_available, program):
    parser = _real_parser(program)
    from pdserve.schema.extra_args import read_as

    rendered, secrets, exact = _guarded(program)
    guarded = {**dict.fromkeys(rendered, "rendered"), **dict.fromkeys(secrets, "secret")}
    checked = 0
    for flag, kind in guarded.items():
        dest = _dest(parser, flag)
        assert dest is not None, f"{flag} ({kind}) is not a flag of the real {program} parser"
        for end in range(3, len(flag) + 1):
            for arg in (flag[:end], flag[:end] + "=x"):
                if _dest(parser, arg) == dest:
                    checked += 1
                    assert read_as(arg, guarded, exact), \
                        f"the real {program} parser reads {arg} as {flag}; pdserve lets it pass"
    assert checked > 100


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_other_name_the_real_parser_has_for_a_guarded_flag_is_refused_too(parsers_available, program):
    """An alias (--tensor-parallel-size for --tp-size) sets the same value as the flag pdserve renders, and
    argparse keeps the last one: extra_args come last, so an alias would silently override the schema."""
    parser = _real_parser(program)
    from pdserve.schema.extra_args import read_as

    rendered, secrets, exact = _guarded(program)
    guarded = {*rendered, *secrets}
    guarded_dests = {_dest(parser, flag) for flag in guarded}
    aliases = [name for name, action in parser._option_string_actions.items()
               if name.startswith("--") and action.dest in guarded_dests]
    assert len(aliases) >= len(guarded_dests)
    missed = [name for name in aliases if not read_as(name, guarded, exact)]
    assert missed == [], f"the real {program} parser sets a guarded value through {missed}; pdserve lets them pass"


@pytest.mark.parametrize("program", PROGRAMS)
def test_what_pdserve_refuses_as_a_guarded_flag_the_real_parser_reads_as_one(parsers_available, program):
    """No false refusals: an arg pdserve reads as a guarded flag is that flag (or an error) for the parser."""
    parser = _real_parser(program)
    from pdserve.schema.extra_args import read_as

    rendered, secrets, exact = _guarded(program)
    guarded = [*rendered, *secrets]
    guarded_dests = {_dest(parser, f) for f in guarded}
    for option in sorted(parser._option_string_actions):
        if option.startswith("--") and read_as(option, guarded, exact):
            assert _dest(parser, option) in guarded_dests, f"{option} is refused but means something else"


def test_a_bad_extra_arg_value_is_that_extra_args_problem(parsers_available, reference_data):
    reference_data["decode"]["extra_args"] = ["--max-total", "lots"]          # an abbreviation with a bad int
    reference_data["prefill"]["extra_args"] = ["--disable-radix-cache", "--kv-cache-dtype-x", "y"]
    reference_data["router"]["extra_args"] = ["--log-level", "loud"]
    dep = renderable_from_data(reference_data, "t").deployment
    report = check_with_parsers(dep, sys.executable)
    found = {p.field: p for p in report.problems}
    assert set(found) == {"decode.extra_args", "prefill.extra_args", "router.extra_args"}, report.problems
    assert found["decode.extra_args"].value == "--max-total"
    assert "Invalid integer value" in found["decode.extra_args"].message
    assert found["prefill.extra_args"].value == "--kv-cache-dtype-x"
    assert found["router.extra_args"].value == "--log-level"
    for problem in report.problems:
        assert "rendering bug" not in problem.fix
