"""What a run checks before it starts, for ``train``, ``validate``, ``--dry-run`` and ``--cfg``.

    overrides --compose every job--> DictConfig --check_run--> (RunConfig, engine, Recipe)
                                       validate -> recipe -> the engine's own check
              --probe (validate, --dry-run, --cfg; not with --offline)--> judge/simulator URLs
                                                    answer, and take the run's max_tokens

:func:`check_run` is the one list of checks. The job runs it before it opens a tracker
(``train.prepare``); every command that only looks runs it through :func:`preflight`, inside
:func:`creating_nothing`, where what a run would build (the synthetic split, the built-in
backbone's checkpoint for verl) is reported as "will be generated" instead of being built. So
``validate``, ``train --dry-run``, ``train --cfg job`` and ``train``'s own pre-check refuse the
same recipes with the same problems, and none of them writes a file.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from slca_exp.config.schema import RunConfig
from slca_exp.core.checking import creating_nothing, may_create, on_this_host
from slca_exp.core.problems import ConfigError, Problem
from slca_exp.preflight.compose import CONFIG_NAME, compose_jobs, merge_job_problems
from slca_exp.preflight.sections import SERVICES, is_remote
from slca_exp.preflight.served_limits import served_limit_problems

if TYPE_CHECKING:
    from slca_exp.engines import Engine
    from slca_exp.recipe import Recipe

PROBE_TIMEOUT_S = 3.0
"""How long the reachability probe waits for a judge or simulator server to answer."""


def check_run(
    cfg: DictConfig,
    engines: Any = None,  # noqa: ANN401 - a Registry of engines
) -> tuple[RunConfig, Engine, Recipe]:
    """Validate ``cfg``, build its recipe, run its engine's own check.

    Args:
        cfg: a composed config.
        engines: the registry the engine is found in (default: ``slca_exp.engines.ENGINES``).

    Returns:
        ``(RunConfig, engine, Recipe)``.

    Raises:
        ConfigError: every problem of the first stage that has any (config, recipe, engine).
        RegistryError: no engine of that name is installed.

    """
    from slca_exp.engines import ENGINES, as_engine
    from slca_exp.plugins import load_plugins
    from slca_exp.preflight.validate import validate
    from slca_exp.recipe import build_recipe
    from slca_exp.services.served import resolve_services

    load_plugins()  # a job may run in a fresh process (submitit, SLURM): register plugins there
    config = validate(cfg)
    problems = [] if may_create() else pending_problems(config)
    try:
        # At job start (may_create), wait for each named service and check what it serves;
        # before submitting, only read the registry.
        served = resolve_services(config, wait=may_create())
    except ConfigError as err:
        problems += err.problems
        served = {}
    if may_create() and not problems:
        # at job start, before the first step: a server that refuses every request of the
        # run's size stops it here (before a run, the probe of validate and --dry-run does)
        problems += served_limit_problems([config], served)
    try:
        recipe = build_recipe(config, served=served)
    except ConfigError as err:
        raise ConfigError([*problems, *err.problems]) from None
    if problems:
        raise ConfigError(problems)
    engine = as_engine((ENGINES if engines is None else engines).get(config.engine.name))
    problems = engine.check(config, recipe)  # the engine's own checks (engine=verl: verl's)
    if problems:
        raise ConfigError(problems)
    return config, engine, recipe


@dataclass
class Preflight:
    """What :func:`preflight` found.

    Attributes:
        jobs: every job's overrides (sweeps expanded).
        typed: every job's checked :class:`~slca_exp.config.schema.RunConfig`.
        problems: every problem of every job.
        notes: what a run would create (``data: ... will be generated in ...``).
        composed: every job's composed config, checked or not (``--cfg`` prints them all);
            empty when a job does not compose.

    """

    jobs: list[list[str]] = field(default_factory=list)
    typed: list[RunConfig] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    composed: list[DictConfig] = field(default_factory=list)


def preflight(
    overrides: Sequence[str],
    *,
    config_name: str = CONFIG_NAME,
    extra_config_dirs: Sequence[str] = (),
    multirun: bool = True,
    probe: bool = False,
    here: bool = False,
    found: Sequence[Problem] = (),
) -> Preflight:
    """Every check a run makes before it starts, for every job; nothing is created.

    Args:
        overrides: the command line's overrides (sweeps included).
        config_name: the primary config.
        extra_config_dirs: user folders (``--config-dir``).
        multirun: ``-m`` was given; without it a list of values is a problem, as in Hydra.
        probe: also ask each remote judge and simulator whether it answers.
        here: the jobs run on this host (:func:`runs_here`).
        found: problems found before composing (the launcher profile, the study).

    """
    jobs, cfgs, problems = compose_jobs(
        overrides,
        config_name=config_name,
        extra_config_dirs=extra_config_dirs,
        multirun=multirun,
    )
    if problems:
        return Preflight(jobs, [], [*found, *problems], [])
    from slca_exp.registry import RegistryError

    typed, notes = [], []
    per_job: dict[Problem, list[list[str]]] = {}
    with creating_nothing(), on_this_host() if here else nullcontext():
        for job, cfg in zip(jobs, cfgs, strict=True):
            try:
                config, _, _ = check_run(cfg)
            except ConfigError as err:
                for problem in err.problems:
                    per_job.setdefault(problem, []).append(job)
                continue
            except RegistryError as err:
                problem = Problem("engine.name", str(err), "pick an installed engine")
                per_job.setdefault(problem, []).append(job)
                continue
            typed.append(config)
            notes += [n for n in pending_notes(config) if n not in notes]
    problems = [*found, *merge_job_problems(per_job, jobs, overrides)]
    if not problems and probe:
        problems = probe_services(typed) or served_limit_problems(typed)
    return Preflight(jobs, typed, problems, notes, cfgs)


# --- what a run would create -------------------------------------------------------------------


def pending_problems(config: RunConfig) -> list[Problem]:
    """The problems making the run's split would raise, found without making it.

    Only a data source that makes its split has any: the synthetic one refuses a folder of split
    files it did not write (``data/sources.py``).
    """
    from slca_exp.data.sources import data_source

    return data_source(config.data.kind).pending_problems(config)


def pending_notes(config: RunConfig) -> list[str]:
    """What the run would generate before it starts, one line each."""
    from slca_exp.data.sources import data_source

    note = data_source(config.data.kind).pending_note(config)
    return [] if note is None else [note]


# --- are the judge and the simulator there? ----------------------------------------------------


def probe_services(
    configs: Sequence[RunConfig], timeout_s: float = PROBE_TIMEOUT_S
) -> list[Problem]:
    """A problem for each remote judge or simulator endpoint that does not answer.

    One ``GET <base_url>/models`` per distinct URL, no key sent: any HTTP answer (401 and 404
    included) means a server is there; a refused connection, an unknown host or no answer within
    ``timeout_s`` is a problem naming the key.
    """
    problems, seen = [], set()
    for config in configs:
        for group in SERVICES:
            service = getattr(config, group)
            url = str(service.base_url or "")
            if not is_remote(group, service.backend) or not url or (group, url) in seen:
                continue
            seen.add((group, url))
            why = unreachable(url, timeout_s)
            if why is not None:
                problems.append(
                    Problem(
                        f"{group}.base_url",
                        f"no server answers at {url} ({why}); every {group} request would fail",
                        f"start the {group} server or fix {group}.base_url; when the server "
                        "starts with the job (on the cluster), pass --offline to skip this probe",
                    )
                )
    return problems


def unreachable(base_url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why nothing answers at ``base_url`` (``None``: a server answered)."""
    request = urllib.request.Request(base_url.rstrip("/") + "/models", method="GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):  # noqa: S310 - http(s) only
            return None
    except urllib.error.HTTPError:
        return None  # an HTTP status is an answer
    except urllib.error.URLError as err:
        reason = err.reason
        return str(getattr(reason, "strerror", None) or reason)
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except OSError as err:
        return err.strerror or type(err).__name__
