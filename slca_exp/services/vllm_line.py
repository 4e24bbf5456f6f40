"""A ``vllm serve`` command line, read against vLLM's recorded options as its parser reads it.

:func:`line_problems` reads a command line as vLLM's ``FlexibleArgumentParser`` does
(underscores for dashes, ``--flag=value``, ``--json-flag.key value``, ``-O3``) and names each
problem with its argument: a flag vLLM does not know, a missing value, a value of the wrong type
or outside its choices, a second model. Stricter than vLLM: an abbreviated flag, which vLLM's
argparse expands while it is unambiguous, is refused (a later vLLM may add a flag that makes it
ambiguous), and so is ``--help``, after which no server starts. Left to vLLM, which checks them
when the server starts: a config option's JSON against its config class (type ``config_json``),
values of its own converters and actions (type ``other``, ``--lora-modules``), and the file
``--config`` names. The options come from the record of the service's vLLM build
(:func:`slca_exp.services.vllm_options.record_path`).

>>> [p.arg for p in line_problems(["vllm", "serve", "org/m", "--tensor-parallel-sise", "8"])]
['--tensor-parallel-sise']
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from slca_exp.services.vllm_options import VllmOption, record_path

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
"""What argparse takes for a negative number, a value rather than a flag (vLLM declares no flag
that looks like one)."""


@dataclass(frozen=True)
class LineProblem:
    """One thing vLLM's parser would refuse on a command line.

    Attributes:
        index: the argument's position in the line (``0`` is ``vllm``).
        arg: the argument as given.
        what: what is wrong.
        fix: how to fix it.

    """

    index: int
    arg: str
    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.arg}: {self.what} ({self.fix})"


@dataclass(frozen=True)
class GivenOption:
    """An option as a command line gives it: where, which, and its values."""

    index: int
    option: VllmOption
    values: tuple[str, ...]


@dataclass(frozen=True)
class ReadLine:
    """A command line read against the record: the model, the options, the problems."""

    model_index: int | None
    given: tuple[GivenOption, ...]
    problems: tuple[LineProblem, ...]


class ServeOptions:
    """The options of one vLLM's ``vllm serve`` and the reading of a command line against them."""

    def __init__(self, version: str, options: Sequence[VllmOption], positionals: int = 1) -> None:
        self.version = version
        self.options = tuple(options)
        self.positionals = positionals
        self._by_flag = {flag: option for option in self.options for flag in option.flags}
        self._long = sorted(f for f in self._by_flag if f.startswith("--"))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServeOptions:
        """The options of a record (a record file's content)."""
        options = [VllmOption.from_json(o) for o in data["options"]]
        return cls(data["vllm"], options, len(data["positionals"]))

    def option(self, flag: str) -> VllmOption | None:
        """The option ``flag`` names exactly (no abbreviation), after vLLM's dash rule."""
        return self._by_flag.get(_dashes(flag))

    def read(self, line: Sequence[str]) -> ReadLine:
        """``line`` (``vllm serve ...``) as vLLM's parser reads it, with every problem."""
        line = [str(arg) for arg in line]
        if line[:2] != ["vllm", "serve"]:
            head = " ".join(line[:2])
            problem = LineProblem(0, head, "is not a `vllm serve` command line", "start it so")
            return ReadLine(None, (), (problem,))
        tokens, problems = _flexible(line)
        return self._argparse(tokens, problems)

    def problems(self, line: Sequence[str]) -> list[LineProblem]:
        """What vLLM's parser would refuse on ``line``; empty: it takes the line."""
        return list(self.read(line).problems)

    def _argparse(self, tokens: list[tuple[int, str]], found: list[LineProblem]) -> ReadLine:
        """The argparse pass over the tokens ``_flexible`` left, as vLLM's parser runs it."""
        given: list[GivenOption] = []
        positionals: list[tuple[int, str]] = []
        k, only_positionals = 0, False
        while k < len(tokens):
            index, arg = tokens[k]
            k += 1
            if only_positionals or not self._is_flag(arg):
                positionals.append((index, arg))
                continue
            if arg == "--":  # argparse: everything after it is positional
                only_positionals = True
                continue
            option, explicit, problem = self._resolve(index, arg)
            if problem is not None:
                found.append(problem)
            if option is not None and option.action in ("help", "version"):
                what = f"prints vLLM's {option.action} and exits: no server would start"
                found.append(LineProblem(index, arg, what, f"drop {arg}"))
            if option is None:
                while k < len(tokens) and not self._is_flag(tokens[k][1]):
                    k += 1  # its values, most likely: one problem is enough
                continue
            if explicit is not None:
                values = [explicit]
            else:
                values = []
                while k < len(tokens) and not self._is_flag(tokens[k][1]):
                    if option.nargs in (None, "?") and values:
                        break
                    if isinstance(option.nargs, int) and len(values) >= option.nargs:
                        break
                    values.append(tokens[k][1])
                    k += 1
            found += _count_problems(index, arg, option, values, explicit is not None)
            found += [
                LineProblem(index, arg, what, _value_fix(option))
                for what in (_value_problem(option, v) for v in values)
                if what
            ]
            given.append(GivenOption(index, option, tuple(values)))
        model = positionals[0][0] if positionals else None
        for index, arg in positionals[self.positionals :]:
            found.append(
                LineProblem(
                    index,
                    arg,
                    f"is one positional argument too many: `vllm serve` takes the model "
                    f"({positionals[0][1]!r}) and flags",
                    "give a flag's values right after the flag, one argument each",
                )
            )
        return ReadLine(model, tuple(given), tuple(sorted(found, key=lambda p: p.index)))

    def _is_flag(self, arg: str) -> bool:
        """Whether argparse takes ``arg`` for a flag (else it is a value or a positional)."""
        if not arg.startswith("-") or arg == "-":
            return False
        if arg in self._by_flag or arg.split("=", 1)[0] in self._by_flag:
            return True
        return not _NEGATIVE_NUMBER.match(arg) and " " not in arg

    def _resolve(
        self, index: int, arg: str
    ) -> tuple[VllmOption | None, str | None, LineProblem | None]:
        """The option ``arg`` names, its ``=value`` if any, and the problem with the flag."""
        flag, _, value = arg.partition("=")
        explicit = value if "=" in arg else None
        if flag in self._by_flag:
            return self._by_flag[flag], explicit, None
        if not flag.startswith("--") and flag[:2] in self._by_flag and len(flag) > 2:
            return self._by_flag[flag[:2]], flag[2:], None  # argparse's -qfp8 = -q fp8
        if flag.startswith("--"):
            longer = [f for f in self._long if f.startswith(flag)]
            if len(longer) == 1:
                what = f"abbreviates {longer[0]} (vLLM {self.version} expands it, a later may not)"
                fix = f"write it out: {longer[0]}"
                return self._by_flag[longer[0]], explicit, LineProblem(index, arg, what, fix)
            if longer:
                shown = ", ".join(longer[:5]) + (", ..." if len(longer) > 5 else "")
                what = f"is ambiguous: it abbreviates {shown}"
                return None, None, LineProblem(index, arg, what, "write the one you mean in full")
        close = difflib.get_close_matches(flag, self._long, n=6, cutoff=0.75)
        near = list(dict.fromkeys(self._by_flag[f].name for f in close))[:3]  # --x for --no-x
        fix = f"did you mean {' or '.join(near)}? " if near else ""
        fix += f"`vllm serve --help` lists vLLM {self.version}'s options"
        what = f"is not a `vllm serve` option of vLLM {self.version}"
        return None, None, LineProblem(index, arg, what, fix)


def _dashes(arg: str) -> str:
    """The flag as vLLM reads it: in a ``--`` flag, ``_`` before the first ``.`` is ``-``."""
    if not arg.startswith("--"):
        return arg
    key, eq, value = arg.partition("=")
    head, dot, tail = key[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail + eq + value


def _flexible(line: list[str]) -> tuple[list[tuple[int, str]], list[LineProblem]]:
    """What vLLM's ``FlexibleArgumentParser.parse_args`` makes of ``vllm serve`` arguments.

    Mirrors vLLM 0.24's rewriting before argparse, keeping each token's index in ``line``:
    ``--model M`` moves to the front as the model, ``--a_b`` is ``--a-b``, ``-O3`` is
    ``--optimization-level 3``, and ``--x.key value`` (``--x.key+ a,b``) become one
    ``--x '{"key": ...}'`` at the end.
    """
    problems: list[LineProblem] = []
    args = list(enumerate(line))[2:]
    model_at = next((k for k, (_, a) in enumerate(args) if re.match(r"^--model(=.+|$)", a)), None)
    if model_at is not None:  # vLLM warns, then moves its value to the front as the model
        index, arg = args[model_at]
        fix = "give the model once, first: vllm serve <model> [options]"
        if arg == "--model":
            if model_at + 1 >= len(args):
                return [], [LineProblem(index, arg, "needs a value", fix)]
            moved, rest = [args[model_at + 1]], model_at + 2
        else:
            moved, rest = [(index, arg.removeprefix("--model="))], model_at + 1
        if not args[0][1].startswith("-"):  # vLLM then refuses the model given first
            what = "gives a second model: vLLM moves it to the front, then refuses the first"
            problems.append(LineProblem(index, arg, what, fix))
            moved = []
        args = moved + args[:model_at] + args[rest:]
    if (
        args
        and args[0][1].startswith("-")
        and not any(re.match(r"^--config(=.+|$)", a) for _, a in args)
        and any(re.match(r"^--served[-_]model[-_]name(=.+|$)", a) for _, a in args)
    ):
        index, arg = args[0]
        what = "comes before the model: vLLM refuses --served-model-name without a model first"
        problems.append(LineProblem(index, arg, what, "vllm serve <model> [options]"))
    tokens: list[tuple[int, str]] = []
    for k, (index, arg) in enumerate(args):
        if arg.startswith("--"):
            tokens.append((index, _dashes(arg)))
        elif arg.startswith("-O") and arg != "-O":
            level = arg[3:] if arg[2] == "=" else arg[2:]
            tokens += [(index, "--optimization-level"), (index, level)]
        elif arg == "-O" and k + 1 < len(args) and args[k + 1][1] in {"0", "1", "2", "3"}:
            tokens.append((index, "--optimization-level"))
        else:
            tokens.append((index, arg))
    return _dotted(tokens, problems), problems


def _dotted(tokens: list[tuple[int, str]], problems: list[LineProblem]) -> list[tuple[int, str]]:
    """``--x.key value`` tokens merged into one ``--x <json>`` each, at the end (as vLLM does)."""
    kept: list[tuple[int, str]] = []
    merged: dict[str, tuple[int, dict[str, Any]]] = {}
    skip = set()
    for k, (index, arg) in enumerate(tokens):
        if k in skip:
            continue
        if not (arg.startswith("-") and "." in arg):
            kept.append((index, arg))
            continue
        if "=" in arg:
            key, value = arg.split("=", 1)
            if "." not in key:  # the '.' was in the value
                kept.append((index, arg))
                continue
        elif k + 1 < len(tokens):
            key, value = arg, tokens[k + 1][1]
            skip.add(k + 1)
        else:
            problems.append(LineProblem(index, arg, "needs a value", f"give it one: {arg} <value>"))
            continue
        if key.endswith("+"):
            key, value = key[:-1], json.dumps(value.split(","))
        flag, *path = key.split(".")
        try:
            parsed: Any = json.loads(value)
        except json.JSONDecodeError:
            try:
                parsed = _human_int(value)
            except ValueError:
                parsed = value
        for part in reversed(path):
            parsed = {part: parsed}
        _merge(merged.setdefault(flag, (index, {}))[1], parsed)
    return kept + [t for flag, (i, d) in merged.items() for t in ((i, flag), (i, json.dumps(d)))]


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    """Merge dotted values as vLLM does: dicts merge, lists extend, anything else replaces."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] += value
        else:
            into[key] = value


def _count_problems(
    index: int, arg: str, option: VllmOption, values: list[str], explicit: bool
) -> list[LineProblem]:
    """The problem, if any, with how many values ``option`` got."""
    n, nargs = len(values), option.nargs
    if nargs == 0 and n:
        negated = [f for f in option.flags if f.startswith("--no-")]
        if negated:
            fix = f"give {option.name} or {negated[0]}, with no value"
        else:
            fix = f"give {option.name} alone"
        return [LineProblem(index, arg, "takes no value", fix)]
    if (nargs is None or nargs == "+") and n == 0:
        return [LineProblem(index, arg, "needs a value", _value_fix(option))]
    if isinstance(nargs, int) and nargs > 0 and n != nargs:
        what = f"takes {nargs} values, " + ("one given with '='" if explicit else f"{n} given")
        return [LineProblem(index, arg, what, _value_fix(option))]
    return []


_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "json": "JSON",
    "json_or_str": "JSON (or a string without braces)",
    "human_int": "an integer (32k, 2M allowed)",
    "human_int_or_auto": "an integer (32k, 2M allowed), -1 or auto",
}


def _value_fix(option: VllmOption) -> str:
    """How to give ``option`` a value vLLM takes."""
    if option.choices is not None:
        return f"give {option.name} one of: {', '.join(map(str, option.choices))}"
    word = _TYPE_WORDS.get(option.type, "a value")
    return f"give {option.name} {word}"


def _value_problem(option: VllmOption, value: str) -> str | None:
    """What vLLM's parser would say about ``value`` for ``option``; None: it takes it."""
    convert = _CONVERTERS.get(option.type)
    if convert is None:  # vLLM's own converter: vLLM checks it when it starts
        return None
    if option.none_ok and value in ("", "None"):
        converted: Any = None
    else:
        try:
            converted = convert(value)
        except ValueError:
            return f"{value!r} is not {_TYPE_WORDS.get(option.type, option.type)}"
    if option.choices is not None and converted not in option.choices:
        return f"{value!r} is not one of its choices"
    return None


def _human_int(value: str) -> int:
    """As vLLM's ``human_readable_int``: ``25.6k`` is 25600, ``1K`` 1024, else a plain integer."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if not match:
        return int(value)
    number, suffix = match.groups()
    if suffix in "kmgt":
        return int(float(number) * 10 ** (3 * " kmgt".index(suffix)))
    if "." in number:  # vLLM: decimals are not allowed with binary suffixes
        raise ValueError(f"{value}: no decimals with a binary suffix")
    return int(number) * 2 ** (10 * " KMGT".index(suffix))


def _human_int_or_auto(value: str) -> int:
    """As vLLM's ``human_readable_int_or_auto``: ``-1`` or ``auto`` are -1, else a human int."""
    stripped = value.strip()
    return -1 if stripped == "-1" or stripped.lower() == "auto" else _human_int(stripped)


def _json_or_str(value: str) -> Any:
    """As vLLM's ``union_dict_and_str``: JSON if it looks like an object, else the string."""
    return json.loads(value) if re.match(r"(?s)^\s*{.*}\s*$", value) else value


_CONVERTERS: dict[str, Callable[[str], Any]] = {
    "str": str,
    "int": int,
    "float": float,
    "json": json.loads,
    "json_or_str": _json_or_str,
    "human_int": _human_int,
    "human_int_or_auto": _human_int_or_auto,
}
"""Each checked value type as vLLM's parser converts it (a ValueError: vLLM refuses it)."""


@functools.cache
def recorded(device: str = "cuda") -> ServeOptions:
    """The options of the record of ``device``'s vLLM build (read once).

    :data:`~slca_exp.services.vllm_options.RECORD` for ``cuda``, the CPU build's for ``cpu``.
    """
    return ServeOptions.from_json(json.loads(record_path(device).read_text()))


def line_problems(line: Sequence[str], options: ServeOptions | None = None) -> list[LineProblem]:
    """What the recorded vLLM's parser would refuse on the ``vllm serve`` command ``line``.

    >>> line_problems(["vllm", "serve", "org/m", "--port", "8000", "--enable-prefix-caching"])
    []
    >>> [str(p) for p in line_problems(["vllm", "serve", "org/m", "--dtype", "bf16"])]
    ["--dtype: 'bf16' is not one of its choices (give --dtype one of: auto, bfloat16, float, \
float16, float32, half)"]
    """
    return (options or recorded()).problems(line)
