"""A resumed run joins the sweep that resumed it.

A job interrupted in one sweep keeps its checkpoint and its MLflow run under its run key
(``config/paths.py``). When another sweep (a different command line sharing that job) runs the
job again, the job continues the same run, and the run moves to the sweep that finished it:
its ``mlflow.parentRunId`` and ``slca.sweep`` tags name the new sweep, and the old parent keeps
a ``slca.moved.<run id>`` tag naming where it went, so neither sweep misreads the other. A
sweep that resumes itself (the same command line run again) keeps its own parent and moves
nothing.
"""

from __future__ import annotations

import json
from typing import Any

from slca_exp.core.tags import PARENT_RUN, SWEEP, moved_tag


def adopt(client: Any, run_id: str, parent_run_id: str | None, sweep_id: str | None) -> str | None:  # noqa: ANN401
    """Make ``run_id`` a child of ``parent_run_id`` (sweep ``sweep_id``) if it is not one yet.

    Returns:
        the parent run it moved from, or ``None`` (nothing moved: no sweep now, or the same).

    """
    if not parent_run_id:
        return None
    tags = client.get_run(run_id).data.tags
    old = tags.get(PARENT_RUN)
    if old == parent_run_id:
        return None
    client.set_tag(run_id, PARENT_RUN, parent_run_id)
    if sweep_id:
        client.set_tag(run_id, SWEEP, sweep_id)
    if old:
        record = {"parent_run_id": parent_run_id, "sweep": sweep_id}
        client.set_tag(old, moved_tag(run_id), json.dumps(record))
    return old
