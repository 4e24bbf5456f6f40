"""A step in which every judge or simulator request failed: found, said, tagged, and under
``reward.judge_failure=stop`` the end of the run; the closing lines count the failures."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.services.outage import (
    SERVICES,
    ServiceOutage,
    ServiceWatch,
    failure_lines,
    outage_message,
    outages,
)

COUNTS = st.tuples(st.integers(0, 20), st.integers(0, 20)).map(
    lambda pair: (float(pair[0]), float(min(pair))),  # (requests, failures <= requests)
)


@settings(max_examples=100, deadline=None)
@given(st.fixed_dictionaries({s: COUNTS for s in SERVICES}))
def test_an_outage_is_a_step_with_requests_that_all_failed(counts):
    metrics = {}
    for service, (asked, failed) in counts.items():
        metrics[f"{service}/requests"], metrics[f"{service}/failures"] = asked, failed
    expected = [s for s in SERVICES if counts[s][0] > 0 and counts[s][1] == counts[s][0]]
    assert outages(metrics) == expected


def test_a_step_without_requests_or_without_the_counts_is_no_outage():
    assert outages({"judge/requests": 0.0, "judge/failures": 0.0}) == []
    assert outages({"judge/failures": 3.0}) == []  # another engine that logs no requests


def test_absent_goes_on_loudly_and_tags_the_steps(capsys):
    tags = {}
    watch = ServiceWatch("absent", tag=tags.__setitem__)
    down = {"judge/requests": 8.0, "judge/failures": 8.0, "simulator/requests": 3.0}
    watch.observe(down, 3)
    watch.observe({"judge/requests": 8.0, "judge/failures": 2.0}, 4)  # some answered
    watch.observe({**down, "simulator/failures": 3.0}, 5)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "slca-exp: WARNING: every judge request of RL step 3 failed (8 of 8): those summaries "
        "are absent from the advantages. Check that its server answers at the configured "
        "base_url (its log says why) (judge.base_url).",
        "slca-exp: WARNING: every judge request of RL step 5 failed (8 of 8): those summaries "
        "are absent from the advantages. Check that its server answers at the configured "
        "base_url (its log says why) (judge.base_url).",
        "slca-exp: WARNING: every simulator request of RL step 5 failed (3 of 3): the policy "
        "read 'tool unavailable' for every call. Check that its server answers at the "
        "configured base_url (its log says why) (simulator.base_url).",
    ]
    assert tags == {"slca.outage.judge": "3,5", "slca.outage.simulator": "5"}
    assert watch.steps == {"judge": [3, 5], "simulator": [5]}


def test_zero_says_the_summaries_were_scored_0(capsys):
    ServiceWatch("zero").observe({"judge/requests": 2.0, "judge/failures": 2.0}, 1)
    assert "scored 0 (reward.judge_failure=zero)" in capsys.readouterr().err


def test_stop_ends_the_run_at_the_first_outage_and_a_failing_tag_does_not_hide_it(capsys):
    def broken(key, value):
        raise ConnectionError("store down")

    watch = ServiceWatch("stop", tag=broken)
    watch.observe({"judge/requests": 2.0, "judge/failures": 1.0}, 1)
    with pytest.raises(ServiceOutage) as stopped:
        watch.observe({"simulator/requests": 2.0, "simulator/failures": 2.0}, 2)
    assert str(stopped.value).startswith(
        "every simulator request of RL step 2 failed, so the run stops (reward.judge_failure=stop)"
    )
    assert "could not tag the run with the outage: store down" in capsys.readouterr().err


def test_the_message_of_an_outage_raised_in_a_ray_actor_is_its_own():
    class RayTaskError(Exception):  # Ray keeps the actor's exception as ``cause``
        def __init__(self, cause):
            super().__init__(f"ray::TaskRunner.run() (pid=1)\nTraceback ...\n{cause}")
            self.cause = cause

    outage = ServiceOutage("every judge request of RL step 2 failed, so the run stops")
    assert outage_message(RayTaskError(outage)) == str(outage)
    assert outage_message(outage) == str(outage)


@settings(max_examples=60, deadline=None)
@given(st.lists(COUNTS, max_size=12), st.lists(COUNTS, max_size=3))
def test_the_closing_lines_count_every_request_of_training_and_validation(train, val):
    history = {
        "judge/requests": [(i + 1, a) for i, (a, _) in enumerate(train)],
        "judge/failures": [(i + 1, f) for i, (_, f) in enumerate(train)],
        "val/judge/requests": [(i, a) for i, (a, _) in enumerate(val)],
        "val/judge/failures": [(i, f) for i, (_, f) in enumerate(val)],
    }
    failed = int(sum(f for _, f in train + val))
    asked = int(sum(a for a, _ in train + val))
    lines = failure_lines(history)
    if not failed:
        assert lines == []
        return
    (line,) = lines
    assert line.startswith(f"judge: {failed} of {asked} requests failed")
    down = [i + 1 for i, (a, f) in enumerate(train) if a > 0 and f == a]
    assert ("every request failed in RL step" in line) == bool(down)
    if down:
        assert line.endswith(", ".join(map(str, down[:10])) + (", ..." if len(down) > 10 else ""))
