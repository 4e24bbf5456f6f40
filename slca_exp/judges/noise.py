"""``judge.noise``: a judge whose ratings are perturbed, for studies of a noisy or biased judge.

:class:`NoisyJudge` wraps any judge (rubric, openai, a plugin's): the inner judge rates, its cache
keeps the raw ratings, and each ``ok`` result is then perturbed:

- ``gaussian``: ``rating + std * z``, ``z ~ N(0, 1)``, rounded half up and clipped to 1..5;
- ``flip``: with probability ``p`` the rating is replaced by a uniform draw from 1..5 (which may
  be the same rating).

Short-circuits and failures pass through untouched. The draws for a rollout come from a generator
seeded by the noise seed and the rollout's text (question and response), so rerunning a recipe
gives the same perturbed ratings, and two rollouts with the same text get the same one, as a
deterministic judge would give them. The draws do not depend on ``std`` or ``p``: a rating
flipped at ``p=0.5`` is also flipped at ``p=1`` (common random numbers across a sweep of the
level). Each result keeps the judge's own rating as ``raw_rating``.

Example:
    >>> from slca_exp.config.services import JudgeConfig, JudgeNoiseConfig
    >>> from slca_exp.judges import build_judge
    >>> cfg = JudgeConfig(min_reply_chars=0, noise=JudgeNoiseConfig(kind="flip", p=1.0))
    >>> request = JudgeRequest("q?", "<tool_response>x</tool_response> it is x", True)
    >>> first = build_judge(cfg, seed=0).score([request])[0]
    >>> first == build_judge(cfg, seed=0).score([request])[0], first.raw_rating is not None
    (True, True)

"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from slca_exp.rewards.judging import LABELS, Judge, JudgeRequest, JudgeResult
from slca_exp.services.backend import Closing

KINDS = ("none", "gaussian", "flip")
MIN_RATING, MAX_RATING = 1, len(LABELS)


def noise_fields(cfg: Any) -> dict[str, Any] | None:  # noqa: ANN401 - a judge.noise config
    """The recipe fields of ``judge.noise``, or ``None`` when it is off (``kind=none``).

    The seed is recorded as configured (``None``: the run's seed), so runs of a seed sweep share
    one judge description.
    """
    if cfg is None or cfg.kind == "none":
        return None
    fields: dict[str, Any] = {"kind": cfg.kind, "seed": cfg.seed}
    if cfg.kind == "gaussian":
        fields["std"] = float(cfg.std)
    else:
        fields["p"] = float(cfg.p)
    return fields


def perturbed_rating(rating: int, kind: str, level: float, draw: random.Random) -> int:
    """``rating`` after one draw of the noise ``kind`` at ``level`` (``std`` or ``p``).

    >>> perturbed_rating(3, "gaussian", 0.0, random.Random(0))
    3
    >>> {perturbed_rating(3, "flip", 1.0, random.Random(s)) for s in range(50)} == {1, 2, 3, 4, 5}
    True

    """
    if kind == "gaussian":
        z = draw.gauss(0.0, 1.0)
        return min(MAX_RATING, max(MIN_RATING, math.floor(rating + level * z + 0.5)))
    if kind == "flip":
        u, uniform = draw.random(), draw.randint(MIN_RATING, MAX_RATING)
        return uniform if u < level else rating
    raise ValueError(f"judge.noise.kind={kind!r} is not one of {', '.join(KINDS)}")


def request_draw(seed: int, request: JudgeRequest) -> random.Random:
    """The generator of one rollout's draws: seeded by ``seed`` and the rollout's text."""
    digest = hashlib.sha256(
        f"{seed}\x00{request.question}\x00{request.response_text}".encode()
    ).digest()
    return random.Random(int.from_bytes(digest[:16], "big"))


class NoisyJudge(Closing):
    """A judge whose ``ok`` ratings are perturbed by ``judge.noise`` (see the module)."""

    def __init__(self, inner: Judge, cfg: Any, seed: int) -> None:  # noqa: ANN401
        if cfg.kind not in KINDS or cfg.kind == "none":
            raise ValueError(
                f"judge.noise.kind={cfg.kind!r}: NoisyJudge needs gaussian or flip "
                "(kind=none is the judge itself)"
            )
        self.inner = inner
        self.noise = cfg
        self.kind = str(cfg.kind)
        self.level = float(cfg.std if self.kind == "gaussian" else cfg.p)
        self.seed = int(cfg.seed if cfg.seed is not None else seed)
        self.name = inner.name

    def perturb(self, request: JudgeRequest, result: JudgeResult) -> JudgeResult:
        """``result`` with its rating perturbed (``raw_rating`` keeps the judge's)."""
        if result.status != "ok" or result.rating is None:
            return result
        rating = perturbed_rating(
            result.rating, self.kind, self.level, request_draw(self.seed, request)
        )
        if rating == result.rating:
            return replace(result, raw_rating=result.rating)  # the judge's reason stands
        rated = JudgeResult.rated(rating, cached=result.cached, latency_ms=result.latency_ms)
        reason = f"{rated.reason} (judge: {result.reason}; judge.noise={self.kind})"
        return replace(rated, reason=reason, raw_rating=result.rating)

    async def ascore(self, batch: Sequence[JudgeRequest]) -> list[JudgeResult]:
        """The inner judge's results, perturbed."""
        results = await self.inner.ascore(batch)
        return [self.perturb(q, r) for q, r in zip(batch, results, strict=True)]

    def score(self, batch: Sequence[JudgeRequest]) -> list[JudgeResult]:
        """The inner judge's results, perturbed (blocking)."""
        results = self.inner.score(batch)
        return [self.perturb(q, r) for q, r in zip(batch, results, strict=True)]

    def describe(self) -> dict[str, Any]:
        """The inner judge's recipe fields and ``noise``."""
        return {**self.inner.describe(), "noise": noise_fields(self.noise)}

    def stats(self) -> dict[str, float]:
        """The inner judge's counters."""
        return self.inner.stats()

    def close(self) -> None:
        """Close the inner judge."""
        self.inner.close()

    def __repr__(self) -> str:
        return f"NoisyJudge({self.inner!r}, kind={self.kind}, level={self.level:g})"
