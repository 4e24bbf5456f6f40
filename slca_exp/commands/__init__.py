"""``slca-exp``: the command line.

    slca-exp train [--dry-run] [--offline] [HYDRA FLAGS] [OVERRIDES]  run (or with --cfg job,
                   print; with --dry-run, check and describe) a recipe
    slca-exp validate [--offline] [-m] [HYDRA FLAGS] [OVERRIDES]  check every job, report every
                      problem
    slca-exp compare EXPERIMENT_OR_SWEEP [--metric M ...] [--strict] [--tracking-uri URI]
                     [--out DIR] [--ui-url URL]  table, plots and MLflow compare link of a sweep
    slca-exp restore FILE.json.gz [--tracking-uri URI]  a study file's sweep written back into a
                     store, where its own command resumes it
    slca-exp rollouts RUN [--step N] [--val] [--best | --worst] [--html OUT] [--tracking-uri URI]
                      a run's logged rollouts: rewards, segment advantages, the turns by segment
    slca-exp rejudge RUN_OR_SWEEP judge=OPTION [judge.KEY=VALUE ...] [--split all|train|val]
                     [--tracking-uri URI]  the logged rollouts rated by another judge, as feedback
                     on their traces; how the judges agree
    slca-exp ui [--tracking-uri URI] [--host HOST] [--port PORT]  MLflow's UI on the runs'
                store, each experiment in its own view (training runs: Model training)
    slca-exp serve up service=NAME [launcher=PROFILE] | status | down NAME  the frozen judge and
                   simulator as SLURM jobs, recorded in the service registry
    slca-exp eval RUN_OR_SWEEP [benchmark=NAME] [eval=NAME] [--dry-run]  score checkpoints on a
                  benchmark (BFCL) served by vLLM; the scores go into the runs that trained them
    slca-exp data synth --out DIR [--rows N] [--seed S]  write the seeded synthetic split

Each command answers --help, and is a module of this package (:data:`COMMANDS`); ``train``
(:mod:`~slca_exp.commands.train`) says how the checks before anything starts run.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from slca_exp.core.problems import EXIT_BAD_CONFIG

USAGE = __doc__.split("\n\n")[1]

COMMANDS = (
    "train",
    "validate",
    "compare",
    "restore",
    "rollouts",
    "rejudge",
    "ui",
    "serve",
    "eval",
    "data",
)
"""Each is a module of this package whose ``main(argv) -> int`` runs it."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(f"usage:\n{USAGE}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    if args[0] in ("-h", "--help", "help"):
        print(f"usage:\n{USAGE}")
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"slca-exp: unknown command {command!r}\nusage:\n{USAGE}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    return importlib.import_module(f"{__name__}.{command}").main(rest)


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
