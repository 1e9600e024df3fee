"""Every smg_* family, label and value pdserve reads (alert rules, dashboard, `pdserve verify`) against the REAL
router binary installed (smg, the pinned version), in front of the stand-in workers, driven through what
tests/fixtures/smg_exposition.py does: requests served, a failed KV hand-off, a second router whose prefill
bootstrap port refuses, the prefill stopped until the router answers 503 no_available_workers.

The unit tests read the recorded expositions instead (tests/fixtures/recorded/smg-<version>-*.prom); here the
recordings are held to the binary too, so one that no longer says what the binary says fails here.
"""

from __future__ import annotations

from importlib import metadata

import pytest

from pdserve.render.monitoring import metrics as m
from pdserve.schema.pins import ROUTER_DISTRIBUTION, ROUTER_VERSION
from tests.fixtures import smg_exposition
from tests.fixtures.promql_refs import problems
from tests.unit.test_monitoring import router_refs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> dict[str, str]:
    assert metadata.version(ROUTER_DISTRIBUTION) == ROUTER_VERSION, "the installed router is not the pinned one"
    return smg_exposition.run(tmp_path_factory.mktemp("smg-metrics"))


def test_every_router_metric_label_and_value_read_is_one_the_binary_exposes(live, reference):
    exposed = smg_exposition.merged(*live.values())
    found = router_refs(reference)
    wrong = [problem for ref in found for problem in problems(ref, exposed)]
    assert not wrong, wrong
    # The events the phases stand for happened, each seen where the alerts look for it.
    faults = smg_exposition.families(live["faults"])
    assert m.NO_WORKERS in faults[m.ROUTER_HTTP_RESPONSES]["error_code"]
    assert {m.PD_TTFT, m.PD_PREFILL_DURATION} <= set(faults)
    refused = smg_exposition.families(live["bootstrap_refused"])[m.PD_RENDEZVOUS_FAILURES]
    assert refused == {"leg": {"prefill"}, "phase": {m.BOOTSTRAP_PROBE}}


@pytest.mark.parametrize("phase", smg_exposition.PHASES)
def test_the_recorded_expositions_say_what_the_binary_says(live, reference, phase):
    """For each family pdserve reads: present in the recording exactly when present live, with the same label
    names, and each value pdserve matches on seen in both or in neither (some appear only with their event)."""
    now, then = smg_exposition.families(live[phase]), smg_exposition.families(smg_exposition.recorded(phase))
    read = {ref.family for ref in router_refs(reference)}
    assert {f for f in read if f in now} == {f for f in read if f in then}, phase
    assert {f: set(now[f]) for f in read if f in now} == {f: set(then[f]) for f in read if f in then}
    for ref in router_refs(reference):
        if ref.family in now:
            assert problems(ref, now) == problems(ref, then), (phase, ref)
