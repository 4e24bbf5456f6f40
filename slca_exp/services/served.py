"""The service registry, and a run's judge or simulator found through it.

``slca-exp serve up`` starts each service as a job of its own; once its server answers
``GET /v1/models`` with the expected model, the job records where in the registry, a folder on
the shared filesystem with one file per service (``<name>.json``, a :class:`ServiceRecord`):
its definition and fingerprint, ``host:port``, job id, the server's version and start time.
The submission itself leaves ``<name>.job.json`` (the job id) until then.

A run names a service instead of a URL (``judge.service=<name>``). At job start, on the compute
node, :func:`resolve_services` reads the record, waits a bounded time for the server to answer,
and compares what the server says it serves (``/v1/models``: model id and max model length) with
the record and with the run's ``judge.model``: a difference refuses the run, naming the key.
A run that gives no model (``judge=served``, which a run naming a service with the default judge
gets) takes the model the record says the service serves, and is checked against the server
all the same.
The run then talks to the recorded endpoint, and its recipe records the service's identity
(:meth:`ServiceRecord.identity`) and the endpoint.

The registry folder: ``judge.service_registry`` when set, else ``$SLCA_EXP_SERVICES``, else
``~/.slca-exp/services`` (a home folder is on the shared filesystem of most clusters). No key is
ever written there: a service that requires one names the variable holding it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slca_exp.core.problems import ConfigError, Problem

REGISTRY_ENV = "SLCA_EXP_SERVICES"
"""Environment variable naming the registry folder."""
DEFAULT_REGISTRY = "~/.slca-exp/services"
POLL_S = 2.0
"""How often a run waiting for a service looks again."""
ASK_TIMEOUT_S = 10.0
"""How long one ``GET /v1/models`` may take."""
SERVED_GROUPS = ("judge", "simulator")
SERVED_OPTION = "served"
"""The judge and simulator option (``conf/<group>/served.yaml``) that is the model a named
service serves."""


class ServiceUnreachable(Exception):
    """The server does not answer (connection refused, timeout, an HTTP error)."""


def registry_folder(configured: str | None = None) -> Path:
    """The registry folder: ``configured``, else ``$SLCA_EXP_SERVICES``, else the default."""
    raw = configured or os.environ.get(REGISTRY_ENV) or DEFAULT_REGISTRY
    return Path(raw).expanduser().resolve()


@dataclass(frozen=True)
class Served:
    """What a server says it serves: ``GET /v1/models`` and (vLLM) ``GET /version``."""

    models: tuple[dict[str, Any], ...]
    version: str | None = None

    @property
    def ids(self) -> list[str]:
        """The model ids it answers to."""
        return [str(m.get("id")) for m in self.models]

    def card(self, model_id: str) -> dict[str, Any] | None:
        """The model card of ``model_id``, if served."""
        return next((m for m in self.models if m.get("id") == model_id), None)


@dataclass(frozen=True)
class ServiceRecord:
    """One live service, as its job recorded it once the server answered."""

    name: str
    role: str
    fingerprint: str
    served_model_name: str
    max_model_len: int | None
    server_version: str | None
    base_url: str
    host: str
    port: int
    job_id: str
    launcher: str
    started_at: str
    definition: dict[str, Any] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    api_key_env: str | None = None

    def identity(self) -> dict[str, Any]:
        """What a run records of the service: not where it runs (that is the endpoint)."""
        return {
            "name": self.name,
            "fingerprint": self.fingerprint,
            "served_model_name": self.served_model_name,
            "max_model_len": self.max_model_len,
            "server_version": self.server_version,
        }

    def to_json(self) -> str:
        """The record as the registry file holds it."""
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ServiceRecord:
        """A record read back from its file."""
        return cls(**json.loads(text))


class ServiceRegistry:
    """The registry folder: ``<name>.json`` per live service, ``<name>.job.json`` per submission."""

    def __init__(self, folder: Path | str) -> None:
        self.folder = Path(folder)

    def __repr__(self) -> str:
        return f"ServiceRegistry({str(self.folder)!r})"

    def record_path(self, name: str) -> Path:
        """Where the record of ``name`` is written."""
        return self.folder / f"{name}.json"

    def job_path(self, name: str) -> Path:
        """Where the submitted job of ``name`` is remembered."""
        return self.folder / f"{name}.job.json"

    def record(self, name: str) -> ServiceRecord | None:
        """The service's record, or ``None`` when its server never answered (or it was downed)."""
        try:
            return ServiceRecord.from_json(self.record_path(name).read_text())
        except FileNotFoundError:
            return None

    def job(self, name: str) -> dict[str, Any] | None:
        """The service's submitted job (``job_id``, ``launcher``, ``submitted_at``, ``log``)."""
        try:
            return json.loads(self.job_path(name).read_text())
        except FileNotFoundError:
            return None

    def names(self) -> list[str]:
        """Every service with a record or a submitted job."""
        if not self.folder.is_dir():
            return []
        found = {p.name.removesuffix(".job.json") for p in self.folder.glob("*.job.json")}
        found |= {p.stem for p in self.folder.glob("*.json") if not p.name.endswith(".job.json")}
        return sorted(found)

    def publish(self, record: ServiceRecord) -> None:
        """Write ``record`` at once (a reader sees the old file or the new one, never a part)."""
        _write_atomically(self.record_path(record.name), record.to_json())

    def submitted(self, name: str, job: dict[str, Any]) -> None:
        """Remember the job just submitted for ``name`` (its record comes once it answers)."""
        _write_atomically(self.job_path(name), json.dumps(job, indent=2, sort_keys=True))

    def forget(self, name: str, job_id: str | None = None) -> None:
        """Remove the service's files (only those of job ``job_id``, when given)."""
        record, job = self.record(name), self.job(name)
        if record is not None and (job_id is None or record.job_id == job_id):
            self.record_path(name).unlink(missing_ok=True)
        if job is not None and (job_id is None or str(job.get("job_id")) == job_id):
            self.job_path(name).unlink(missing_ok=True)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def ask_server(
    base_url: str, api_key_env: str | None = None, timeout_s: float = ASK_TIMEOUT_S
) -> Served:
    """What the server at ``base_url`` serves (``/v1/models``) and its version (``/version``).

    Raises:
        ServiceUnreachable: nothing answers, or not with a model list.

    """
    headers = {}
    key = os.environ.get(api_key_env) if api_key_env else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    url = base_url.rstrip("/")
    try:
        body = _get_json(f"{url}/models", headers, timeout_s)
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise ServiceUnreachable(_why(err)) from None
    models = body.get("data") if isinstance(body, dict) else None
    if not isinstance(models, list):
        raise ServiceUnreachable(f"{url}/models answered without a model list")
    version = None
    try:
        answer = _get_json(f"{url.removesuffix('/v1')}/version", headers, timeout_s)
        version = str(answer.get("version")) if isinstance(answer, dict) else None
    except (urllib.error.URLError, OSError, ValueError):
        pass  # an OpenAI-compatible server need not say its version
    return Served(tuple(m for m in models if isinstance(m, dict)), version)


def _get_json(url: str, headers: dict[str, str], timeout_s: float) -> Any:  # noqa: ANN401
    request = urllib.request.Request(url, headers=headers, method="GET")
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310 - http(s)
        return json.loads(answer.read())


def _why(err: BaseException) -> str:
    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP {err.code}"
    reason = getattr(err, "reason", None) or err
    return str(getattr(reason, "strerror", None) or reason)


@dataclass(frozen=True)
class Resolved:
    """A run's judge or simulator, found in the registry (and, at job start, asked)."""

    group: str
    record: ServiceRecord
    served: Served | None

    def identity(self) -> dict[str, Any]:
        """The record's identity; the version the server itself reported when it was asked."""
        identity = self.record.identity()
        if self.served is not None and self.served.version:
            identity["server_version"] = self.served.version
        return identity


def resolve_services(
    config: Any,  # noqa: ANN401 - RunConfig
    *,
    wait: bool,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Resolved]:
    """Point every group that names a service (``<group>.service``) at the service's endpoint.

    With ``wait`` (at job start, on the node) it waits up to ``<group>.service_wait_s`` for the
    record and for the server to answer, and checks what the server serves. Without (the checks
    before submitting) it only reads the registry: a service whose job was submitted but has not
    answered yet is no problem then, and the group keeps no endpoint.

    Sets ``<group>.base_url`` (and ``<group>.service_registry``, absolute) on ``config``.

    Raises:
        ConfigError: every group whose service is unknown, of another role, or serves another
            model than the run's, each naming the key.

    """
    resolved, problems = {}, []
    for group in SERVED_GROUPS:
        svc = getattr(config, group)
        name = getattr(svc, "service", None)
        if not name:
            continue
        registry = ServiceRegistry(registry_folder(svc.service_registry))
        svc.service_registry = str(registry.folder)
        try:
            found = _resolve(group, svc, registry, wait=wait, sleep=sleep, clock=clock)
        except ConfigError as err:
            problems += err.problems
            continue
        if found is None:
            svc.base_url = None  # submitted, not answering yet: its job start will resolve it
            continue
        svc.base_url = found.record.base_url
        resolved[group] = found
    if problems:
        raise ConfigError(problems)
    return resolved


def _resolve(
    group: str,
    svc: Any,  # noqa: ANN401 - JudgeConfig or SimulatorConfig
    registry: ServiceRegistry,
    *,
    wait: bool,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> Resolved | None:
    name, key = str(svc.service), f"{group}.service"
    deadline = clock() + (float(svc.service_wait_s) if wait else 0.0)
    record: ServiceRecord | None = None
    for _ in _attempts(wait, deadline, sleep, clock):
        record = registry.record(name)
        if record is not None:
            break
    if record is None:
        job = registry.job(name)
        if job is not None and not wait:
            return None
        waited = f" within {svc.service_wait_s:g} s ({group}.service_wait_s)" if wait else ""
        why = (
            f"its job {job.get('job_id')} has not recorded an answering server{waited}"
            if job is not None
            else f"no service {name!r} in the registry {registry.folder}"
        )
        raise ConfigError(
            [
                Problem(
                    key,
                    why,
                    f"start it: slca-exp serve up service={name} launcher=<profile> (see "
                    f"slca-exp serve status); or point {group}.service_registry at its registry",
                )
            ]
        )
    problems = _record_problems(group, svc, record)
    if problems:
        raise ConfigError(problems)
    if not wait:
        return Resolved(group, record, None)
    served, why = None, ""
    for _ in _attempts(True, deadline, sleep, clock):
        try:
            served = ask_server(record.base_url, svc.api_key_env)
            break
        except ServiceUnreachable as err:
            why = str(err)
            if why in ("HTTP 401", "HTTP 403"):  # it answers, and wants a key the run lacks
                raise ConfigError(
                    [
                        Problem(
                            f"{group}.api_key_env",
                            f"the service {name!r} at {record.base_url} refuses the run's "
                            f"requests ({why}): it requires an API key ({record.api_key_env})",
                            f"export the key and set {group}.api_key_env="
                            f"{record.api_key_env or '<the variable holding it>'}",
                        )
                    ]
                ) from None
            latest = registry.record(name)  # restarted meanwhile: a new endpoint
            record = latest or record
    if served is None:
        raise ConfigError(
            [
                Problem(
                    key,
                    f"the service {name!r} recorded at {record.base_url} does not answer "
                    f"({why}) within {svc.service_wait_s:g} s ({group}.service_wait_s)",
                    f"see slca-exp serve status; restart it: slca-exp serve up service={name}",
                )
            ]
        )
    problems = _served_problems(group, record, served)
    if problems:
        raise ConfigError(problems)
    return Resolved(group, record, served)


def _attempts(
    again: bool,
    deadline: float,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> Iterator[None]:
    """One attempt at once; with ``again``, another every :data:`POLL_S` until ``deadline``.

    The caller stops at the first attempt that succeeds.
    """
    yield
    while again:
        left = deadline - clock()
        if left <= 0:
            return
        sleep(min(POLL_S, left))
        yield


def _record_problems(group: str, svc: Any, record: ServiceRecord) -> list[Problem]:  # noqa: ANN401
    problems = []
    if record.role != group:
        problems.append(
            Problem(
                f"{group}.service",
                f"{record.name!r} is a {record.role} service, not a {group}",
                f"name a {group} service (slca-exp serve status lists them)",
            )
        )
    if svc.model is None:  # judge=served (no model given): the model the service serves
        svc.model = record.served_model_name
    elif svc.model != record.served_model_name:
        problems.append(
            Problem(
                f"{group}.model",
                f"the service {record.name!r} serves {record.served_model_name!r}; the run's "
                f"{group} is {svc.model!r}",
                f"set {group}.model={record.served_model_name} if that is the model you mean, "
                f"or serve the run's model (service.served_model_name={svc.model})",
            )
        )
    return problems


def _served_problems(group: str, record: ServiceRecord, served: Served) -> list[Problem]:
    card = served.card(record.served_model_name)
    where = f"the server at {record.base_url}"
    fix = (
        f"restart the service: slca-exp serve down {record.name}, then slca-exp serve up "
        f"service={record.name}"
    )
    if card is None:
        return [
            Problem(
                f"{group}.service",
                f"{where} serves {served.ids}, not {record.served_model_name!r} as the registry "
                f"records for {record.name!r}: another server took its place",
                fix,
            )
        ]
    length = card.get("max_model_len")
    if record.max_model_len is not None and length is not None and length != record.max_model_len:
        return [
            Problem(
                f"{group}.service",
                f"{where} serves {record.served_model_name!r} with max_model_len {length}; the "
                f"service {record.name!r} is defined with {record.max_model_len}",
                fix,
            )
        ]
    return []


def current_base_url(registry_dir: str | None, name: str) -> str | None:
    """The endpoint the registry records for ``name`` now (a restarted service moves)."""
    record = ServiceRegistry(registry_folder(registry_dir)).record(name)
    return None if record is None else record.base_url
