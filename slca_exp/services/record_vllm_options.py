"""Record the installed vLLM's ``vllm serve`` options into ``vllm_serve_options.json``.

Run it where the vLLM the ``gpu`` extra pins is installed (a GPU node with ``pip install
'slca-exp[gpu]'``, or any machine with that vLLM's wheel)::

    python -m slca_exp.services.record_vllm_options          # writes the record
    python -m slca_exp.services.record_vllm_options --check  # exit 1 if the record differs

It builds the parser ``vllm serve`` parses its arguments with (vLLM's ``make_arg_parser`` on the
``serve`` subparser of a ``FlexibleArgumentParser``, as ``vllm.entrypoints.cli`` builds it) and
writes each option as argparse holds it: its flags, action, ``nargs``, choices, and the type of
its value, named from vLLM's converter (:data:`slca_exp.services.vllm_options.VALUE_TYPES`).
Defaults and help texts are left out: the defaults depend on the machine's platform, the options
do not. :mod:`slca_exp.services.vllm_line` reads the record; nothing here runs without vLLM.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from slca_exp.services.vllm_options import RECORD_COMMAND, VllmOption, record_path

PARSER = (
    "{module}.make_arg_parser on the `serve` subparser of "
    "vllm.utils.argparse_utils.FlexibleArgumentParser"
)
"""Where the recorded options come from (written into the record, ``module`` filled in)."""

_ACTIONS = {
    argparse._StoreAction: "store",
    argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false",
    argparse._StoreConstAction: "store_const",
    argparse._AppendAction: "append",
    argparse._AppendConstAction: "append_const",
    argparse._CountAction: "count",
    argparse._HelpAction: "help",
    argparse._VersionAction: "version",
    argparse.BooleanOptionalAction: "boolean_optional",
}
"""argparse's action classes by the name the record gives them (others: their class's path)."""

_BOOL_ACTIONS = ("store_true", "store_false", "boolean_optional")
"""The actions whose flag alone sets a bool (``--x`` / ``--no-x``)."""

_WRAPPERS = {
    "optional_type.<locals>._optional_type": True,  # "" and "None" are None, else return_type
    "parse_type.<locals>._parse_type": False,  # return_type, its ValueError an argparse error
}
"""vLLM's converters that wrap another (``return_type``): whether the wrapper takes None."""


def build_parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The ``vllm`` command's parser with its ``serve`` subcommand, and that subcommand's parser.

    ``top.parse_args(["serve", model, ...])`` parses a ``vllm serve`` line as the ``vllm``
    command does: the top-level ``FlexibleArgumentParser`` rewrites the arguments first
    (``--model``, underscores, ``-O3``, ``--json-flag.key``), then the subparser parses them.
    """
    from vllm import platforms

    # vLLM picks the CPU platform only for a CPU build; its CUDA wheel on a machine without a
    # GPU finds no platform, and building the parser then fails computing a default device. The
    # platform gives defaults only (not recorded), so use the CPU one, as `vllm bench` does.
    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = top.add_subparsers(required=False, dest="subparser")
    serve = subparsers.add_parser("serve", usage="vllm serve [model_tag] [options]")
    return top, make_arg_parser()(serve)


def make_arg_parser() -> Callable[[argparse.ArgumentParser], argparse.ArgumentParser]:
    """The ``make_arg_parser`` of vLLM, from where the installed vLLM keeps it."""
    try:  # vLLM 0.25 and later
        from vllm.entrypoints.launchers.cli_args import make_arg_parser as make
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser as make
    return make


def value_type(action: argparse.Action) -> tuple[str, bool, str | None]:
    """(type, none_ok, converter) of an option's value, named from vLLM's converter."""
    from vllm.engine import arg_utils
    from vllm.utils import argparse_utils

    convert, none_ok = action.type, False
    while getattr(convert, "__qualname__", None) in _WRAPPERS:
        none_ok |= _WRAPPERS[convert.__qualname__]
        convert = inspect.getclosurevars(convert).nonlocals["return_type"]
    named = {
        str: "str",
        int: "int",
        float: "float",
        json.loads: "json",
        argparse_utils.human_readable_int: "human_int",
        argparse_utils.human_readable_int_or_auto: "human_int_or_auto",
        arg_utils.union_dict_and_str: "json_or_str",
    }
    if convert is None:  # argparse keeps the string
        return "str", none_ok, None
    if convert in named:
        return named[convert], none_ok, None
    name = f"{convert.__module__}.{convert.__qualname__}"
    if convert.__qualname__.endswith(".parse_dataclass"):  # a config class, from its JSON
        return "config_json", none_ok, name
    return "other", none_ok, name


def recorded_option(action: argparse.Action) -> VllmOption:
    """One option of the parser as the record holds it."""
    kind, none_ok, converter = value_type(action)
    cls = type(action)
    if action.nargs == 0:  # a flag alone: it sets a bool (store_true, --x/--no-x) or a const
        kind = "bool" if _ACTIONS.get(cls) in _BOOL_ACTIONS else "none"
    choices = None if action.choices is None else tuple(action.choices)
    for choice in choices or ():
        if not isinstance(choice, (str, int, float, bool)):
            raise TypeError(
                f"{action.option_strings}: choice {choice!r} is a {type(choice).__name__}, "
                "which the record cannot hold as argparse compares it; teach value_type it"
            )
    return VllmOption(
        flags=tuple(action.option_strings),
        dest=action.dest,
        action=_ACTIONS.get(cls, f"{cls.__module__}.{cls.__qualname__}"),
        nargs=action.nargs,
        type=kind,
        none_ok=none_ok,
        choices=choices,
        converter=converter,
    )


def record(serve: argparse.ArgumentParser, version: str) -> dict[str, Any]:
    """The record of ``serve``'s options (vLLM ``version``)."""
    options = [recorded_option(a) for a in serve._actions if a.option_strings]
    positionals = [
        {"dest": a.dest, "nargs": a.nargs, "type": value_type(a)[0]}
        for a in serve._actions
        if not a.option_strings
    ]
    return {
        "vllm": version,
        "recorded_by": RECORD_COMMAND,
        "parser": PARSER.format(module=make_arg_parser().__module__),
        "positionals": positionals,
        "options": [o.to_json() for o in sorted(options, key=lambda o: o.name)],
    }


def render(data: dict[str, Any]) -> str:
    """The record as the file holds it: JSON, one option a line (a new vLLM diffs line by line)."""
    head = [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in data.items() if k != "options"]
    options = [f"    {json.dumps(o)}" for o in data["options"]]
    return "\n".join(["{", *head, '  "options": [', ",\n".join(options), "  ]", "}", ""])


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or ``--check``) the record of the installed vLLM's ``vllm serve`` options."""
    cli = argparse.ArgumentParser(prog=RECORD_COMMAND, description=__doc__.splitlines()[0])
    cli.add_argument(
        "--output",
        type=Path,
        default=None,
        help="the record (default: the shipped one of the installed build, CPU or not)",
    )
    cli.add_argument("--check", action="store_true", help="compare, write nothing; 1 if differs")
    args = cli.parse_args(argv)
    version = importlib.metadata.version("vllm")
    args.output = args.output or record_path("cpu" if "+cpu" in version else "cuda")
    _, serve = build_parsers()
    data = record(serve, version)
    text = render(data)
    if args.check:
        same = args.output.exists() and args.output.read_text() == text
        print(f"{args.output}: {'matches' if same else 'differs from'} vLLM {version}'s options")
        return 0 if same else 1
    args.output.write_text(text)
    print(f"recorded {len(data['options'])} options of vLLM {version} in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
