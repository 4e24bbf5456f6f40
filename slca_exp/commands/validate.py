"""``slca-exp validate``: check every job of a recipe as ``train`` would, and create nothing."""

from __future__ import annotations

from collections.abc import Sequence

from slca_exp.core.problems import ConfigError, refuse
from slca_exp.launch.command import OWN_FLAGS, check_jobs, read_command_line
from slca_exp.plugins import load_plugins

HELP = """\
usage: slca-exp validate [--offline] [-m] [--config-dir DIR] [--config-name NAME] [OVERRIDES]

Check a recipe as slca-exp train would before it starts, for every job of a sweep (-m): the
config, the recipe's files and weights, the engine's own check, the launcher, and whether each
remote judge and simulator answers. Prints every problem (exit 2) or "the recipe is valid"
(exit 0); creates nothing. A synthetic split that a run would generate is reported as such.

options:
  --offline        do not ask the judge and simulator servers whether they answer
  -m, --multirun   the overrides list values to sweep over (a=1,2): check every job
  --config-dir DIR     a folder of your own options
  --config-name NAME   the primary config (default: config)
  -h, --help       this help
"""


def main(argv: Sequence[str]) -> int:
    """Run ``slca-exp validate``; returns the exit status (0, or 2 listing every problem)."""
    rest = list(argv)
    if "-h" in rest or "--help" in rest:
        print(HELP)
        return 0
    try:
        load_plugins()
    except ConfigError as err:
        return refuse(err.problems, err.subject)
    offline = "--offline" in rest
    command = read_command_line([a for a in rest if a not in OWN_FLAGS])
    checked = check_jobs(command, probe=not offline)
    if checked.problems:
        return refuse(checked.problems)
    from slca_exp.evaluation.options import after_train

    after = {p: None for c in checked.typed for p in after_train(c)[2]}  # once each, in order
    if after:
        return refuse(list(after))
    for note in checked.notes:
        print(f"slca-exp: {note}")
    jobs = len(checked.jobs)
    print(f"slca-exp: the recipe is valid ({jobs} job{'s' if jobs != 1 else ''})")
    return 0
