"""A service definition: one frozen model, how it is served and what identifies it.

``conf/service/<name>.yaml`` holds one :class:`ServiceDefinition`; ``slca-exp serve up
service=<name>`` starts it as a SLURM job of its own. The job runs :func:`server_command`: by
default vLLM's OpenAI-compatible server, the ``vllm serve`` command line built flag by flag from
the definition (:func:`vllm_command`); a definition may instead give its own ``command`` (the
tests serve the project's loopback server this way, through the same path).

What identifies a served model, whatever host and port it is served on, is
:func:`identity_fields`; :func:`definition_fingerprint` is their sha256, recorded with the service
and with every run judged or simulated through it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slca_exp.config.fields import param
from slca_exp.services.vllm_line import recorded
from slca_exp.services.vllm_options import DEVICES

ROLES = ("judge", "simulator")
DTYPES = ("auto", "bfloat16", "float16", "float32")
"""What ``vllm serve --dtype`` is given (a service's, a checkpoint's for ``slca-exp eval``)."""
"""The run config groups a service can stand behind."""

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
"""A service's registry name: one file name, the same on every host."""

ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""An environment variable's name (``api_key_env``)."""

VLLM_API_KEY_ENV = "VLLM_API_KEY"
"""The variable vLLM's server reads its API key from when ``--api-key`` is not given: the key
reaches the server through its environment, never through its command line."""

PLACEHOLDERS = ("python", "host", "port", "model", "served_model_name", "max_model_len")
"""What a definition's own ``command`` may name in braces (``{port}``), filled in on the node."""
_NAMED = ", ".join("{" + name + "}" for name in PLACEHOLDERS)


@dataclass
class ServiceDefinition:
    """One frozen model served over an OpenAI-compatible API (a ``service`` config option)."""

    name: str = param("", "registry name: runs name it as judge.service / simulator.service")
    role: str = param("judge", "the run config group it serves: judge | simulator", choices=ROLES)
    model: str = param("", "the model to serve: a hub id or a folder on the cluster")
    revision: str | None = param(None, "hub revision (branch, tag or commit) of the weights")
    served_model_name: str | None = param(
        None, "the model id the server answers to (a run's judge.model); null: model"
    )
    device: str = param(
        "cuda",
        "where vLLM serves it: cuda (GPUs, vLLM's CUDA build, the gpu extra) | cpu (vLLM's CPU "
        "build, which make install puts here: tiny models, CI)",
        choices=DEVICES,
    )
    tensor_parallel_size: int = param(1, "GPUs each model replica is split over", gt=0)
    pipeline_parallel_size: int = param(1, "pipeline stages", gt=0)
    max_model_len: int | None = param(None, "context length; null: the model's own", gt=0)
    dtype: str = param("auto", "weights and activations dtype", choices=DTYPES)
    quantization: str | None = param(None, "vLLM --quantization method (mxfp4, fp8, awq, ...)")
    gpu_memory_utilization: float | None = param(
        None, "fraction of each GPU's memory vLLM may use; null: vLLM's default", gt=0, le=1
    )
    extra_args: list[str] = param(
        default_factory=list, help="more `vllm serve` flags, appended as given"
    )
    host: str = param("0.0.0.0", "address the server binds; 0.0.0.0: every interface")  # noqa: S104
    port: int = param(8000, "port the server listens on; 0: a free port picked on the node", ge=0)
    api_key_env: str | None = param(
        None, "NAME of the env var holding the key the server requires (never the key)"
    )
    command: list[str] | None = param(
        None,
        "the server's own command instead of vLLM's; may name {python} {host} {port} {model} "
        "{served_model_name} {max_model_len}",
    )
    health_timeout_s: float = param(
        1800.0, "how long the job waits for the server to answer with the model", gt=0
    )
    launcher: str = param("slurm_gpu_8x", "cluster profile of the service's job (launcher=...)")
    resources: dict[str, Any] = param(
        default_factory=dict,
        help="what the service needs of any profile: launcher.<key> values (gpus_per_node, "
        "cpus_per_task, mem_gb, timeout_min) over the profile's; launcher.<key>= wins over both",
    )

    @property
    def model_id(self) -> str:
        """The model id the server answers to (``served_model_name``, else ``model``)."""
        return self.served_model_name or self.model

    @property
    def uses_vllm(self) -> bool:
        """Whether the job runs vLLM (no ``command`` of its own)."""
        return not self.command


def identity_fields(definition: ServiceDefinition) -> dict[str, Any]:
    """What decides the answers a service gives: not its host, port, key or resources.

    >>> identity_fields(ServiceDefinition(name="j", model="m"))["served_model_name"]
    'm'
    """
    return {
        "model": definition.model,
        "revision": definition.revision,
        "served_model_name": definition.model_id,
        "max_model_len": definition.max_model_len,
        "dtype": definition.dtype,
        "quantization": definition.quantization,
        "tensor_parallel_size": definition.tensor_parallel_size,
        "pipeline_parallel_size": definition.pipeline_parallel_size,
        "extra_args": list(definition.extra_args),
        "command": list(definition.command) if definition.command else None,
        # vLLM's CPU build computes otherwise than its CUDA build (said only when it is the CPU:
        # the fingerprints of GPU services stay what they were)
        **({"device": "cpu"} if definition.device == "cpu" else {}),
    }


def definition_fingerprint(definition: ServiceDefinition) -> str:
    """sha256 (hex) of the canonical JSON of :func:`identity_fields`.

    >>> from dataclasses import replace
    >>> a = ServiceDefinition(name="a", model="m", port=1)
    >>> definition_fingerprint(a) == definition_fingerprint(replace(a, port=2))
    True
    >>> definition_fingerprint(a) == definition_fingerprint(replace(a, dtype="float16"))
    False
    """
    canonical = json.dumps(identity_fields(definition), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def vllm_command(definition: ServiceDefinition, host: str, port: int) -> list[str]:
    """The ``vllm serve`` command line of ``definition``, listening on ``host:port``.

    Only flags whose value differs from vLLM's default are given. The API key is not on it:
    the job hands it to the server as ``$VLLM_API_KEY`` (:data:`VLLM_API_KEY_ENV`).

    >>> judge = ServiceDefinition(name="j", model="org/m", max_model_len=4096)
    >>> vllm_command(judge, "0.0.0.0", 8000)
    ['vllm', 'serve', 'org/m', '--host', '0.0.0.0', '--port', '8000', '--served-model-name', \
'org/m', '--max-model-len', '4096']
    """
    return [arg for _, args in _vllm_parts(definition, host, port) for arg in args]


def _vllm_parts(d: ServiceDefinition, host: str, port: int) -> list[tuple[str, list[str]]]:
    """:func:`vllm_command` in pieces, each with the definition's key it comes from."""
    parts = [
        ("service", ["vllm", "serve"]),
        ("service.model", [d.model]),
        ("service.host", ["--host", host]),
        ("service.port", ["--port", str(port)]),
        ("service.served_model_name", ["--served-model-name", d.model_id]),
    ]
    if d.revision:
        parts.append(("service.revision", ["--revision", d.revision]))
    if d.tensor_parallel_size != 1:
        parts.append(
            (
                "service.tensor_parallel_size",
                ["--tensor-parallel-size", str(d.tensor_parallel_size)],
            )
        )
    if d.pipeline_parallel_size != 1:
        parts.append(
            (
                "service.pipeline_parallel_size",
                ["--pipeline-parallel-size", str(d.pipeline_parallel_size)],
            )
        )
    if d.max_model_len is not None:
        parts.append(("service.max_model_len", ["--max-model-len", str(d.max_model_len)]))
    if d.dtype != "auto":
        parts.append(("service.dtype", ["--dtype", d.dtype]))
    if d.quantization:
        parts.append(("service.quantization", ["--quantization", d.quantization]))
    if d.gpu_memory_utilization is not None:
        utilization = f"{d.gpu_memory_utilization:g}"
        parts.append(("service.gpu_memory_utilization", ["--gpu-memory-utilization", utilization]))
    parts.append(("service.extra_args", [str(a) for a in d.extra_args]))
    return parts


FIELD_OPTIONS = {
    "model": "service.model",
    "host": "service.host",
    "port": "service.port",
    "served_model_name": "service.served_model_name",
    "revision": "service.revision",
    "tensor_parallel_size": "service.tensor_parallel_size",
    "pipeline_parallel_size": "service.pipeline_parallel_size",
    "max_model_len": "service.max_model_len",
    "dtype": "service.dtype",
    "quantization": "service.quantization",
    "gpu_memory_utilization": "service.gpu_memory_utilization",
    "api_key": "service.api_key_env",
}
"""The vLLM options (their ``dest``) a definition's field sets: not for ``extra_args``."""


def vllm_problems(definition: ServiceDefinition) -> list[tuple[str, str, str]]:
    """(key, what, fix) for each problem of the definition's ``vllm serve`` line.

    The line is read against the options of the vLLM build of the definition's ``device``
    (``cuda``: the one the ``gpu`` extra pins; ``cpu``: the CPU build), recorded from its parser
    (:mod:`slca_exp.services.vllm_line`); each problem names the field it comes from.
    ``extra_args`` may not set what a field sets: vLLM would take the last, while the launcher
    checks and the fingerprint take the field; nor the API key, which would be on the line.

    >>> vllm_problems(ServiceDefinition(name="j", model="m", extra_args=["--enable-prefix-cache"]))
    [('service.extra_args', '--enable-prefix-cache: is not a `vllm serve` option of vLLM 0.24.0', \
"did you mean --enable-prefix-caching? `vllm serve --help` lists vLLM 0.24.0's options")]
    """
    parts = _vllm_parts(definition, definition.host, definition.port)
    line = [arg for _, args in parts for arg in args]
    owners = [key for key, args in parts for _ in args]
    read = recorded(definition.device).read(line)
    found = [(owners[p.index], f"{p.arg}: {p.what}", p.fix) for p in read.problems]
    extra = len(line) - len(definition.extra_args)
    for given in read.given:
        key = FIELD_OPTIONS.get(given.option.dest)
        if given.index < extra or key is None:
            continue
        arg = line[given.index]
        if key == "service.api_key_env":
            what = f"{arg} would put the key on the command line, where ps shows it"
            fix = "export the key and set service.api_key_env=<its variable's NAME>"
        else:
            what = (
                f"{arg} sets what {key} sets: vLLM would take the last one, the launcher "
                "checks and the fingerprint the field"
            )
            fix = f"set {key} and drop {arg} from service.extra_args"
        found.append(("service.extra_args", what, fix))
    return found


def server_command(
    definition: ServiceDefinition, host: str, port: int, python: str = sys.executable
) -> list[str]:
    """The command the service's job runs: its own ``command``, filled in, else vLLM's.

    >>> own = ["{python}", "-m", "srv", "--port={port}"]
    >>> d = ServiceDefinition(name="j", model="m", command=own)
    >>> server_command(d, "127.0.0.1", 9, python="py")
    ['py', '-m', 'srv', '--port=9']
    """
    if definition.uses_vllm:
        command = vllm_command(definition, host, port)
        beside = Path(python).parent / "vllm"  # the vllm of the job's environment
        if shutil.which("vllm") is None and beside.is_file():
            command[0] = str(beside)
        return command
    values = {
        "python": python,
        "host": host,
        "port": str(port),
        "model": definition.model,
        "served_model_name": definition.model_id,
        "max_model_len": "" if definition.max_model_len is None else str(definition.max_model_len),
    }
    assert definition.command is not None
    return [str(part).format(**values) for part in definition.command]


def command_problems(definition: ServiceDefinition) -> list[tuple[str, str, str]]:
    """(key, what, fix) for each problem of the definition alone (the launcher's are elsewhere).

    >>> command_problems(ServiceDefinition(name="a b", model="m"))[0][0]
    'service.name'
    """
    found = []
    if not NAME_PATTERN.fullmatch(definition.name or ""):
        found.append(
            (
                "service.name",
                f"{definition.name!r} is not a registry name (letters, digits, _ . -)",
                "set service.name=my_judge",
            )
        )
    if not definition.model:
        found.append(("service.model", "no model to serve", "set service.model=<hub id or folder>"))
    if definition.api_key_env and not ENV_NAME_PATTERN.fullmatch(definition.api_key_env):
        found.append(
            (
                "service.api_key_env",
                f"{definition.api_key_env!r} is not an environment variable's name",
                "give the NAME of the variable holding the key (service.api_key_env=JUDGE_API_KEY)",
            )
        )
    if definition.command is not None and not definition.command:
        found.append(
            ("service.command", "is an empty command", "give the command, or null for vLLM's")
        )
    for part in definition.command or []:
        try:
            str(part).format(**dict.fromkeys(PLACEHOLDERS, ""))
        except (KeyError, IndexError, ValueError) as err:
            found.append(
                (
                    "service.command",
                    f"{part!r} names {err} in braces, which is not filled in",
                    f"use only {_NAMED} (double a brace to keep it: {{{{)",
                )
            )
    for key, value in definition.resources.items():
        if not isinstance(value, (int, float, str, bool)) and value is not None:
            found.append(
                (
                    f"service.resources.{key}",
                    f"is {type(value).__name__}; a resource is one value",
                    f"give service.resources.{key} a number or a string",
                )
            )
    if definition.device == "cpu" and definition.uses_vllm:
        for key in ("tensor_parallel_size", "pipeline_parallel_size"):
            if getattr(definition, key) != 1:
                found.append(
                    (
                        f"service.{key}",
                        "vLLM's CPU build serves from one process here (service.device=cpu)",
                        f"set service.{key}=1, or serve on GPUs (service.device=cuda)",
                    )
                )
    if definition.port > 65535:
        found.append(("service.port", f"{definition.port} is not a port", "give 0 to 65535"))
    if definition.uses_vllm and definition.model:
        found += vllm_problems(definition)
    return found
