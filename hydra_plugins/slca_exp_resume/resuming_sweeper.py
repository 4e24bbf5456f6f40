"""Hydra's basic sweeper, launching only the jobs a resumed sweep still has to run.

``slca-exp train`` plans each attempt of a sweep (``slca_exp.launch.resume``) and hands the
plan over in ``$SLCA_EXP_SWEEP_PLAN``. This sweeper expands the command line exactly as Hydra's
basic sweeper does, then keeps the planned jobs of each batch, so a launcher that submits (the
SLURM one) gets one array of just those. Each kept job carries its number in the whole sweep
(``hydra.job.env_set.SLCA_EXP_JOB_NUM``) and, where the sweep's folders are numbered as Hydra
numbers them by default, its own folder (``hydra.sweep.subdir``), since Hydra numbers the jobs
it launches from 0. Without a plan it is the basic sweeper.
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.errors import HydraException
from omegaconf import OmegaConf

DEFAULT_SUBDIR = "${hydra.job.num}"
"""Hydra's default ``hydra.sweep.subdir``: one folder per job number."""


class ResumingSweeper(BasicSweeper):
    """:class:`BasicSweeper` that launches the jobs of ``$SLCA_EXP_SWEEP_PLAN`` only."""

    def __init__(self, max_batch_size: int | None = None, params: dict | None = None) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self._first = 0  # the sweep-wide number of the next batch's first job

    def get_job_batch(self) -> Sequence[Sequence[str]]:
        """The next batch's planned jobs (every job when there is no plan)."""
        from slca_exp.launch.resume import SweepPlan

        plan = SweepPlan.from_env()
        while True:
            batch = super().get_job_batch()
            first, self._first = self._first, self._first + len(batch)
            if plan is None:
                return batch
            kept = []
            for num, job in enumerate(batch, start=first):
                if num >= len(plan.jobs) or list(job) != plan.jobs[num]:
                    raise HydraException(
                        f"job {num} ({' '.join(job)}) is not the job slca-exp train checked "
                        f"({' '.join(plan.jobs[num]) if num < len(plan.jobs) else 'none'}): "
                        "run sweeps through `slca-exp train -m`"
                    )
                if num in plan.run:
                    kept.append([*job, *self._numbered(num)])
            if kept or self.is_done():
                return kept

    def _numbered(self, num: int) -> list[str]:
        """Hydra-side overrides giving job ``num`` its number and (default layout) folder."""
        from slca_exp.launch.resume import JOB_NUM_ENV

        out = [f"++hydra.job.env_set.{JOB_NUM_ENV}={num}"]
        assert self.config is not None
        subdir = OmegaConf.to_container(self.config.hydra.sweep, resolve=False).get("subdir")
        if subdir == DEFAULT_SUBDIR:
            out.append(f"hydra.sweep.subdir={num}")
        return out
