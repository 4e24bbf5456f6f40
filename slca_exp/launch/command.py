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
STUDY_NOTES = ("question", "design", "expected")
"""Text a study file may carry beside ``overrides``; ``compare --report`` prints it."""
STUDY_ENV = "SLCA_EXP_STUDY"
"""The study's name while its sweep launches; the sweep's parent run records it (tag STUDY)."""
SERVICE_GROUP = "service"
"""The group of ``slca-exp serve up`` (service definitions): not a run's."""


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
