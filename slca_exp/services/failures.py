"""Failed judge and simulator requests, said once per kind and step instead of once each.

A misconfigured server fails every request the same way: a judge whose ``max_tokens`` its
server cannot take answers HTTP 400 to each of a step's requests. One warning per request
buries the progress line and says nothing the first one did not. So each failed request is
counted here (:data:`FAILURES`) by service and kind (its reason, without the attempt count),
and said:

- once per RL step and kind, with the step's count, where the run's steps are watched in the
  process that sent the requests (the local engine: ``ServiceWatch.observe`` drains the counts
  after each step);
- once per process and kind otherwise (verl's reward and agent-loop workers send the requests
  while the trainer watches the steps elsewhere): the first request of a kind to fail is logged
  with its reason, the rest are counted in ``<service>/failures`` at every step.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter

log = logging.getLogger("slca_exp.services")

_ATTEMPTS = re.compile(r" after \d+ attempts$")
KIND_CHARS = 200
"""How much of a failure's reason names its kind (a server's message can be long)."""


def failure_kind(reason: str) -> str:
    """A failure's reason without what differs between requests of the same kind.

    >>> failure_kind("HTTP 500 after 4 attempts")
    'HTTP 500'
    """
    return _ATTEMPTS.sub("", reason.strip())[:KIND_CHARS]


class FailureDigest:
    """The failed requests of this process, by (service, kind), since they were last said."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()
        self._said: set[tuple[str, str]] = set()
        self._stepped = False

    def note(self, service: str, reason: str, kind: str | None = None) -> None:
        """Count one failed request; log it if no step will say it and it is a new kind.

        Args:
            service: ``judge`` or ``simulator``.
            reason: why it failed.
            kind: what it counts as (default: the reason without its attempt count).

        """
        key = (service, kind or failure_kind(reason))
        with self._lock:
            self._counts[key] += 1
            first = not self._stepped and key not in self._said
            self._said.add(key)
        if first:
            log.warning(
                "%s request failed: %s (the requests that fail like it are counted in "
                "%s/failures, not said again)",
                service,
                key[1],
                service,
            )
        else:
            log.debug("%s request failed: %s", service, reason)

    def drain(self) -> dict[tuple[str, str], int]:
        """The counts since the last drain, cleared; from now on the steps say them."""
        with self._lock:
            self._stepped = True
            counts, self._counts = dict(self._counts), Counter()
        return counts


def step_lines(counts: dict[tuple[str, str], int], step: int) -> list[str]:
    """One line per service and kind of failure of an RL step.

    >>> step_lines({("judge", "HTTP 400: too long"): 16}, 3)
    ['slca-exp: judge: 16 requests failed in RL step 3: HTTP 400: too long']
    """
    return [
        f"slca-exp: {service}: {n} request{'s' if n != 1 else ''} failed in RL step {step}: "
        f"{kind}"
        for (service, kind), n in sorted(counts.items())
    ]


FAILURES = FailureDigest()
"""This process's failed requests (every :class:`~slca_exp.services.client.ChatClient` notes
its failures here)."""
