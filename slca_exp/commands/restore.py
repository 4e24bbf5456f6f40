"""``slca-exp restore``: a study file's sweep written back into an MLflow store, to resume there.

    slca-exp restore FILE.json.gz [--tracking-uri URI]

A sweep's store can be lost (a machine handed back, a scratch disk wiped) or left behind (a
study moved from a workstation to a cluster). Its study file (``slca-exp compare SWEEP
--save-study FILE.json.gz``) holds what resuming needs: the parent run with the sweep's key,
command line and attempts, and every compared run with its job number, status and recipe
fingerprint. ``restore`` writes them into the store (each run tagged ``slca.copy_of`` with the
id it had; ``slca_exp/analysis/study_file.py``). The sweep's own ``slca-exp train -m ...``
command, run again from the folder it ran in, then keeps every FINISHED job whose recipe
fingerprint still matches and runs the rest under the restored parent run. What a study file
does not hold (checkpoints, traces, rollouts but the final validation's) is not restored: a job
that was interrupted starts again from its beginning.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from slca_exp.core.problems import EXIT_BAD_CONFIG


def _parser() -> argparse.ArgumentParser:
    # Plain text: the module docstring's markup would reach the terminal as it is.
    parser = argparse.ArgumentParser(
        prog="slca-exp restore",
        description="Write the sweep a study file holds (slca-exp compare SWEEP --save-study "
        "FILE.json.gz) into an MLflow store, so that the sweep's own command, run again, "
        "resumes it there: FINISHED jobs whose recipe fingerprint still matches are kept, the "
        "rest run. Each run is tagged slca.copy_of with the id it had.",
    )
    parser.add_argument("study", metavar="FILE.json.gz", help="a study file")
    parser.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="the store to write into; default: the store slca-exp train logs to "
        "(sqlite:///outputs/mlflow.db, or $SLCA_EXP_ROOT, or $MLFLOW_TRACKING_URI)",
    )
    return parser


def main(argv: Sequence[str]) -> int:
    """Run ``slca-exp restore``; returns the exit status (0, or 2 for a refusal)."""
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exit_:  # argparse has printed the usage and the reason
        return int(exit_.code or 0)
    from slca_exp.analysis.study_file import StudyFileError, restore_study
    from slca_exp.tracking.uris import absolute_uri, default_tracking_uri

    uri = absolute_uri(args.tracking_uri) if args.tracking_uri else default_tracking_uri()
    path = Path(args.study)
    if not path.is_file():
        print(f"slca-exp restore: {path}: no such file", file=sys.stderr)
        return EXIT_BAD_CONFIG
    try:
        restored = restore_study(path, uri)
    except StudyFileError as err:
        print(f"slca-exp restore: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    counts = ", ".join(f"{n} {status}" for status, n in sorted(restored.statuses.items()))
    print(
        f"slca-exp: restored sweep {restored.sweep} into {uri}: parent run "
        f"{restored.parent_run_id}, {sum(restored.statuses.values())} runs ({counts})"
    )
    if restored.command:
        command = shlex.join(["slca-exp", "train", *restored.command])
        print(
            "slca-exp: to resume it, run its command again from the folder it ran in (add "
            f"--dry-run first to see which jobs run): {command}"
        )
    return 0
