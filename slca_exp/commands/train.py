"""``slca-exp train``: check every job, then run it here, submit it, or print or describe it.

``validate``, ``train --dry-run``, ``train --cfg job`` and ``train`` itself run the same checks
before anything starts (:mod:`slca_exp.preflight`): a bad recipe exits 2 with one message listing
every problem, before Hydra creates anything. ``launcher=<profile>`` and ``sweep=<study>`` are
the command line's own overrides (:mod:`slca_exp.launch.command`).
"""

from __future__ import annotations

import contextlib
import functools
import io
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from slca_exp.core.problems import ConfigError, Problem, refuse
from slca_exp.core.shown import compact
from slca_exp.launch.command import (
    OWN_FLAGS,
    CommandLine,
    check_jobs,
    hydra_args,
    read_command_line,
)
from slca_exp.plugins import load_plugins

if TYPE_CHECKING:
    from slca_exp.config.schema import RunConfig
    from slca_exp.launch.resume import SweepPlan
    from slca_exp.tracking.redact import Redactor

HELP = """\
usage: slca-exp train [--dry-run] [--offline] [-m] [--fresh] [HYDRA FLAGS] [OVERRIDES]
       slca-exp train --resume SWEEP_ID [--tracking-uri URI]

Run a recipe: every job is checked first (the config, the recipe's files and weights, the
engine's own check); a bad recipe exits 2 listing every problem, and nothing is created.

options:
  --dry-run        check every job, then print the jobs, the resources and (SLURM) the sbatch
                   script; submits nothing, runs nothing
  --offline        --dry-run / --cfg: do not ask the judge and simulator servers whether they
                   answer (when they start with the job, on the cluster)
  -m, --multirun   run one job per combination of the listed values (a=1,2 b=x,y); the
                   same command run again resumes that sweep: under the same parent run, it
                   runs only the jobs that did not finish (an interrupted one from its
                   checkpoint)
  --fresh          with -m: a new sweep, even where this command's sweep exists
  --resume SWEEP_ID  run the sweep SWEEP_ID's recorded command line again (resuming it); with
                   --tracking-uri URI for a store other than the default one
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

_HIDDEN_GROUPS = ("schema", "service")
"""Config groups a run does not pick: internal (the schemas YAML options merge onto), or read by
another command (``service``: ``slca-exp serve up``)."""


def main(argv: Sequence[str]) -> int:
    """Run ``slca-exp train``; returns the exit status (0, or 2 listing every problem)."""
    rest = list(argv)
    if "-h" in rest or "--help" in rest:
        print(HELP.format(groups=_groups()))
        return 0
    try:
        load_plugins()
        resume_id = _value(rest, "--resume")
        if resume_id is not None:
            uri = _value(rest, "--tracking-uri")
            return _resume(resume_id, uri, _taken(_taken(rest, "--resume"), "--tracking-uri"))
    except ConfigError as err:
        return refuse(err.problems, err.subject)
    return _train(rest)


def _resume(sweep_id: str, uri: str | None, rest: list[str]) -> int:
    """``train --resume SWEEP_ID``: the sweep's recorded command line, as that sweep again."""
    from slca_exp.launch.resume import recorded_command
    from slca_exp.tracking.uris import default_tracking_uri

    if rest:
        raise ConfigError(
            [
                Problem(
                    "--resume",
                    f"it runs the sweep's own command line; {' '.join(rest)} would change it",
                    "drop them, or run the changed command line as a new sweep",
                )
            ],
            "the resume command",
        )
    command = recorded_command(uri or default_tracking_uri(), sweep_id)
    print(f"slca-exp: resuming sweep {sweep_id}: slca-exp train {' '.join(command)}")
    return _train(command, resume=sweep_id)


def _train(rest: list[str], resume: str | None = None) -> int:
    """``train`` on its arguments; ``resume``: the sweep id they continue (``--resume``)."""
    fresh = "--fresh" in rest
    rest = given = [a for a in rest if a != "--fresh"]  # given: the command line a sweep records
    dry_run, offline = "--dry-run" in rest, "--offline" in rest
    command = read_command_line([a for a in rest if a not in OWN_FLAGS])
    args, rest = command.args, command.rest
    if args.cfg and not args.config_path:
        return _show_cfg(command, probe=not offline)
    informational = args.help or args.hydra_help or args.shell_completion or args.info or args.cfg
    if command.submits and not args.multirun and not informational:
        # Hydra runs a single job here whatever the launcher; a launcher that submits makes the
        # job a sweep of one, so `train launcher=slurm_cpu` goes to the cluster. Not when Hydra
        # only prints (--cfg, --info): it refuses those with -m, and nothing is to be submitted.
        rest = ["-m", *rest]
        args = hydra_args(rest)
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
            return refuse(command.problems)
        sys.argv = ["slca-exp", *rest]
        if args.cfg:  # Hydra prints the config: through the redactor, as _show_cfg does
            from slca_exp.tracking.redact import Redactor

            return _redacted(train.main, Redactor.from_env())
        train.main()
        return 0
    # Every job, before Hydra creates an output folder or a tracker opens a run.
    checked = check_jobs(command, probe=dry_run and not offline)
    if checked.problems or (problems := _after_train_problems(checked.typed)):
        return refuse(checked.problems or problems)
    plan = None
    if args.multirun:  # a sweep: what an earlier attempt of it finished is not run again
        from slca_exp.launch.resume import plan_sweep

        plan = plan_sweep(checked.jobs, checked.typed, given, resume=resume, fresh=fresh)
    if plan is not None and plan.changed:
        print(_changed_note(plan, checked.typed), file=sys.stderr)
    if dry_run:
        from slca_exp.launch.dry_run import describe

        for note in checked.notes:
            print(f"slca-exp: {note}")
        if status := _describe_engines(checked.typed, write=True):
            return status
        print(describe(command.launcher, command.profile, checked.jobs))
        if plan is not None and plan.parent_run_id:
            print(
                f"slca-exp: this resumes sweep {plan.sweep_id} (attempt {plan.attempt}): "
                f"jobs to run {compact(plan.run, 'jobs') or 'none'}; "
                f"{len(plan.skipped)} FINISHED before and kept"
            )
        return 0
    if plan is not None:
        for num, run_id in sorted(plan.running.items()):
            print(
                f"slca-exp: job {num}'s MLflow run {run_id} is still RUNNING in the store: if "
                "that job is still running somewhere (squeue), stop it first; it runs again now",
                file=sys.stderr,
            )
        if not plan.run:
            from slca_exp.tracking.closing import compare_command

            print(
                f"slca-exp: sweep {plan.sweep_id}: all {len(plan.jobs)} jobs FINISHED before "
                f"(parent run {plan.parent_run_id}); nothing to run. Compare them: "
                f"{compare_command(str(plan.sweep_id), plan.store)}. Add --fresh for a new "
                "sweep of the same jobs."
            )
            return 0
    from slca_exp.launch.resume import planned

    sys.argv = ["slca-exp", *rest]
    with _study_named(command.study), planned(plan):
        train.main()
    return 0


def _changed_note(plan: SweepPlan, configs: Sequence[RunConfig]) -> str:
    """Why jobs of a resumed sweep that FINISHED run again: what changed in the first's recipe."""
    from slca_exp.analysis.comparability import changed_fields
    from slca_exp.recipe import build_recipe
    from slca_exp.tracking.store import open_client

    num, run_id = min(plan.changed.items())
    try:
        client = open_client(plan.store)
        recipe = build_recipe(configs[num])
        fields = changed_fields(client, client.get_run(run_id), recipe.components())
        shown = ", ".join(fields[:3]) + (f" and {len(fields) - 3} more" if len(fields) > 3 else "")
        why = f"job {num} (run {run_id}) differs in {shown or 'its recorded fingerprint only'}"
    except ConfigError:
        why = f"the recipe of job {num} cannot be built before it runs"
    return (
        f"slca-exp: {len(plan.changed)} FINISHED jobs of sweep {plan.sweep_id} run again "
        f"({compact(sorted(plan.changed), 'jobs')}): their recorded recipe fingerprint differs "
        f"from the job's now; {why}. To keep those runs, put back what changed (a data file, a "
        "prompt, or the pyarrow version that wrote a generated split) and run the command again"
    )


def _value(argv: list[str], flag: str) -> str | None:
    """The value of ``flag VALUE`` or ``flag=VALUE`` in ``argv``; ``None`` when absent."""
    for i, arg in enumerate(argv):
        if arg == flag:
            if i + 1 == len(argv) or argv[i + 1].startswith("-"):
                raise ConfigError([Problem(flag, "needs a value", f"{flag} VALUE")])
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _taken(argv: list[str], flag: str) -> list[str]:
    """``argv`` without ``flag VALUE`` / ``flag=VALUE``."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return out


def _after_train_problems(configs: Sequence[RunConfig]) -> list[Problem]:
    """``eval.after_train``'s benchmark and serving, checked for every job (each problem once)."""
    from slca_exp.evaluation.options import after_train

    found: list[Problem] = []
    for config in configs:
        found += [p for p in after_train(config)[2] if p not in found]
    return found


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


@contextlib.contextmanager
def _study_named(study: str | None) -> Iterator[None]:
    """``$SLCA_EXP_STUDY`` set to ``study`` while Hydra runs: the sweep's parent run records it."""
    from slca_exp.core.process import env_set
    from slca_exp.launch.command import STUDY_ENV

    with env_set(STUDY_ENV, study or None):
        yield


def _show_cfg(command: CommandLine, *, probe: bool) -> int:
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

    checked = check_jobs(command, probe=probe)
    if not checked.composed:
        return refuse(checked.problems)
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
        return refuse(checked.problems)
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
            return refuse(err.problems, err.subject)
        print(text, end="")
    return 0
