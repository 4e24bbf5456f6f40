"""``slca-exp``: the command line.

    slca-exp train [--dry-run] [--offline] [HYDRA FLAGS] [OVERRIDES]  run (or with --cfg job,
                   print; with --dry-run, check and describe) a recipe
    slca-exp validate [--offline] [-m] [HYDRA FLAGS] [OVERRIDES]  check every job, report every
                      problem
    slca-exp compare EXPERIMENT_OR_SWEEP [--metric M ...] [--strict] [--tracking-uri URI]
                     [--out DIR] [--ui-url URL]  table, plots and MLflow compare link of a sweep
    slca-exp rollouts RUN [--step N] [--val] [--best | --worst] [--html OUT] [--tracking-uri URI]
                      a run's logged rollouts: rewards, segment advantages, the turns by segment
    slca-exp ui [--tracking-uri URI] [--host HOST] [--port PORT]  MLflow's UI on the runs'
                store, each experiment in its own view (training runs: Model training)
    slca-exp serve up service=NAME [launcher=PROFILE] | status | down NAME  the frozen judge and
                   simulator as SLURM jobs, recorded in the service registry
    slca-exp data synth --out DIR [--rows N] [--seed S]  write the seeded synthetic split

Each command answers --help. train and validate accept Hydra's own flags (``--config-dir``,
``--config-name``, ``-m``, ``--cfg``) and overrides. ``validate``, ``train --dry-run``, ``train
--cfg job`` and ``train`` itself run the same checks before anything starts
(:mod:`slca_exp.preflight`); a bad recipe exits with status 2 and one message listing every
problem, before Hydra creates anything (no output folder, no run, no job). The first three also
ask each remote judge and simulator whether it answers (``--offline`` skips that).

Two more overrides are the CLI's own (``slca_exp/launch/command.py``): ``launcher=<profile>``
(plus ``launcher.<key>=<value>``) picks a cluster profile from launchers/, ``sweep=<study>`` a
ready study from sweeps/ (with ``-m``). ``train --dry-run`` checks every job's config, then
prints the jobs, the resources and the sbatch script, and submits and creates nothing.
"""

from __future__ import annotations

import contextlib
import functools
import io
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from slca_exp.core.problems import ConfigError, Problem
from slca_exp.plugins import load_plugins
from slca_exp.preflight.compose import CONFIG_NAME

if TYPE_CHECKING:
    from slca_exp.tracking.redact import Redactor

USAGE = __doc__.split("\n\n")[1]

EXIT_BAD_CONFIG = 2

_OWN_FLAGS = ("--dry-run", "--offline")

TRAIN_HELP = """\
usage: slca-exp train [--dry-run] [--offline] [-m] [HYDRA FLAGS] [OVERRIDES]

Run a recipe: every job is checked first (the config, the recipe's files and weights, the
engine's own check); a bad recipe exits 2 listing every problem, and nothing is created.

options:
  --dry-run        check every job, then print the jobs, the resources and (SLURM) the sbatch
                   script; submits nothing, runs nothing
  --offline        --dry-run / --cfg: do not ask the judge and simulator servers whether they
                   answer (when they start with the job, on the cluster)
  -m, --multirun   run one job per combination of the listed values (a=1,2 b=x,y)
  --cfg job|hydra|all  print the composed config of every job, then its problems (exit 2);
                   runs and submits nothing
  --resolve        with --cfg: resolve interpolations
  --config-dir DIR     a folder of your own options (DIR/judge/my_judge.yaml: judge=my_judge)
  --config-name NAME   the primary config (default: config)
  --hydra-help     Hydra's own help
  -h, --help       this help

overrides:
  group=option     pick an option of a config group (below)
  key=value        set a value (reward.tool_weights.name=0.3); every key and its value:
                   slca-exp train --cfg job
  launcher=NAME    a cluster profile (launchers/); launcher.<key>=value adjusts it
  sweep=NAME       a ready study (sweeps/), with -m

config groups:
{groups}
"""

VALIDATE_HELP = """\
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

_HIDDEN_GROUPS = ("schema", "service")
"""Config groups a run does not pick: internal (the schemas YAML options merge onto), or read by
another command (``service``: ``slca-exp serve up``)."""


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
    if command in ("train", "validate") and ("-h" in rest or "--help" in rest):
        print(VALIDATE_HELP if command == "validate" else TRAIN_HELP.format(groups=_groups()))
        return 0
    if command in ("train", "validate"):
        try:
            load_plugins()
        except ConfigError as err:
            print(f"slca-exp: {err}", file=sys.stderr)
            return EXIT_BAD_CONFIG
    if command == "validate":
        return _validate(rest)
    if command == "train":
        return _train(rest)
    if command == "compare":
        from slca_exp.compare import main as compare

        return compare(rest)
    if command == "rollouts":
        from slca_exp.tracking.rollouts_cli import main as rollouts

        return rollouts(rest)
    if command == "ui":
        from slca_exp.ui import main as ui

        return ui(rest)
    if command == "data":
        from slca_exp.data.cli import main as data

        return data(rest)
    if command == "serve":
        from slca_exp.serve.cli import main as serve

        return serve(rest)
    print(f"slca-exp: unknown command {command!r}\nusage:\n{USAGE}", file=sys.stderr)
    return EXIT_BAD_CONFIG


def _groups() -> str:
    """``  group: option, option`` for every config group a user picks from."""
    from hydra.core.global_hydra import GlobalHydra

    from slca_exp.preflight.compose import hydra_context

    with hydra_context():
        loader = GlobalHydra.instance().config_loader()
        lines = [
            f"  {group}: {', '.join(loader.get_group_options(group))}"
            for group in sorted(loader.list_groups(""))
            if group not in _HIDDEN_GROUPS and not group.startswith("hydra")
        ]
    return "\n".join(lines)


def _parse(rest: list[str]):  # noqa: ANN202 - argparse.Namespace from Hydra's own parser
    # Hydra's own parser, so that both commands take exactly Hydra's flags (hydra-core is pinned
    # below 1.4, where this module lives).
    from hydra._internal.utils import get_args_parser

    return get_args_parser().parse_args(rest)


@dataclass
class _Command:
    """A train or validate command line, unfolded and with its launcher resolved."""

    args: object
    """Hydra's parsed flags (``argparse.Namespace``)."""
    rest: list[str]
    """The flags and overrides Hydra gets."""
    launcher: str = "launcher=local"
    """The launcher as the user chose it (``launcher=slurm_cpu``, ``hydra/launcher=...``)."""
    profile: object = None
    """Its :class:`~slca_exp.launch.profiles.LauncherProfile` (``None`` when it has problems)."""
    submits: bool = False
    """The launcher hands the jobs to submitit: every run is a sweep (``-m``)."""
    problems: list[Problem] = field(default_factory=list)
    """The launcher's and the study's problems."""
    study: str | None = None
    """The ready study (``sweep=<name>``) the command line unfolded, if any."""


def _command(rest: list[str]) -> _Command:
    """Parse ``rest``, unfold its ``sweep=`` and ``launcher=``, resolve its launcher."""
    from slca_exp.launch.command import plan
    from slca_exp.launch.dry_run import hydra_launcher

    args = _parse(rest)
    dirs = [args.config_dir] if args.config_dir else []
    unfolded = plan(args.overrides, dirs, args.config_name)
    if unfolded.overrides != args.overrides:
        flags = list(rest)
        for override in args.overrides:  # the overrides are the positional arguments
            flags.remove(override)
        rest = flags + unfolded.overrides
        args = _parse(rest)
    command = _Command(args, rest, f"launcher={unfolded.launcher}", unfolded.profile)
    command.study = unfolded.study
    command.problems = list(unfolded.problems)
    touching = [o for o in args.overrides if o.startswith(("hydra/launcher=", "hydra.launcher."))]
    own = [o for o in touching if not o.startswith("hydra/launcher=slca_")]  # not launcher='s
    if own:  # the user set Hydra's launcher directly: read back what Hydra would launch with
        chosen = hydra_launcher(touching, args.config_name or CONFIG_NAME, dirs)
        if chosen is not None:
            _, command.profile, found = chosen
            shown = [] if len(own) == len(touching) else [command.launcher]
            command.launcher = " ".join([*shown, *own])
            command.problems += found
    kind = getattr(command.profile, "kind", "basic")
    command.submits = kind != "basic"
    if unfolded.study and not (args.multirun or command.submits):
        command.problems.append(
            Problem(
                "sweep",
                f"sweep={unfolded.study} is a sweep of several jobs and -m is not given",
                f"add -m: slca-exp train -m sweep={unfolded.study}",
            )
        )
    return command


def _preflight(command: _Command, *, probe: bool):  # noqa: ANN202 - a preflight.Preflight
    from slca_exp.launch.profiles import network_store_problems
    from slca_exp.preflight import preflight

    args = command.args
    checked = preflight(
        args.overrides,
        config_name=args.config_name or CONFIG_NAME,
        extra_config_dirs=[args.config_dir] if args.config_dir else [],
        # A launcher that submits runs every command as a sweep (of one job, or more).
        multirun=bool(args.multirun) or command.submits,
        probe=probe,
        here=not command.submits,
        found=command.problems,
    )
    # Jobs on other nodes must not share a sqlite store on a network filesystem.
    for config in checked.typed:
        for problem in network_store_problems(command.profile, config.tracking):
            if problem not in checked.problems:
                checked.problems.append(problem)
    return checked


def _refused(problems: Sequence[Problem]) -> int:
    print(f"slca-exp: {ConfigError(list(problems))}", file=sys.stderr)
    return EXIT_BAD_CONFIG


def _validate(rest: list[str]) -> int:
    offline = "--offline" in rest
    command = _command([a for a in rest if a not in _OWN_FLAGS])
    checked = _preflight(command, probe=not offline)
    if checked.problems:
        return _refused(checked.problems)
    for note in checked.notes:
        print(f"slca-exp: {note}")
    jobs = len(checked.jobs)
    print(f"slca-exp: the recipe is valid ({jobs} job{'s' if jobs != 1 else ''})")
    return 0


def _train(rest: list[str]) -> int:
    dry_run, offline = "--dry-run" in rest, "--offline" in rest
    command = _command([a for a in rest if a not in _OWN_FLAGS])
    args, rest = command.args, command.rest
    if args.cfg and not args.config_path:
        return _show_cfg(command, probe=not offline)
    informational = args.help or args.hydra_help or args.shell_completion or args.info or args.cfg
    if command.submits and not args.multirun and not informational:
        # Hydra runs a single job here whatever the launcher; a launcher that submits makes the
        # job a sweep of one, so `train launcher=slurm_cpu` goes to the cluster. Not when Hydra
        # only prints (--cfg, --info): it refuses those with -m, and nothing is to be submitted.
        rest = ["-m", *rest]
        args = _parse(rest)
    from slca_exp import train

    if informational or args.config_path:
        # With --config-path the primary config is not ours to pre-check; the task validates it.
        if args.cfg and args.multirun:
            command.problems.append(
                Problem(
                    "-m",
                    "--cfg prints one config, and with --config-path the jobs of a sweep are "
                    "not expanded here",
                    "drop -m and give one value per key, or give your folder with --config-dir "
                    "instead of --config-path to print every job",
                )
            )
        if command.problems:
            return _refused(command.problems)
        sys.argv = ["slca-exp", *rest]
        if args.cfg:  # Hydra prints the config: through the redactor, as _show_cfg does
            from slca_exp.tracking.redact import Redactor

            return _redacted(train.main, Redactor.from_env())
        train.main()
        return 0
    # Every job, before Hydra creates an output folder or a tracker opens a run.
    checked = _preflight(command, probe=dry_run and not offline)
    if checked.problems:
        return _refused(checked.problems)
    if dry_run:
        from slca_exp.launch.dry_run import describe

        for note in checked.notes:
            print(f"slca-exp: {note}")
        if status := _describe_engines(checked.typed, write=True):
            return status
        print(describe(command.launcher, command.profile, checked.jobs))
        return 0
    sys.argv = ["slca-exp", *rest]
    with _study_named(command.study):
        train.main()
    return 0


@contextlib.contextmanager
def _study_named(study: str | None) -> Iterator[None]:
    """``$SLCA_EXP_STUDY`` set to ``study`` while Hydra runs: the sweep's parent run records it."""
    from slca_exp.core.process import env_set
    from slca_exp.launch.command import STUDY_ENV

    with env_set(STUDY_ENV, study or None):
        yield


def _show_cfg(command: _Command, *, probe: bool) -> int:
    """``--cfg job|hydra|all``: every job's composed config, then the recipe's problems.

    As Hydra does, the config is printed whatever its values (on stdout); the problems the
    checks find follow on stderr, and the exit status is 2 when there are any. Only a job that
    does not compose (an unknown option, a bad override) prints nothing but its problems. Works
    with every launcher and with ``-m``: Hydra prints one job's config at a time (it refuses
    ``--cfg`` with ``-m``), so each job of a sweep is printed under its overrides. Once every
    job passed the checks, its engine's description follows its config. Whatever Hydra prints
    goes through the run's redactor first.
    """
    from hydra.core.global_hydra import GlobalHydra

    from slca_exp import train

    checked = _preflight(command, probe=probe)
    if not checked.composed:
        return _refused(checked.problems)
    args = command.args
    flags = [a for a in command.rest if a not in ("-m", "--multirun")]
    for override in args.overrides:
        flags.remove(override)
    for i, (job, cfg) in enumerate(zip(checked.jobs, checked.composed, strict=True)):
        if len(checked.jobs) > 1:
            print(f"# job #{i}: {' '.join(job) or '(defaults)'}")
        GlobalHydra.instance().clear()
        sys.argv = ["slca-exp", *flags, *job]
        # Without problems every job passed, so checked.typed holds one config per job.
        described = None if checked.problems else checked.typed[i]
        show = functools.partial(_print_job, train.main, described)
        if status := _redacted(show, _redactor(cfg)):
            return status
    if checked.problems:
        sys.stdout.flush()  # the configs first, then what is wrong with them
        return _refused(checked.problems)
    return 0


def _print_job(print_config: Callable[[], object], config: object) -> int:
    """Hydra's print of one job's config, then (for a checked ``config``) its engine's."""
    print_config()
    return 0 if config is None else _describe_engines([config], write=False)


def _redacted(show: Callable[[], object], redactor: Redactor) -> int:
    """Run ``show`` with its stdout captured, then print that text through ``redactor``."""
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        status = show()
    print(redactor.text(shown.getvalue()), end="")
    return status if isinstance(status, int) else 0


def _redactor(cfg: object) -> Redactor:
    """The run's redactor for a composed, maybe unchecked, config."""
    from omegaconf.errors import OmegaConfBaseException

    from slca_exp.tracking.redact import Redactor

    try:
        return Redactor.for_config(cfg)
    except OmegaConfBaseException:  # a service's key variable does not resolve: not named
        return Redactor.from_env()


def _describe_engines(configs: list, *, write: bool) -> int:
    """What each job's engine shows of it: printed after ``--cfg job``, written by ``--dry-run``.

    (``engine=verl``: its translated verl configs.) Every job passed the checks before, the
    engine's own included; a job whose engine still cannot describe it is named, and nothing is
    written for the jobs after it.

    Returns:
        0, or 2 after naming the problems.

    """
    from slca_exp.engines import ENGINES, as_engine

    for config in configs:
        try:
            text = as_engine(ENGINES.get(config.engine.name)).describe(config, write=write)
        except ConfigError as err:
            print(f"slca-exp: {err}", file=sys.stderr)
            return EXIT_BAD_CONFIG
        print(text, end="")
    return 0


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
