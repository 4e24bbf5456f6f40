"""Turn ``sweep=<study>``, ``launcher=<profile>`` and ``launcher.<key>=...`` into Hydra overrides.

The CLI calls :func:`plan` before its pre-check, so that every job of a study is validated like
any other sweep and the profile's problems are reported with the recipe's:

- ``sweep=<study>`` is replaced, in place, by the study's overrides from ``sweeps/<study>.yaml``
  (``slca_exp/conf/sweep``); a key also given on the command line keeps the command line's value.
- ``launcher=<profile>`` and ``launcher.<key>=<value>`` are taken out and replaced by
  ``hydra/launcher=slca_<profile>`` (see :mod:`slca_exp.launch.profiles`); without them Hydra's
  basic launcher runs the jobs here, as before.
- ``judge.service=<name>`` (``simulator.service=``) with a judge option that asks no server
  (the default ``rubric``), not chosen on the command line, adds ``judge=served``: the model
  that service serves (:mod:`slca_exp.services.served`). A judge chosen on the command line is
  kept, and a non-served one is refused with the key.

``train`` and ``validate`` read their command lines with :func:`read_command_line` (Hydra's
flags, the study and the profile unfolded, the launcher Hydra would use) and check every job
with :func:`check_jobs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from slca_exp.core.problems import Problem
from slca_exp.launch.profiles import DEFAULT, GROUP, LauncherProfile, hydra_overrides, load_profile
from slca_exp.preflight.compose import CONFIG_DIR, CONFIG_NAME, chosen_backends
from slca_exp.preflight.sections import is_remote
from slca_exp.services.served import SERVED_GROUPS, SERVED_OPTION

STUDY_GROUP = "sweep"
STUDY_NOTES = ("question", "design", "expected", "margin")
"""Text a study file may carry beside ``overrides``: ``compare --report`` prints it, and
``margin`` is the equivalence margin ``compare`` tests the differences against."""
STUDY_ENV = "SLCA_EXP_STUDY"
"""The study's name while its sweep launches; the sweep's parent run records it (tag STUDY)."""
SERVICE_GROUP = "service"
"""The group of ``slca-exp serve up`` (service definitions): not a run's."""
OWN_FLAGS = ("--dry-run", "--offline")
"""The flags of ``train`` / ``validate`` that are not Hydra's."""


@dataclass
class Plan:
    """What a command line becomes once its study and its profile are unfolded."""

    overrides: list[str]
    """The overrides Hydra gets."""
    launcher: str = DEFAULT
    """The profile's name."""
    profile: LauncherProfile | None = None
    """The checked profile (``None`` when it has problems)."""
    study: str | None = None
    """The study's name, when ``sweep=<study>`` was given."""
    problems: list[Problem] = field(default_factory=list)


def plan(
    overrides: Sequence[str],
    extra_config_dirs: Sequence[str] = (),
    config_name: str | None = None,
) -> Plan:
    """Unfold ``sweep=``, ``launcher=`` and named services in ``overrides``; collect problems."""
    problems: list[Problem] = []
    expanded, study = _unfold_study(list(overrides), extra_config_dirs, problems)
    rest, name, tweaks = [], DEFAULT, []
    for item in expanded:
        key = item.split("=", 1)[0]
        if key == GROUP:
            name = item.split("=", 1)[1]
        elif key.startswith(f"{GROUP}."):
            tweaks.append(item)
        elif key.lstrip("+~") == SERVICE_GROUP or key.startswith(f"{SERVICE_GROUP}."):
            problems.append(
                Problem(
                    key,
                    "a service is started by `slca-exp serve up`, not by a run",
                    f"start it: slca-exp serve up {item}; then name it in the run: "
                    "judge.service=<its name> (or simulator.service=...)",
                )
            )
        else:
            rest.append(item)
    rest += served_choices(rest, extra_config_dirs, config_name or CONFIG_NAME)
    if "," in name:
        problems.append(
            Problem(GROUP, f"cannot sweep over cluster profiles ({name})", "run one per command")
        )
        return Plan(rest, name, None, study, problems)
    if name != DEFAULT and any(i.split("=", 1)[0] == "hydra/launcher" for i in rest):
        problems.append(
            Problem(
                "hydra/launcher",
                f"given together with launcher={name}",
                "give one of them; launcher=<profile> sets hydra/launcher itself",
            )
        )
    profile, found = load_profile(name, tweaks, extra_config_dirs)
    problems += found
    if profile is not None:
        rest = rest + hydra_overrides(name, profile)
    return Plan(rest, name, profile, study, problems)


def served_choices(
    overrides: Sequence[str], extra_config_dirs: Sequence[str] = (), config_name: str = CONFIG_NAME
) -> list[str]:
    """``<group>=served`` for each group that names a service and would ask no server.

    A group whose option the command line chooses is left as chosen; so is one whose option
    (from the primary config or an experiment) asks a served model, whose ``<group>.model`` is
    then checked against the service.
    """
    keys = {o.split("=", 1)[0].lstrip("+~"): o.split("=", 1)[-1] for o in overrides}
    added = []
    for group in SERVED_GROUPS:
        named = keys.get(f"{group}.service", "null").strip().strip("'\"")
        if named in ("null", "") or group in keys:
            continue
        backends = chosen_backends(
            overrides, group, config_name=config_name, extra_config_dirs=extra_config_dirs
        )
        if backends and not any(is_remote(group, b) for b in backends):
            added.append(f"{group}={SERVED_OPTION}")
    return added


def study_names(extra_config_dirs: Sequence[str] = ()) -> list[str]:
    """Every ready study in the packaged tree and the user's config folders."""
    return sorted({p.stem for d in _study_dirs(extra_config_dirs) for p in d.glob("*.yaml")})


def study_overrides(name: str, extra_config_dirs: Sequence[str] = ()) -> list[str] | None:
    """The overrides of study ``name``, or ``None`` when there is no such study."""
    for folder in _study_dirs(extra_config_dirs):
        path = folder / f"{name}.yaml"
        if path.is_file():
            return [str(o) for o in OmegaConf.load(path).overrides]
    return None


def study_notes(name: str, extra_config_dirs: Sequence[str] = ()) -> dict[str, str]:
    """The study's own notes beside its overrides (``question``, ``expected``; {} if none)."""
    for folder in _study_dirs(extra_config_dirs):
        path = folder / f"{name}.yaml"
        if path.is_file():
            study = OmegaConf.load(path)
            return {k: str(study[k]).strip() for k in STUDY_NOTES if study.get(k)}
    return {}


def _unfold_study(
    overrides: list[str], extra_config_dirs: Sequence[str], problems: list[Problem]
) -> tuple[list[str], str | None]:
    at = [i for i, o in enumerate(overrides) if o.split("=", 1)[0] == STUDY_GROUP]
    if not at:
        return overrides, None
    name = overrides[at[0]].split("=", 1)[1]
    if len(at) > 1 or "," in name:
        problems.append(
            Problem(STUDY_GROUP, "give one study per command", "run the studies one by one")
        )
        return [o for o in overrides if o.split("=", 1)[0] != STUDY_GROUP], None
    found = study_overrides(name, extra_config_dirs)
    if found is None:
        problems.append(
            Problem(
                STUDY_GROUP,
                f"no study {name!r}",
                f"choose one of: {', '.join(study_names(extra_config_dirs))}, or add "
                f"sweep/{name}.yaml (a list under `overrides:`) to a --config-dir folder",
            )
        )
        return [o for i, o in enumerate(overrides) if i != at[0]], None
    given = {o.split("=", 1)[0] for o in overrides}
    kept = [o for o in found if o.split("=", 1)[0] not in given]
    return overrides[: at[0]] + kept + overrides[at[0] + 1 :], name


def _study_dirs(extra_config_dirs: Sequence[str]) -> list[Path]:
    return [Path(d) / STUDY_GROUP for d in extra_config_dirs] + [CONFIG_DIR / STUDY_GROUP]


def hydra_args(rest: list[str]):  # noqa: ANN201 - argparse.Namespace from Hydra's own parser
    """``rest`` parsed by Hydra's own parser: both commands take exactly Hydra's flags."""
    # hydra-core is pinned below 1.4, where this module lives.
    from hydra._internal.utils import get_args_parser

    return get_args_parser().parse_args(rest)


@dataclass
class CommandLine:
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


def read_command_line(rest: list[str]) -> CommandLine:
    """Parse ``rest``, unfold its ``sweep=`` and ``launcher=``, resolve its launcher."""
    from slca_exp.launch.dry_run import hydra_launcher

    args = hydra_args(rest)
    dirs = [args.config_dir] if args.config_dir else []
    unfolded = plan(args.overrides, dirs, args.config_name)
    if unfolded.overrides != args.overrides:
        flags = list(rest)
        for override in args.overrides:  # the overrides are the positional arguments
            flags.remove(override)
        rest = flags + unfolded.overrides
        args = hydra_args(rest)
    command = CommandLine(args, rest, f"launcher={unfolded.launcher}", unfolded.profile)
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


def check_jobs(command: CommandLine, *, probe: bool):  # noqa: ANN201 - a preflight.Preflight
    """Every job's preflight, the launcher's problems and the shared-store check included."""
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
