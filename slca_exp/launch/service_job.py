"""What a service's SLURM job runs: the server, and its record once it answers.

:class:`ServiceJob` is the callable ``slca-exp serve up`` hands submitit. On the node it picks
the port (a free one when the definition says 0), starts :func:`server_command` (vLLM's, or the
definition's own) with the API key in the server's environment only, waits until the server
answers ``GET /v1/models`` with the definition's model id and max model length, then publishes
the service's record (:class:`~slca_exp.services.served.ServiceRecord`) and serves until the
server exits or the job is stopped (``slca-exp serve down``, ``scancel``: SIGTERM, passed on to
the server).

At its time limit SLURM signals the job first: the job stops the server and requeues itself
(submitit's checkpoint), and the requeued job publishes the new endpoint, which clients follow.

Seen from outside (``slca-exp serve``): :func:`submit` hands the job to SLURM, and what the
registry, SLURM (``squeue``, ``sacct``) and the server say of a service is one
:class:`ServiceState`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from slca_exp.services.definition import (
    VLLM_API_KEY_ENV,
    ServiceDefinition,
    definition_fingerprint,
    server_command,
)
from slca_exp.services.served import (
    Served,
    ServiceRecord,
    ServiceRegistry,
    ServiceUnreachable,
    ask_server,
)

POLL_S = 1.0
"""How often the job asks its server whether it answers yet, and ``serve`` asks SLURM."""
STOP_GRACE_S = 20.0
"""How long the server gets to exit after SIGTERM before it is killed."""
ANY_ADDRESS = ("0.0.0.0", "::", "")  # noqa: S104 - what vLLM's --host accepts for "every"
DOWN_WAIT_S = 120.0
"""How long ``down`` waits for a cancelled job to end (SLURM's KillWait, then SIGKILL)."""
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED")
"""SLURM job states of a job that is not over."""


class ServeError(RuntimeError):
    """The server could not be started, or never answered with its model."""


@dataclass
class ServiceJob:
    """One service's job: the definition, the registry it is recorded in, its profile's name."""

    definition: ServiceDefinition
    registry: str
    launcher: str

    def __call__(self) -> str:
        """Serve until the server exits or the job is stopped; says why it ended."""
        d = self.definition
        port = d.port or free_port(d.host)
        host = advertised_host(d.host)
        base_url = f"http://{host}:{port}/v1"
        command = server_command(served_definition(d, Path(self.registry)), d.host, port)
        env = dict(os.environ)
        if d.uses_vllm and d.device == "cpu":
            env = {**CPU_VLLM_ENV, **env}  # the job's own settings win
        if d.api_key_env:
            key = os.environ.get(d.api_key_env)
            if not key:
                raise ServeError(
                    f"service.api_key_env names {d.api_key_env}, which is not set in the job's "
                    f"environment: export {d.api_key_env}=<key> before `slca-exp serve up`"
                )
            env[VLLM_API_KEY_ENV] = key  # the server's environment only, never its command line
        say(f"service {d.name}: {shlex.join(command)}")
        server = subprocess.Popen(command, env=env)
        with _stopping(server) as stopped:
            served = wait_until_served(server, base_url, d, stopped)
            record = ServiceRecord(
                name=d.name,
                role=d.role,
                fingerprint=definition_fingerprint(d),
                served_model_name=d.model_id,
                max_model_len=d.max_model_len,
                server_version=served.version,
                base_url=base_url,
                host=host,
                port=port,
                job_id=job_id(),
                launcher=self.launcher,
                started_at=datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds"
                ),
                definition=dataclasses.asdict(d),
                command=command,
                api_key_env=d.api_key_env,
            )
            ServiceRegistry(self.registry).publish(record)
            say(f"service {d.name} answers at {base_url} ({d.model_id}, {served.version})")
            code = server.wait()
        if stopped:
            return f"service {d.name} stopped ({stopped[0]})"
        raise ServeError(f"the server of service {d.name} exited with status {code}")

    def checkpoint(self) -> object:
        """At the time limit (or a preemption): requeue the same service (submitit's hook)."""
        import submitit

        return submitit.helpers.DelayedSubmission(self)


CPU_VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
"""What vLLM's CPU build gets unless the job's environment says otherwise: a KV cache of 1 GiB
of host memory (its default, 4 GiB, is more than a small node spares for a tiny model)."""


@contextlib.contextmanager
def local_server(
    d: ServiceDefinition, log: Path | None = None
) -> Iterator[tuple[str, Served, list[str]]]:
    """Serve ``d`` from this process until the block ends (``slca-exp eval``'s checkpoint).

    The server is the one a service's job runs (:func:`server_command`, vLLM's CPU settings for
    ``device: cpu``), on a free port of ``d.host``; its output goes to ``log`` (else nowhere).
    SIGTERM or SIGINT stop it, and it never outlives the block.

    Yields:
        ``(base_url, what the server says it serves, its command line)``.

    Raises:
        ServeError: the server ended, or did not answer with ``d``'s model in time.

    """
    port = d.port or free_port(d.host)
    base_url = f"http://{advertised_host(d.host)}:{port}/v1"
    command = server_command(d, d.host, port)
    env = dict(os.environ)
    if d.uses_vllm and d.device == "cpu":
        env = {**CPU_VLLM_ENV, **env}
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(log, "ab")) if log else subprocess.DEVNULL
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        stopped = stack.enter_context(_stopping(server))
        yield base_url, wait_until_served(server, base_url, d, stopped), command


def served_definition(d: ServiceDefinition, registry: Path) -> ServiceDefinition:
    """The definition as its server runs it: a built-in backbone built, its folder served.

    ``service.model=builtin:<experiment>`` (:mod:`slca_exp.launch.builtin_models`) is built
    under ``<registry>/models`` on the node and served from there, under the model id the
    definition gives; any other definition is served as it is.
    """
    from slca_exp.launch.builtin_models import build_builtin, is_builtin

    if d.uses_vllm and is_builtin(d.model):
        say(f"service {d.name}: building {d.model}")
        folder = build_builtin(d.model, registry / "models")
        d = dataclasses.replace(d, model=str(folder), served_model_name=d.model_id)
    return d


def say(line: str) -> None:
    """One ``slca-exp:`` line in the job's log."""
    print(f"slca-exp: {line}", file=sys.stderr, flush=True)


def job_id() -> str:
    """The SLURM job id (``""`` outside SLURM)."""
    return os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID") or ""


def advertised_host(bind: str) -> str:
    """The address others reach the server at: the node's name when it binds every address."""
    return socket.getfqdn() if bind in ANY_ADDRESS else bind


def free_port(bind: str) -> int:
    """A port nothing listens on now, on ``bind``."""
    with socket.socket() as probe:
        probe.bind(("" if bind in ANY_ADDRESS else bind, 0))
        return int(probe.getsockname()[1])


def wait_until_served(
    server: subprocess.Popen[bytes], base_url: str, d: ServiceDefinition, stopped: list[str]
) -> Served:
    """Wait until the server lists ``d``'s model, as ``d`` defines it.

    Raises:
        ServeError: the server exited, was stopped, answered with another model, or did not
            answer within ``health_timeout_s``.

    """
    deadline, why = time.monotonic() + d.health_timeout_s, "not asked yet"
    while time.monotonic() < deadline:
        if stopped or server.poll() is not None:
            raise ServeError(
                f"the server of service {d.name} ended before it answered "
                f"({stopped[0] if stopped else f'exit status {server.returncode}'})"
            )
        try:
            served = ask_server(base_url, d.api_key_env, timeout_s=5.0)
        except ServiceUnreachable as err:
            why = str(err)
            time.sleep(POLL_S)
            continue
        card = served.card(d.model_id)
        if card is None:
            _stop(server)
            raise ServeError(f"the server at {base_url} lists {served.ids}, not {d.model_id!r}")
        length = card.get("max_model_len")
        if d.max_model_len is not None and length is not None and length != d.max_model_len:
            _stop(server)
            raise ServeError(
                f"the server at {base_url} serves {d.model_id!r} with max_model_len {length}, "
                f"not {d.max_model_len} (service.max_model_len)"
            )
        return served
    _stop(server)
    raise ServeError(
        f"the server of service {d.name} did not answer at {base_url} within "
        f"{d.health_timeout_s:g} s (service.health_timeout_s); last: {why}"
    )


@contextlib.contextmanager
def _stopping(server: subprocess.Popen[bytes]) -> Iterator[list[str]]:
    """SIGTERM and SIGINT stop the server (the list then names the signal).

    The server never outlives the block.
    """
    stopped: list[str] = []

    def stop(signum: int, _frame: object) -> None:
        stopped.append(signal.Signals(signum).name)
        with contextlib.suppress(ProcessLookupError):
            server.terminate()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stopped
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _stop(server)


def _stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is not None:
        return
    server.terminate()
    try:
        server.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def log_path(registry: ServiceRegistry, name: str) -> Path:
    """The folder submitit keeps a service's jobs in (``<registry>/logs/<name>/<job id>``)."""
    return registry.folder / "logs" / name


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


def wait_ended(job_id: str) -> bool:
    """Whether SLURM has ended ``job_id`` within :data:`DOWN_WAIT_S`."""
    deadline = time.monotonic() + DOWN_WAIT_S
    while time.monotonic() < deadline:
        if slurm_state(job_id) not in ACTIVE:
            return True
        time.sleep(POLL_S)
    return False


def submit(registry, definition, profile_name, profile):  # noqa: ANN001, ANN201 - submitit's
    """Submit the service's job (:class:`ServiceJob`) with its profile's resources."""
    executor = one_node_executor(
        profile,
        log_path(registry, definition.name),
        f"slca-serve-{definition.name}",
        max_num_timeout=profile.max_num_timeout,
        slurm_signal_delay_s=profile.signal_delay_s,
    )
    return executor.submit(ServiceJob(definition, str(registry.folder), profile_name))


def one_node_executor(  # noqa: ANN201 - submitit's
    profile,  # noqa: ANN001
    folder: Path,
    name: str,
    max_num_timeout: int = 0,
    **extra,  # noqa: ANN003
):
    """A submitit SLURM executor for one task on one node with the profile's resources.

    Logs go under ``folder/<job id>``; ``max_num_timeout`` requeues are allowed after a time
    limit; ``extra`` are more submitit parameters (``None`` is left to SLURM's default, as the
    profile's own unset fields are).
    """
    import submitit

    executor = submitit.AutoExecutor(
        folder=folder / "%j", cluster="slurm", slurm_max_num_timeout=max_num_timeout
    )
    params = {
        "timeout_min": profile.timeout_min,
        "nodes": 1,
        "tasks_per_node": 1,
        "cpus_per_task": profile.cpus_per_task,
        "mem_gb": profile.mem_gb,
        "gpus_per_node": profile.gpus_per_node or None,
        "name": name,
        "slurm_partition": profile.partition,
        "slurm_account": profile.account,
        "slurm_qos": profile.qos,
        "slurm_setup": list(profile.setup) or None,
        **extra,
    }
    executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return executor
