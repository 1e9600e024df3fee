"""ISSUE-37 item 3: every string and number field of the deployment schema, given hostile and odd values, is
either refused by `pdserve check` with a problem naming that field, or carried exactly into every output,
each loaded by its real consumer.

The first test explores one field (hypothesis: the curated hostile values of tests/property/strategies.py as
explicit examples, then drawn ones) and checks everything Python can read in-process; the accepted examples
of the whole session are then handed, in batches, to the consumers outside Python by the tests below it
(pytest runs a module's tests in order). A consumer test for a field whose exploration did not run in this
session explores it first.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import example, given

from tests.conftest import require_or_skip
from tests.property import batches, carried
from tests.property.consumers import nft, promtool, shell, systemd
from tests.property.outputs import Example, loader_verdict, run_example
from tests.property.refusals import refusal_problems
from tests.property.schema_fields import FieldCase, field_cases
from tests.property.strategies import curated, values

CASES = field_cases()
ACCEPTED: dict[str, list[Example]] = {}  # case id -> its accepted examples, for the batched consumers
_NUMBER = itertools.count()


def _slug(case: FieldCase) -> str:
    return "".join(c if c.isalnum() else "-" for c in case.id)[:60]


def explore(case: FieldCase, work: Path) -> list[Example]:
    accepted = ACCEPTED.setdefault(case.id, [])

    @given(value=values(case))
    def one(value):
        n = next(_NUMBER)
        ex = run_example(case, value, work / f"e{n}", f"p{n}")
        # `check` decides; the loader every command shares must agree, and fail only with a ConfigError.
        loader = loader_verdict(ex.data)
        if not ex.accepted:
            problem = refusal_problems(ex.check, case)
            assert problem is None, f"{case.id} = {value!r}: refused, but {problem}"
            return
        # Accepted by check: the consumers outside Python see it whatever the in-process checks find.
        accepted.append(ex)
        assert loader is None, f"{case.id} = {value!r}: check accepted it, the loader refused: {loader}"
        failures = carried.in_process(ex)
        assert not failures, f"{case.id} = {value!r}:\n" + "\n".join(failures)

    for value in reversed(curated(case)):
        one = example(value=value)(one)
    one()
    return accepted


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_each_value_is_refused_naming_its_field_or_carried_exactly(case, tmp_path_factory):
    ACCEPTED.pop(case.id, None)
    explore(case, tmp_path_factory.mktemp(_slug(case)))


# ---- the consumers outside Python, over the session's accepted examples -------------------------------------


@pytest.fixture
def accepted_examples(request, tmp_path_factory) -> dict[str, list[Example]]:
    """The session's accepted examples, the requesting test's field explored first if its own test did not run."""
    case = request.node.callspec.params.get("case") if hasattr(request.node, "callspec") else None
    if case is not None and case.id not in ACCEPTED:
        explore(case, tmp_path_factory.mktemp(_slug(case)))
    return ACCEPTED


def _require(why_not: str | None, flag: str) -> None:
    require_or_skip(why_not is None, why_not or "", flag)


# consumer -> (the fields whose examples it has seen, its complaints): each consumer runs once over every
# example explored so far, and again only over fields explored after that.
_RESULTS: dict[str, tuple[set[str], batches.Failures]] = {}


_BROKEN: dict[str, str] = {}  # consumer -> how its batch run failed (told once, then by every test of it)


def _results(name: str, accepted: dict[str, list[Example]],
             run: Callable[[list[Example]], batches.Failures]) -> batches.Failures:
    if name in _BROKEN:
        pytest.fail(f"the {name} batch failed earlier in this session: {_BROKEN[name]}", pytrace=False)
    seen, failures = _RESULTS.setdefault(name, (set(), {}))
    new = [case_id for case_id in accepted if case_id not in seen]
    if new:
        seen.update(new)
        try:
            failures.update(run([e for case_id in new for e in accepted[case_id]]))
        except Exception as exc:
            _BROKEN[name] = f"{type(exc).__name__}: {str(exc)[:1000]}"
            raise
    return failures


def _assert_none_for(case: FieldCase, failures: batches.Failures, consumer: str) -> None:
    own = {k: v for k, v in failures.items() if k.startswith(f"{case.id} = ")}
    if own:
        # Shortest value first: the nearest thing to a minimal example a batch gives.
        shown = sorted(own.items(), key=lambda item: len(item[0]))[:4]
        pytest.fail(f"{consumer} refused or misread {len(own)} accepted value(s) of {case.id}:\n" +
                    "\n".join(f"  {k}\n    " + "\n    ".join(v)[:2500] for k, v in shown), pytrace=False)


@dataclass(frozen=True)
class Consumer:
    """A program that reads the rendered outputs, run once over a batch of examples (`run` takes them and
    tmp_path_factory.mktemp, for a work directory made only when a batch runs)."""

    batch: str  # its key in _RESULTS
    label: str  # how a failure names it
    why_not_usable: Callable[[], str | None]
    flag: str  # the variable with which CI turns its skip into a failure
    run: Callable[[list[Example], Callable[[str], Path]], batches.Failures]


VERIFY = Consumer("verify", "systemd-analyze verify", systemd.usable, "PDSERVE_REQUIRE_SYSTEMD",
                  lambda examples, mktemp: batches.systemd_verify(examples, mktemp("systemd-verify")))
READ_BACK = Consumer("read-back", "systemd (--test dump)", systemd.usable, "PDSERVE_REQUIRE_SYSTEMD",
                     lambda examples, _: batches.systemd_read_back(examples))
# The throwaway root needs what the container tier needs: root and mount namespaces.
PLANS = Consumer("plans", "bash (plan run against stubs) / sh -n", shell.usable, "PDSERVE_REQUIRE_CONTAINER",
                 lambda examples, mktemp: batches.plans(examples, mktemp("plans")))
NFT = Consumer("nft", "nft -c", nft.usable, "PDSERVE_REQUIRE_NFT",
               lambda examples, mktemp: batches.rulesets(examples, mktemp("nft")))
PROMTOOL = Consumer("promtool", "promtool", promtool.usable, "PDSERVE_REQUIRE_PROMETHEUS",
                    lambda examples, _: batches.prometheus(examples))


def _assert_consumer_takes(consumer: Consumer, case: FieldCase, accepted: dict[str, list[Example]],
                           tmp_path_factory: pytest.TempPathFactory) -> None:
    _require(consumer.why_not_usable(), consumer.flag)
    failures = _results(consumer.batch, accepted, lambda examples: consumer.run(examples, tmp_path_factory.mktemp))
    _assert_none_for(case, failures, consumer.label)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_units_pass_systemd_analyze_verify(case, accepted_examples, tmp_path_factory):
    _assert_consumer_takes(VERIFY, case, accepted_examples, tmp_path_factory)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_systemd_reads_back_the_planned_argv_and_environment(case, accepted_examples, tmp_path_factory):
    _assert_consumer_takes(READ_BACK, case, accepted_examples, tmp_path_factory)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_plain_plan_runs_as_planned_against_recording_stubs(case, accepted_examples, tmp_path_factory):
    _assert_consumer_takes(PLANS, case, accepted_examples, tmp_path_factory)


@pytest.mark.parametrize("case", [c for c in CASES if c.base == "multi"], ids=lambda c: c.id)
def test_every_hosts_ruleset_passes_nft_check(case, accepted_examples, tmp_path_factory):
    _assert_consumer_takes(NFT, case, accepted_examples, tmp_path_factory)


@pytest.mark.parametrize("case", [c for c in CASES if c.base == "single"], ids=lambda c: c.id)
def test_monitoring_files_pass_promtool(case, accepted_examples, tmp_path_factory):
    _assert_consumer_takes(PROMTOOL, case, accepted_examples, tmp_path_factory)


def test_the_tier_saw_accepted_values_for_most_fields():
    """A tier whose generated values are all refused proves nothing about the outputs: most fields explored in
    this session must have had accepted values rendered and consumed."""
    if len(ACCEPTED) < len(CASES):
        pytest.skip(f"only {len(ACCEPTED)} of {len(CASES)} fields were explored in this session")
    with_outputs = [case_id for case_id, examples in ACCEPTED.items() if examples]
    assert len(with_outputs) >= len(CASES) * 3 // 4, sorted({c.id for c in CASES} - set(with_outputs))
