"""slca-exp serve up | status | down: the frozen judge and simulator as SLURM jobs.

    slca-exp serve up service=NAME [launcher=PROFILE] [service.KEY=V ...] [launcher.KEY=V ...]
                     [--registry DIR] [--config-dir DIR] [--no-wait]
    slca-exp serve status [--registry DIR]
    slca-exp serve down NAME [NAME ...] | --all [--registry DIR]

serve up checks the definition and its profile (every problem, each naming its key, exit 2),
submits the service's job, and waits until the job records the server as answering (the job's
log is named at once). A service already up is left alone; one whose server died is started
again under the same name, and runs that use it follow it to its new endpoint. serve status
lists every service of the registry with its job and whether its server answers. serve down
cancels the job, waits for it to end and removes the service from the registry; without a name
it lists the services it could stop (exit 2).
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import time
from collections.abc import Sequence

from filelock import FileLock

from slca_exp.core.problems import EXIT_BAD_CONFIG, ConfigError, Problem, refuse
from slca_exp.core.shown import shown_path
from slca_exp.launch import service_job as jobs
from slca_exp.launch.service_definitions import GROUP, load_service, service_names
from slca_exp.services.definition import definition_fingerprint
from slca_exp.services.served import REGISTRY_ENV, ServiceRegistry, registry_folder

EXIT_FAILED = 1
UNKNOWN_POLLS = 10
"""Polls in a row at which SLURM knows nothing of a job before ``up`` takes it as ended."""

# The module docstring is the help text, printed as it is: its paragraphs are plain text.
USAGE = __doc__.split("\n\n")[1]
HELP = __doc__.split("\n\n", 2)[2]
UP_USAGE = USAGE.split("\n    slca-exp serve status")[0].strip()


def main(argv: Sequence[str]) -> int:
    """``slca-exp serve ...``; returns the exit status."""
    parser = _parser()
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage:\n{USAGE}\n\n{HELP}")
        return 0 if argv else EXIT_BAD_CONFIG
    args, rest = parser.parse_known_args(argv)
    registry = ServiceRegistry(registry_folder(args.registry))
    if args.command == "up":
        return _up(registry, rest, args.config_dir, wait=not args.no_wait)
    if rest:
        print(f"slca-exp serve {args.command}: unexpected {' '.join(rest)}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    if args.command == "status":
        return _status(registry)
    return _down(registry, args.names, every=args.all)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slca-exp serve", description=__doc__.splitlines()[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--registry",
        default=None,
        metavar="DIR",
        help=f"the registry folder (default: ${REGISTRY_ENV}, else ~/.slca-exp/services)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser(
        "up",
        parents=[common],
        # service=NAME and the KEY=V overrides are not argparse's: they pass through unparsed.
        usage=UP_USAGE,
        help="submit a service's job; wait until it answers",
        description="Check the service's definition and profile, submit its job and wait until "
        "its server answers.",
    )
    up.add_argument(
        "--config-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of your options (service/NAME.yaml, launcher/PROFILE.yaml)",
    )
    up.add_argument("--no-wait", action="store_true", help="return once the job is submitted")
    commands.add_parser(
        "status",
        parents=[common],
        help="every service, its job and whether it answers",
        description="Every service of the registry, its job and whether its server answers.",
    )
    down = commands.add_parser(
        "down",
        parents=[common],
        help="cancel services' jobs and forget them",
        description="Cancel the services' jobs, wait for them to end and remove the services "
        "from the registry. Without a name: the services it could stop.",
    )
    down.add_argument("names", nargs="*", metavar="NAME", help="the services to stop")
    down.add_argument("--all", action="store_true", help="every service of the registry")
    return parser


# --- up ----------------------------------------------------------------------------------------


def _up(registry: ServiceRegistry, overrides: list[str], config_dirs: list[str], wait: bool) -> int:
    name, launcher, service_overrides, launcher_overrides, problems = _split(overrides)
    if name is None:
        known = ", ".join(service_names(config_dirs))
        problems.append(Problem(GROUP, "no service named", f"add service=<one of: {known}>"))
        return refuse(problems, "the service")
    definition, profile_name, profile, found = load_service(
        name, service_overrides, launcher, launcher_overrides, config_dirs
    )
    problems += found
    if problems or definition is None or profile is None:
        return refuse(problems, "the service")
    # One `serve up` of a service at a time: two would both find it down and both submit.
    try:
        with FileLock(f"{registry.record_path(definition.name)}.lock"):
            job = _start(registry, definition, profile_name, profile)
    except ConfigError as err:
        return refuse(err.problems, "the service")
    if job is None or not wait:
        return 0
    return _wait_up(registry, definition.name, job.job_id, definition.health_timeout_s)


def _start(registry, definition, profile_name, profile):  # noqa: ANN001, ANN202 - submitit's job
    """Submit the service's job unless it is already queued or running (then ``None``)."""
    state = jobs.service_state(registry, definition.name)
    running = getattr(state.record, "fingerprint", None)
    if state.job_active and running not in (None, definition_fingerprint(definition)):
        raise ConfigError(
            [
                Problem(
                    GROUP,
                    f"the service {definition.name} is {state.label} (job {state.job_id}) with "
                    "another definition than this one (another fingerprint)",
                    f"slca-exp serve down {definition.name} first, or use another service.name",
                )
            ],
            "the service",
        )
    if state.job_active:
        where = f" at {state.record.base_url}" if state.record and state.answers else ""
        print(
            f"slca-exp: service {definition.name} is {state.label}{where} (job {state.job_id}); "
            f"`slca-exp serve down {definition.name}` first to start it anew"
        )
        return None
    if state.record is not None or state.job is not None:
        print(f"slca-exp: service {definition.name} was {state.label}: starting it again")
        registry.forget(definition.name)
    job = jobs.submit(registry, definition, profile_name, profile)
    log = job.paths.stdout
    registry.submitted(
        definition.name,
        {
            "job_id": job.job_id,
            "launcher": profile_name,
            "submitted_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"
            ),
            "log": str(log),
        },
    )
    print(f"slca-exp: submitted service {definition.name} as SLURM job {job.job_id}, log: {log}")
    return job


def _split(
    overrides: list[str],
) -> tuple[str | None, str | None, list[str], list[str], list[Problem]]:
    name = launcher = None
    service_overrides, launcher_overrides, problems = [], [], []
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep:
            problems.append(
                Problem(override, "is not key=value", "give service=NAME, launcher=PROFILE, ...")
            )
        elif key == GROUP:
            name = value
        elif key == "launcher":
            launcher = value
        elif key.startswith(f"{GROUP}."):
            service_overrides.append(override)
        elif key.startswith("launcher."):
            launcher_overrides.append(override)
        else:
            problems.append(
                Problem(
                    key,
                    "is not a key of `slca-exp serve up`",
                    "give service=NAME, launcher=PROFILE, service.<key>=... or launcher.<key>=...",
                )
            )
    return name, launcher, service_overrides, launcher_overrides, problems


def _wait_up(registry: ServiceRegistry, name: str, job_id: str, health_timeout_s: float) -> int:
    unknown = 0  # polls in a row at which SLURM did not know the job
    while True:
        record = registry.record(name)
        if record is not None and record.job_id == job_id:
            print(
                f"slca-exp: service {name} answers at {record.base_url} "
                f"({record.served_model_name}, {record.server_version})"
            )
            return 0
        state = jobs.slurm_state(job_id)
        unknown = unknown + 1 if state is None else 0
        if unknown >= UNKNOWN_POLLS:
            state = "no longer known to SLURM"
        if state is not None and state not in jobs.ACTIVE:
            job = registry.job(name) or {}
            print(
                f"slca-exp: the job of service {name} ended ({state}) before its server "
                f"answered; its log: {job.get('log')}",
                file=sys.stderr,
            )
            return EXIT_FAILED
        if state == "RUNNING" and health_timeout_s <= 0:
            print(f"slca-exp: service {name} did not answer in time", file=sys.stderr)
            return EXIT_FAILED
        time.sleep(jobs.POLL_S)
        if state == "RUNNING":
            health_timeout_s -= jobs.POLL_S


# --- status ------------------------------------------------------------------------------------


def _status(registry: ServiceRegistry) -> int:
    names = registry.names()
    if not names:
        print(f"slca-exp: no service in the registry {shown_path(registry.folder)}")
        return 0
    rows = [("SERVICE", "ROLE", "STATE", "JOB", "ENDPOINT", "MODEL", "SERVER")]
    for name in names:
        s = jobs.service_state(registry, name)
        r = s.record
        state = s.label + (f" ({s.why})" if s.why and not s.answers else "")
        job = f"{s.job_id} {s.job_state or '?'}" if s.job_id else "-"
        rows.append(
            (
                name,
                getattr(r, "role", "-"),
                state,
                job,
                getattr(r, "base_url", "-"),
                getattr(r, "served_model_name", "-"),
                str(getattr(r, "server_version", "-")),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    print(f"registry: {shown_path(registry.folder)}")
    return 0


# --- down --------------------------------------------------------------------------------------


def _down(registry: ServiceRegistry, names: list[str], every: bool) -> int:
    if not names and not every:
        return _stoppable(registry)
    known = registry.names()
    wanted = known if every else names
    unknown = [n for n in wanted if n not in known]
    folder = shown_path(registry.folder)
    if unknown:  # the key is the argument's name (argparse's dest, NAME in the usage)
        what = f"no service {', '.join(map(repr, unknown))} in the registry {folder}"
        fix = f"name one of: {', '.join(known)}" if known else "it holds none: nothing to stop"
        return refuse([Problem("names", what, fix)], "the command")
    if not wanted:
        print(f"slca-exp: no service is up: the registry {folder} holds none; nothing to stop")
        return 0
    status = 0
    for name in wanted:
        state = jobs.service_state(registry, name)
        if state.job_id and state.job_active:
            subprocess.run(["scancel", str(state.job_id)], check=False)
            if not jobs.wait_ended(str(state.job_id)):
                print(
                    f"slca-exp: the job {state.job_id} of service {name} has not ended "
                    f"{jobs.DOWN_WAIT_S:g} s after scancel; it stays in the registry",
                    file=sys.stderr,
                )
                status = EXIT_FAILED
                continue
        registry.forget(name)
        print(f"slca-exp: service {name} is down (job {state.job_id or '-'})")
    return status


def _stoppable(registry: ServiceRegistry) -> int:
    """``serve down`` without a name: the services it could stop, and how (exit 2).

    Every service of the registry is listed with its state: a queued or dead one holds a
    SLURM job (or a registry entry) as much as one that answers.
    """
    folder = shown_path(registry.folder)
    states = [jobs.service_state(registry, name) for name in registry.names()]
    if not states:
        print(
            f"slca-exp: serve down: no service is up (the registry {folder} holds none), so "
            "there is nothing to stop",
            file=sys.stderr,
        )
        return EXIT_BAD_CONFIG
    width = max(len(s.name) for s in states)
    lines = [f"slca-exp: serve down: name the service to stop. In the registry {folder}:"]
    for s in states:
        where = f" at {s.record.base_url}" if s.answers and s.record is not None else ""
        lines.append(f"  {s.name.ljust(width)}  {s.label}{where} (job {s.job_id or '-'})")
    if not any(s.answers for s in states):
        lines.append("none of them is up (their server does not answer)")
    lines.append(
        f"stop one with: slca-exp serve down NAME (slca-exp serve down {states[0].name}); "
        "every one: slca-exp serve down --all"
    )
    print("\n".join(lines), file=sys.stderr)
    return EXIT_BAD_CONFIG
