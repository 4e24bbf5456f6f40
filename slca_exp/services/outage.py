"""A judge or simulator that failed every request of a step: said loudly, and it may stop the run.

    a step's metrics (``judge/requests``, ``judge/failures``, ``simulator/...``)
      -> ServiceWatch.observe: every request failed -> a warning line on stderr, the run's tag
         ``slca.outage.<service>`` (the steps so far) and, under ``reward.judge_failure=stop``,
         ServiceOutage: the run ends FAILED
    every metric a run logged -> failure_lines: the closing lines' failure counts

A failed request is one the service did not answer after its retries (``services/client.py``);
the reward never invents a score for it (``reward.judge_failure``), so a run whose judge is down
would otherwise train on tool rewards alone and end FINISHED. Both engines call the watch once
per RL step (the local engine in its loop, verl's in slca-exp's trainer).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from slca_exp.core.names import (
    JUDGE_FAILURES,
    JUDGE_REQUESTS,
    SIMULATOR_FAILURES,
    SIMULATOR_REQUESTS,
    val,
)
from slca_exp.core.tags import outage_tag
from slca_exp.services.failures import FAILURES, step_lines

SERVICES: Final[tuple[str, ...]] = ("judge", "simulator")
_REQUESTS: Final[dict[str, str]] = {"judge": JUDGE_REQUESTS, "simulator": SIMULATOR_REQUESTS}
_FAILURES: Final[dict[str, str]] = {"judge": JUDGE_FAILURES, "simulator": SIMULATOR_FAILURES}
STOP: Final = "stop"
"""The ``reward.judge_failure`` value that stops a run at such a step."""
_AFTERMATH: Final[dict[str, str]] = {
    "absent": "those summaries are absent from the advantages",
    "zero": "those summaries were scored 0 (reward.judge_failure=zero)",
}
_POLICY_HELP: Final = "Check that its server answers at the configured base_url (its log says why)"


def requests_key(service: str) -> str:
    """``<service>/requests``: the step's requests that reached the service."""
    return _REQUESTS[service]


def failures_key(service: str) -> str:
    """``<service>/failures``: those it did not answer after its retries."""
    return _FAILURES[service]


def outages(metrics: Mapping[str, float]) -> list[str]:
    """The services every one of whose requests in this step failed (at least one request).

    >>> outages({"judge/requests": 4.0, "judge/failures": 4.0, "simulator/requests": 0.0})
    ['judge']
    """
    found = []
    for service in SERVICES:
        asked = metrics.get(requests_key(service), 0.0)
        if asked > 0 and metrics.get(failures_key(service), 0.0) >= asked:
            found.append(service)
    return found


class ServiceOutage(RuntimeError):
    """Every request to the judge or the simulator failed in one RL step, under ``stop``."""


def outage_message(err: BaseException) -> str:
    """The outage's own message, also when Ray wrapped it (verl's trainer runs in an actor)."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, ServiceOutage):
        return str(cause)
    text = str(err)
    return next((line for line in text.splitlines() if "every" in line), text)


@dataclass
class ServiceWatch:
    """Watches each RL step's service metrics; see the module docstring.

    Attributes:
        policy: ``reward.judge_failure``: ``stop`` raises :class:`ServiceOutage` at the first
            step in which every request to a service failed; ``absent`` and ``zero`` go on.
        tag: sets a tag of the run (key, value); None: no tag.
        steps: service -> the RL steps in which every request to it failed.

    """

    policy: str = "absent"
    tag: Callable[[str, str], None] | None = None
    steps: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        FAILURES.drain()  # from now on this run's steps say its failures; none from before
    def observe(self, metrics: Mapping[str, float], step: int) -> None:
        """Check one RL step's metrics; warn, tag and (under ``stop``) raise on an outage.

        Raises:
            ServiceOutage: a service failed every request of this step and the policy is stop.

        """
        counts = FAILURES.drain()
        down = outages(metrics)
        quiet = {key: n for key, n in counts.items() if key[0] not in down}
        for line in step_lines(quiet, step):  # an outage's line below says its kinds
            print(line, file=sys.stderr, flush=True)
        for service in down:
            self.steps.setdefault(service, []).append(step)
            asked = int(metrics[requests_key(service)])
            what = _AFTERMATH.get(self.policy, "the run stops") if service == "judge" else (
                "the policy read 'tool unavailable' for every call"
            )  # fmt: skip
            kinds = "; ".join(f"{kind} ({n})" for (s, kind), n in counts.items() if s == service)
            print(
                f"slca-exp: WARNING: every {service} request of RL step {step} failed "
                f"({asked} of {asked}): {what}. {_POLICY_HELP} ({service}.base_url)."
                + (f" How they failed: {kinds}." if kinds else ""),
                file=sys.stderr,
                flush=True,
            )
            self._tag(service)
        if down and self.policy == STOP:
            names = " and ".join(down)
            raise ServiceOutage(
                f"every {names} request of RL step {step} failed, so the run stops "
                f"(reward.judge_failure=stop). {_POLICY_HELP}, or set "
                "reward.judge_failure=absent to train on without those requests."
            )

    def _tag(self, service: str) -> None:
        if self.tag is None:
            return
        try:
            self.tag(outage_tag(service), ",".join(map(str, self.steps[service]))[:5000])
        except Exception as err:  # the warning is out already; a store hiccup must not stop a run
            print(f"slca-exp: could not tag the run with the outage: {err}", file=sys.stderr)


def failure_lines(history: Mapping[str, Sequence[tuple[int, float]]]) -> list[str]:
    """The closing lines on failed judge and simulator requests; [] when none failed.

    ``history``: metric name -> (step, value) points of every metric the run logged (training
    steps and ``val/...``).

    >>> failure_lines({"judge/requests": [(1, 4.0), (2, 4.0)], "judge/failures": [(1, 4.0)]})
    ['judge: 4 of 8 requests failed; every request failed in RL step 1']
    """
    lines = []
    for service in SERVICES:
        requests, failures = requests_key(service), failures_key(service)
        asked = _total(history, requests) + _total(history, val(requests))
        failed = _total(history, failures) + _total(history, val(failures))
        if failed <= 0:
            continue
        line = f"{service}: {int(failed)} of {int(asked)} requests failed"
        steps = [step for step, metrics in _steps(history, service) if outages(metrics)]
        if steps:
            shown = ", ".join(map(str, steps[:10])) + (", ..." if len(steps) > 10 else "")
            line += f"; every request failed in RL step{'s' if len(steps) > 1 else ''} {shown}"
        lines.append(line)
    return lines


def _total(history: Mapping[str, Sequence[tuple[int, float]]], name: str) -> float:
    """The sum of a metric's logged values (0.0 when it was never logged)."""
    return sum((v for _, v in history.get(name, ())), 0.0)


def _steps(
    history: Mapping[str, Sequence[tuple[int, float]]], service: str
) -> list[tuple[int, dict[str, float]]]:
    """(step, that step's request and failure counts of ``service``), training steps only."""
    by_step: dict[int, dict[str, float]] = {}
    for key in (requests_key(service), failures_key(service)):
        for step, value in history.get(key, ()):
            by_step.setdefault(step, {})[key] = value
    return sorted(by_step.items())
