"""How much of a difference's spread over seeds is evaluation noise, and what reaches a verdict.

``compare --variance``, for each cell's difference ``b - a`` of a validation reward between two
levels that pair up by seed. A run's validation score is a mean over its validation prompts, so
it carries evaluation noise (which prompts, and which sample of each) on top of what training
with that seed did; more validation rows shrink the first, only more seeds the second.

- between seeds: ``s_d^2``, the variance of the per-seed differences ``d_s``;
- evaluation: for each seed, the two runs' final validation rollouts paired by prompt
  (:mod:`slca_exp.rollouts.pairing`), ``var(b_p - a_p) / R`` over its ``R`` paired prompts: the
  variance of ``d_s`` that the choice of prompts alone gives; ``E`` is its mean over the seeds;
- training: what is left, ``T = max(0, s_d^2 - E)``.

With ``R'`` validation rows instead of ``R``, the spread of a seed's difference would be
``sqrt(T + E * R / R')``; from it :func:`~slca_exp.analysis.estimates.seeds_needed` gives the
seeds that separate the measured difference and, with a margin,
:func:`~slca_exp.analysis.intervals.seeds_to_show_equivalence` those that show it inside the
margin (80% power each). The per-prompt scores are the final validation's rollout records the
runs log (``tracking.rollouts``, the ``val`` split); a split needs every validation rollout
logged (``tracking.rollouts.val`` at least ``engine.val_rows``), which is checked: their mean
must be the run's metric.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from slca_exp.analysis.differences import Effect
from slca_exp.analysis.estimates import seeds_needed
from slca_exp.analysis.intervals import seeds_to_show_equivalence
from slca_exp.core import names

FIELDS = {
    names.val(names.REWARD_TOOL_MEAN): "tool",
    names.val(names.REWARD_SUMMARY_MEAN): "summary",
    names.val(names.REWARD_TOTAL_MEAN): "total",
}
"""Validation metrics whose per-prompt scores the rollout records hold (their reward field)."""
ROW_FACTORS = (1, 2, 4, 8)
"""The validation sizes the sizing advice looks at, as multiples of the one the runs used."""


@dataclass(frozen=True)
class Split:
    """One cell's difference, its spread over seeds taken apart, and the sizing it implies."""

    effect: Effect
    seeds: int
    rows: int
    """Validation prompts paired per seed (the smallest over the seeds)."""
    mean: float
    between: float
    """``s_d^2``."""
    evaluation: float
    """``E``."""

    @property
    def training(self) -> float:
        """``T``: the between-seed variance the evaluation does not explain (0 at least)."""
        return max(0.0, self.between - self.evaluation)

    def sd_at(self, rows: float) -> float:
        """The spread of one seed's difference with ``rows`` validation prompts."""
        return math.sqrt(self.training + self.evaluation * self.rows / rows)

    def advice(self, margin: float | None) -> list[tuple[int, int | None, int | None]]:
        """(rows, seeds to separate, seeds to show equivalence) for each of :data:`ROW_FACTORS`."""
        out = []
        for factor in ROW_FACTORS:
            rows = self.rows * factor
            sd = self.sd_at(rows)
            separate = seeds_needed(self.mean, sd, paired=True)
            equal = (
                seeds_to_show_equivalence(self.mean, sd, margin, paired=True)
                if margin is not None
                else None
            )
            out.append((rows, separate, equal))
        return out


def split_of(effect: Effect, per_seed: Sequence[Sequence[float]]) -> Split | None:
    """The split of ``effect`` given each seed's per-prompt differences ``b_p - a_p``.

    ``per_seed`` follows the order of the effect's paired observations. ``None`` when fewer than
    two seeds pair up, or a seed has fewer than two paired prompts.
    """
    a, b, paired = effect.observations()
    if not paired or len(a) < 2 or len(per_seed) != len(a) or min(map(len, per_seed)) < 2:
        return None
    diffs = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    evaluation = [float(np.var(d, ddof=1)) / len(d) for d in per_seed]
    return Split(
        effect,
        len(diffs),
        min(len(d) for d in per_seed),
        float(np.mean(diffs)),
        float(np.var(diffs, ddof=1)),
        float(np.mean(evaluation)),
    )


def splits(
    observe: Any,  # noqa: ANN401 - an analysis.runs.Observations
    found: Sequence[Effect],
    runs_of: Any,  # noqa: ANN401 - (effect, seed) -> (run of level a, run of level b)
) -> tuple[list[Split], list[str]]:
    """The split of every paired cell of a validation reward; and what could not be split, why."""
    from slca_exp.rollouts.pairing import pair_rollouts

    records = observe.final_val_records

    out, missing = [], []
    for effect in found:
        field = FIELDS.get(effect.metric)
        if field is None or not effect.estimate.test.startswith("paired"):
            continue
        per_seed, partial = [], []
        a, b, _ = effect.observations()
        for seed, seen in zip(effect.paired_seeds(), zip(a, b, strict=True), strict=True):
            runs = runs_of(effect, seed)
            for run, observed in zip(runs, seen, strict=True):
                if not _holds_all(records(run), field, observed):
                    partial.append(run.info.run_id)
            pairs = pair_rollouts(records(runs[0]), records(runs[1])).pairs
            per_seed.append([d for p in pairs if (d := p.delta(field)) is not None])
        got = None if partial else split_of(effect, per_seed)
        if partial:
            missing.append(
                f"{effect.label} at {effect.cell_label}, {effect.metric}: the logged validation "
                f"rollouts of run {partial[0]} are not all of its validation prompts (their mean "
                "is not the run's metric); log every one with tracking.rollouts.val >= "
                "engine.val_rows"
            )
        elif got is None:
            missing.append(
                f"{effect.label} at {effect.cell_label}, {effect.metric}: no per-prompt "
                "validation scores for every seed (the runs log them with tracking.rollouts)"
            )
        else:
            out.append(got)
    return out, missing


def _holds_all(records: Sequence[Any], field: str, observed: float) -> bool:
    """Whether ``records`` are all the validation rollouts behind the run's ``observed`` mean.

    The engines log the first ``tracking.rollouts.val`` of a validation's rollouts; the
    variance split needs every one (their mean is then the run's metric, up to rounding).
    """
    values = [getattr(r.rewards, field) for r in records]
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return bool(finite) and math.isclose(math.fsum(finite) / len(finite), observed, abs_tol=1e-9)


def split_rows(found: Sequence[Split], margin: float | None) -> tuple[list[str], list[list[str]]]:
    """The splits as a table, with the seeds each validation size would need."""
    header = ["difference", "cell", "metric", "seeds", "rows", "mean diff", "sd over seeds"]
    header += ["evaluation", "training"]
    wanted = "seeds to separate" + (f" / to show ±{margin:g}" if margin is not None else "")
    header += [f"{wanted} at {f}x rows" for f in ROW_FACTORS]
    rows = []
    for s in found:
        total = s.between if s.between > 0 else 1.0
        row = [s.effect.label, s.effect.cell_label, s.effect.metric, str(s.seeds), str(s.rows)]
        row += [f"{s.mean:+.4g}", f"{math.sqrt(s.between):.4g}"]
        row += [f"{min(s.evaluation, s.between) / total:.0%}", f"{s.training / total:.0%}"]
        for rows_at, separate, equal in s.advice(margin):
            cell = f"{rows_at} rows: {separate or '-'}"
            row.append(cell + (f" / {equal or '-'}" if margin is not None else ""))
        rows.append(row)
    return header, rows
