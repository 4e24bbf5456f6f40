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
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from filelock import FileLock

from slca_exp.core.locking import lock_path
from slca_exp.core.problems import ConfigError, Problem
from slca_exp.core.shown import shown_path
from slca_exp.serve.definitions import GROUP, load_service, service_names
from slca_exp.serve.job import ServiceJob, log_path
from slca_exp.services.definition import definition_fingerprint
from slca_exp.services.served import (
    REGISTRY_ENV,
    ServiceRecord,
    ServiceRegistry,
    ServiceUnreachable,
    ask_server,
    registry_folder,
)

EXIT_BAD_CONFIG = 2
EXIT_FAILED = 1
UP_POLL_S = 1.0
UNKNOWN_POLLS = 10
"""Polls in a row at which SLURM knows nothing of a job before ``up`` takes it as ended."""
DOWN_WAIT_S = 120.0
"""How long ``down`` waits for a cancelled job to end (SLURM's KillWait, then SIGKILL)."""
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED")
"""SLURM job states of a job that is not over."""

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
        return _refuse(problems)
    definition, profile_name, profile, found = load_service(
        name, service_overrides, launcher, launcher_overrides, config_dirs
    )
    problems += found
    if problems or definition is None or profile is None:
        return _refuse(problems)
    # One `serve up` of a service at a time: two would both find it down and both submit.
    try:
        with FileLock(lock_path(registry.record_path(definition.name))):
            job = _start(registry, definition, profile_name, profile)
    except ConfigError as err:
        return _refuse(err.problems)
    if job is None or not wait:
        return 0
    return _wait_up(registry, definition.name, job.job_id, definition.health_timeout_s)


def _start(registry, definition, profile_name, profile):  # noqa: ANN001, ANN202 - submitit's job
    """Submit the service's job unless it is already queued or running (then ``None``)."""
    state = service_state(registry, definition.name)
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
    job = _submit(registry, definition, profile_name, profile)
    log = job.paths.stdout
    registry.submitted(
        definition.name,
        {
            "job_id": job.job_id,
            "launcher": profile_name,
            "submitted_at": _now(),
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


def _submit(registry, definition, profile_name, profile):  # noqa: ANN001, ANN202 - submitit's
    import submitit

    folder = log_path(registry, definition.name) / "%j"
    executor = submitit.AutoExecutor(
        folder=folder, cluster="slurm", slurm_max_num_timeout=profile.max_num_timeout
    )
    params = {
        "timeout_min": profile.timeout_min,
        "nodes": 1,
        "tasks_per_node": 1,
        "cpus_per_task": profile.cpus_per_task,
        "mem_gb": profile.mem_gb,
        "gpus_per_node": profile.gpus_per_node or None,
        "name": f"slca-serve-{definition.name}",
        "slurm_partition": profile.partition,
        "slurm_account": profile.account,
        "slurm_qos": profile.qos,
        "slurm_setup": list(profile.setup) or None,
        "slurm_signal_delay_s": profile.signal_delay_s,
    }
    executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return executor.submit(ServiceJob(definition, str(registry.folder), profile_name))


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
        state = slurm_state(job_id)
        unknown = unknown + 1 if state is None else 0
        if unknown >= UNKNOWN_POLLS:
            state = "no longer known to SLURM"
        if state is not None and state not in ACTIVE:
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
        time.sleep(UP_POLL_S)
        if state == "RUNNING":
            health_timeout_s -= UP_POLL_S


# --- status ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceState:
    """What the registry, SLURM and the server say about one service."""

    name: str
    record: ServiceRecord | None
    job: dict[str, object] | None
    job_id: str | None
    job_state: str | None  # SLURM's; None: unknown (no SLURM here) or no job
    answers: bool
    why: str = ""

    @property
    def job_active(self) -> bool:
        """Whether the service's job is queued or running."""
        return self.job_state in ACTIVE

    @property
    def label(self) -> str:
        """Up | starting | dead | ended."""
        if self.answers:
            return "up"
        if self.job_active:
            return "dead" if self.record is not None else "starting"
        return "dead" if self.record is not None else "ended"


def service_state(registry: ServiceRegistry, name: str) -> ServiceState:
    """Ask the registry, SLURM and (when recorded) the server about ``name``."""
    record, job = registry.record(name), registry.job(name)
    job_id = record.job_id if record is not None else (job or {}).get("job_id")
    job_state = slurm_state(str(job_id)) if job_id else None
    answers, why = False, ""
    if record is not None:
        try:
            served = ask_server(record.base_url, record.api_key_env, timeout_s=5.0)
            answers = served.card(record.served_model_name) is not None
            why = "" if answers else f"serves {served.ids}"
        except ServiceUnreachable as err:
            why = str(err)
    return ServiceState(name, record, job, job_id, job_state, answers, why)


def _status(registry: ServiceRegistry) -> int:
    names = registry.names()
    if not names:
        print(f"slca-exp: no service in the registry {shown_path(registry.folder)}")
        return 0
    rows = [("SERVICE", "ROLE", "STATE", "JOB", "ENDPOINT", "MODEL", "SERVER")]
    for name in names:
        s = service_state(registry, name)
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
        return _refuse([Problem("names", what, fix)], "the command")
    if not wanted:
        print(f"slca-exp: no service is up: the registry {folder} holds none; nothing to stop")
        return 0
    status = 0
    for name in wanted:
        state = service_state(registry, name)
        if state.job_id and state.job_active:
            subprocess.run(["scancel", str(state.job_id)], check=False)
            if not _wait_ended(str(state.job_id)):
                print(
                    f"slca-exp: the job {state.job_id} of service {name} has not ended "
                    f"{DOWN_WAIT_S:g} s after scancel; it stays in the registry",
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
    states = [service_state(registry, name) for name in registry.names()]
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


def _wait_ended(job_id: str) -> bool:
    deadline = time.monotonic() + DOWN_WAIT_S
    while time.monotonic() < deadline:
        if slurm_state(job_id) not in ACTIVE:
            return True
        time.sleep(UP_POLL_S)
    return False


# --- shared ------------------------------------------------------------------------------------


def slurm_state(job_id: str) -> str | None:
    """SLURM's state of ``job_id`` (``squeue``, then ``sacct``); ``None`` when neither knows."""
    for command in (
        ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"],
        ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"],
    ):
        if shutil.which(command[0]) is None:
            continue
        try:
            res = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        words = res.stdout.split()
        if res.returncode == 0 and words:
            return words[0].rstrip("+")
    return None


def _refuse(problems: list[Problem], subject: str = "the service") -> int:
    print(f"slca-exp: {ConfigError(problems, subject)}", file=sys.stderr)
    return EXIT_BAD_CONFIG


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
