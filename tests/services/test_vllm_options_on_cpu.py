"""The `vllm serve` command lines against vLLM's own options, recorded from its parser.

vLLM (the `gpu` extra) is a CUDA build that CI does not install, so CI checks the lines against
``slca_exp/services/vllm_serve_options.json``, recorded from the parser of the vLLM that verl's
``vllm`` extra pins. Where vLLM is installed, the tests at the end check the record, the lines
and the checker's verdicts against vLLM's parser itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.requirements import Requirement

from slca_exp.launch.service_definitions import load_service, service_names
from slca_exp.services.definition import (
    FIELD_OPTIONS,
    ServiceDefinition,
    command_problems,
    vllm_command,
    vllm_problems,
)
from slca_exp.services.vllm_line import ServeOptions, line_problems, recorded
from slca_exp.services.vllm_options import (
    RECORD,
    RECORD_COMMAND,
    VALUE_TYPES,
    VllmOption,
    record_path,
)
from tests.skip_policy import require

NO_VLLM = (
    "vLLM is not installed (the gpu extra): the lines are checked against its recorded options"
)
"""Why the tests against vLLM's own parser skip (CI's allow-list names it)."""

RECORDED = recorded()


def line(*args: str) -> list[str]:
    return ["vllm", "serve", "org/m", *args]


# Each line with what vLLM 0.24.0's parser does with it (True: takes it), as its parser answered;
# the checker must answer the same here, and vLLM's parser the same where it is installed.
VERDICTS = [
    (line("--port", "8000", "--enable-prefix-caching"), True),
    (["vllm", "serve", "--port", "8000", "org/m"], True),  # the model after the flags
    (line("--max_model_len", "4096"), True),  # underscores are dashes
    (line("--max-model-len=32k"), True),
    (line("--max-model-len", "auto"), True),
    (line("--max-model-len", "-1"), True),  # a negative number is a value
    (line("-tp", "8", "-q", "fp8"), True),
    (line("-tp=8", "-qfp8"), True),
    (line("--no-enable-prefix-caching"), True),
    (line("--served-model-name", "a", "b"), True),
    (line("--cudagraph-capture-sizes", "1", "2", "4"), True),
    (line("--hf-token"), True),  # an optional value
    (line("--hf-overrides", '{"a": 1}'), True),
    (line("--safetensors-load-strategy", "lazy"), True),
    (line("--max-lora-rank", "8"), True),
    (line("-O3"), True),
    (line("--compilation-config.mode", "3"), True),
    (line("--hf_overrides.rope_theta", "1e6"), True),
    (["vllm", "serve", "--model", "org/m", "--port", "9"], True),  # vLLM moves it to the front
    (line("--tensor-parallel-sise", "8"), False),  # unknown flag
    (line("--bogus.a", "1"), False),
    (line("--dtype", "bf16"), False),  # not a choice
    (line("--max-lora-rank", "7"), False),
    (line("--safetensors-load-strategy", "None"), False),  # vLLM lists None, then refuses it
    (line("--port"), False),  # no value
    (line("--served-model-name"), False),
    (line("--port", "x"), False),  # not an int
    (line("--tensor-parallel-size", "1.5"), False),
    (line("--gpu-memory-utilization", "most"), False),
    (line("--cudagraph-capture-sizes", "1", "x"), False),
    (line("--max-model-len", "32.5K"), False),  # no decimals with a binary suffix
    (line("--port.a", "1"), False),  # a JSON value for an int
    (line("--enable-prefix-caching=true"), False),  # a flag alone
    (line("-tp8"), False),
    (line("--port", "1", "2"), False),  # a second positional
    (line("--model", "other/m"), False),  # a second model
    (["vllm", "serve", "--served-model-name", "x"], False),  # no model first
    (line("--enable"), False),  # ambiguous
]


@functools.cache
def vllm_parser():
    """vLLM's own `vllm` parser (top level, with `serve`), where vLLM is installed."""
    pytest.importorskip("vllm", reason=NO_VLLM)
    from slca_exp.services.record_vllm_options import build_parsers

    return build_parsers()


def vllm_takes(command: list[str]) -> bool:
    """Whether vLLM's own parser takes `command` (`vllm serve ...`)."""
    top, _ = vllm_parser()
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            top.parse_args(command[1:])
        except (SystemExit, Exception):  # vLLM's own rewriting may crash (an IndexError)
            return False
    return True


# --- the lines the definitions build --------------------------------------------------------------


def test_every_shipped_vllm_definition_builds_a_line_the_recorded_parser_takes():
    checked = []
    for name in service_names():
        definition, _, _, problems = load_service(
            name, launcher_overrides=["launcher.partition=null"]
        )
        assert definition is not None and problems == [], (name, problems)
        if definition.uses_vllm:
            command = vllm_command(definition, definition.host, definition.port)
            assert line_problems(command) == [], (name, command)
            checked.append(name)
    assert {"gpt_oss_120b_judge", "qwen3_235b_sgls"} <= set(checked)


_TEXT = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:/=,+-]{0,11}", fullmatch=True)
"""A value that is no flag (it starts with a letter or digit)."""


def _value(option: VllmOption) -> st.SearchStrategy[str]:
    """A value vLLM takes for `option`."""
    if option.choices is not None:  # vLLM refuses the "None" its optional choices list
        return st.sampled_from([str(c) for c in option.choices if c != "None"])
    return {
        "int": st.integers(-(2**40), 2**40).map(str),
        # argparse takes -1e-05 for a flag, and vLLM -0.5 for a dotted one: users write 0.5
        "float": st.floats(0, 1e6).map(repr),
        "human_int": st.sampled_from(["16", "8k", "2M", "1.5g"]),
        "human_int_or_auto": st.sampled_from(["4096", "32k", "auto", "-1"]),
        "json": st.dictionaries(_TEXT, st.integers(0, 9), max_size=2).map(json.dumps),
        "json_or_str": _TEXT.filter(lambda s: "{" not in s),
    }.get(option.type, _TEXT)


def _extra_arg(option: VllmOption) -> st.SearchStrategy[list[str]]:
    """One use of `option` on a command line, with values vLLM takes."""
    flag = st.sampled_from(option.flags)
    if option.nargs == 0:
        return flag.map(lambda f: [f])
    if option.nargs in ("+", "*"):
        return st.tuples(flag, st.lists(_value(option), min_size=1, max_size=3)).map(
            lambda fv: [fv[0], *fv[1]]
        )
    return st.tuples(flag, _value(option)).map(list)


def free_options(options: ServeOptions) -> list[VllmOption]:
    """The options `extra_args` may give, and whose values the record says how to check."""
    return [
        o
        for o in options.options
        if o.dest not in FIELD_OPTIONS
        and o.action in ("store", "store_true", "boolean_optional", "append")
        and o.type not in ("config_json", "other")
        and o.dest != "config"  # it reads a file
    ]


def definitions_for(options: ServeOptions, device: str) -> st.SearchStrategy[ServiceDefinition]:
    """Random definitions of a service on ``device``, their extra args from ``options``."""
    return st.builds(
        ServiceDefinition,
        name=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,15}", fullmatch=True),
        model=st.one_of(
            st.from_regex(r"[A-Za-z0-9][\w.-]{0,15}/[A-Za-z0-9][\w.-]{0,15}", fullmatch=True),
            st.from_regex(r"/[\w./-]{1,30}", fullmatch=True),
        ),
        revision=st.one_of(
            st.none(), st.just("main"), st.from_regex(r"[0-9a-f]{7,40}", fullmatch=True)
        ),
        served_model_name=st.one_of(st.none(), _TEXT),
        tensor_parallel_size=st.integers(1, 64),
        pipeline_parallel_size=st.integers(1, 16),
        max_model_len=st.one_of(st.none(), st.integers(1, 1 << 24)),
        dtype=st.sampled_from(["auto", "bfloat16", "float16", "float32"]),
        quantization=st.one_of(st.none(), st.sampled_from(["fp8", "mxfp4", "awq", "gptq"])),
        gpu_memory_utilization=st.one_of(
            st.none(), st.floats(0, 1, exclude_min=True, allow_subnormal=False)
        ),
        extra_args=st.lists(
            st.sampled_from(free_options(options)).flatmap(_extra_arg), max_size=4
        ).map(lambda uses: [arg for use in uses for arg in use]),
        host=st.sampled_from(["0.0.0.0", "127.0.0.1", "node7", "::"]),
        port=st.integers(0, 65535),
        api_key_env=st.sampled_from([None, "JUDGE_API_KEY"]),
        device=st.just(device),
    )


definitions = definitions_for(RECORDED, "cuda")


@settings(max_examples=60, deadline=None)
@given(definition=definitions)
def test_every_line_a_definition_builds_is_taken_by_the_recorded_parser(definition):
    command = vllm_command(definition, definition.host, definition.port)
    assert line_problems(command) == [], command
    assert command_problems(definition) == [], command  # and the definition checks agree


# --- the checker refuses what vLLM refuses, naming it ------------------------------------------


@pytest.mark.parametrize(("command", "takes"), VERDICTS, ids=[" ".join(c[2:]) for c, _ in VERDICTS])
def test_the_checker_answers_as_vllm_0_24_did_for_each_line(command, takes):
    problems = line_problems(command)
    assert (problems == []) is takes, [str(p) for p in problems]


def test_each_refused_argument_is_named_with_its_position_and_fix():
    def only(*args: str):
        (problem,) = line_problems(line(*args))
        return problem

    unknown = only("--port", "8000", "--enable-prefix-cache")
    assert (unknown.index, unknown.arg) == (5, "--enable-prefix-cache")
    assert unknown.what == "is not a `vllm serve` option of vLLM 0.24.0"
    assert unknown.fix.startswith("did you mean --enable-prefix-caching?")
    choice = only("--dtype", "bf16")
    assert (choice.index, choice.arg) == (3, "--dtype") and "'bf16'" in choice.what
    assert "bfloat16" in choice.fix
    missing = only("--max-model-len")
    assert (missing.arg, missing.what) == ("--max-model-len", "needs a value")
    typed = only("--tensor-parallel-size", "eight")
    assert typed.what == "'eight' is not an integer"
    alone = only("--no-enable-prefix-caching=1")
    assert alone.what == "takes no value" and "--enable-prefix-caching or" in alone.fix
    short = only("--max-model", "10")  # vLLM would expand it; a later vLLM may not
    assert short.fix == "write it out: --max-model-len"
    extra = only("other/m")
    assert (extra.index, extra.arg) == (3, "other/m") and "positional" in extra.what
    assert only("--help").what.startswith("prints vLLM's help and exits")
    wrong = ServeOptions.from_json(json.loads(RECORD.read_text())).problems(["python", "-m"])
    assert [p.arg for p in wrong] == ["python -m"]


def test_a_definition_with_a_flag_vllm_does_not_know_is_refused_naming_extra_args():
    def problems(*overrides: str) -> list[tuple[str, str, str]]:
        _, _, _, found = load_service(
            "gpt_oss_120b_judge", list(overrides), launcher_overrides=["launcher.partition=null"]
        )
        return [(p.key, p.what, p.fix) for p in found]

    assert problems("service.extra_args=[--enable-prefix-caching,--max-num-seqs,64]") == []
    ((key, what, fix),) = problems("service.extra_args=[--enable-prefix-cache]")
    assert key == "service.extra_args"
    assert what == "--enable-prefix-cache: is not a `vllm serve` option of vLLM 0.24.0"
    assert fix.startswith("did you mean --enable-prefix-caching?")
    ((key, what, _),) = problems("service.extra_args=[--max-num-seqs]")
    assert (key, what) == ("service.extra_args", "--max-num-seqs: needs a value")
    ((key, what, _),) = problems("service.extra_args=[--kv-cache-dtype,fp9]")
    assert key == "service.extra_args" and "'fp9' is not one of its choices" in what
    # what a field sets is set there: the launcher checks and the fingerprint read the field
    ((key, what, fix),) = problems("service.extra_args=[-tp,4]")
    assert key == "service.extra_args" and "service.tensor_parallel_size" in what
    assert fix == "set service.tensor_parallel_size and drop -tp from service.extra_args"
    ((key, what, fix),) = problems("service.extra_args=[--api-key,sk-123]")
    assert key == "service.extra_args" and "key on the command line" in what
    assert "service.api_key_env" in fix
    ((key, what, _),) = problems("service.extra_args=[--model,other/m]")
    assert key == "service.extra_args" and "second model" in what
    # a field's own value is named by its key: this one reads as a flag, leaving none
    found = problems("service.served_model_name=--judge")
    assert {key for key, _, _ in found} == {"service.served_model_name"}
    assert ("service.served_model_name", "--served-model-name: needs a value") in [
        (key, what) for key, what, _ in found
    ]
    # a definition with its own command runs no vLLM: its arguments are its own
    own = ServiceDefinition(name="x", model="m", command=["srv"], extra_args=["--anything"])
    assert command_problems(own) == []
    assert vllm_problems(dataclasses.replace(own, command=None)) != []


# --- the record -----------------------------------------------------------------------------------


def test_the_record_is_of_the_vllm_verls_vllm_extra_pins():
    require("verl", reason="needs the verl extra")  # under CI: installed, or the test fails
    requires = importlib.metadata.requires("verl") or []
    pins = [
        Requirement(r)
        for r in requires
        if Requirement(r).name == "vllm"
        and Requirement(r).marker is not None
        and Requirement(r).marker.evaluate({"extra": "vllm"})
    ]
    assert len(pins) == 1, f"verl's `vllm` extra names vLLM {len(pins)} times: {requires}"
    (pinned,) = (s.version for s in pins[0].specifier if s.operator == "==")
    version = importlib.metadata.version("verl")
    assert RECORDED.version == pinned, (
        f"verl {version}'s `vllm` extra pins vLLM {pinned}, the record holds vLLM "
        f"{RECORDED.version}'s options: install vLLM {pinned} and run `{RECORD_COMMAND}`"
    )


def test_the_record_is_what_the_recorder_writes_and_names_its_types():
    from slca_exp.services.record_vllm_options import render

    data = json.loads(RECORD.read_text())
    assert render(data) == RECORD.read_text()  # the recorder's own output, not edited by hand
    assert data["recorded_by"] == RECORD_COMMAND
    assert data["positionals"] == [{"dest": "model_tag", "nargs": "?", "type": "str"}]
    flags = [f for o in RECORDED.options for f in o.flags]
    assert len(flags) == len(set(flags))
    assert {o.type for o in RECORDED.options} <= set(VALUE_TYPES)
    for option in RECORDED.options:
        assert VllmOption.from_json(option.to_json()) == option
        assert (option.nargs == 0) == (option.type in ("bool", "none")), option
    # every flag vllm_command gives is vLLM's, and every option a field sets
    full = ServiceDefinition(
        name="j",
        model="m",
        revision="r",
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        max_model_len=9,
        dtype="float16",
        quantization="fp8",
        gpu_memory_utilization=0.5,
    )
    read = RECORDED.read(vllm_command(full, "h", 1))
    assert read.problems == () and read.model_index == 2
    assert {g.option.dest for g in read.given} | {"model", "api_key"} == set(FIELD_OPTIONS)


# --- vLLM's own parser, where vLLM is installed ---------------------------------------------------


def test_the_record_is_the_installed_vllms_parser_and_it_takes_the_shipped_lines():
    """The installed build's record (the CPU build's here, the CUDA build's on a GPU node)."""
    from slca_exp.services.record_vllm_options import record, render

    _, serve = vllm_parser()
    version = importlib.metadata.version("vllm")
    device = "cpu" if "+cpu" in version else "cuda"
    options = recorded(device)
    assert version == options.version, (
        f"vLLM {version} is installed, the {device} record holds vLLM {options.version}'s "
        f"options: install vLLM {options.version}, or run `{RECORD_COMMAND}` for a new pin"
    )
    assert render(record(serve, version)) == record_path(device).read_text(), (
        f"run `{RECORD_COMMAND}`"
    )
    served = 0
    for name in service_names():
        definition, _, _, _ = load_service(name, launcher_overrides=["launcher.partition=null"])
        if definition is not None and definition.uses_vllm and definition.device == device:
            assert vllm_takes(vllm_command(definition, definition.host, definition.port)), name
            served += 1
    assert served > 0  # a shipped definition of the installed build
    if device == "cuda":  # VERDICTS are vLLM 0.24.0's own answers
        disagree = [(c, t) for c, t in VERDICTS if vllm_takes(c) is not t]
        assert disagree == [], "vLLM's parser answers otherwise than VERDICTS says"
    # the checker, reading this build's record, answers as this build's parser does
    disagree = [c for c, _ in VERDICTS if (not options.problems(c)) is not vllm_takes(c)]
    assert disagree == [], disagree


def installed_device() -> str:
    """The device of the vLLM build installed here (``cuda`` when none is)."""
    try:
        return "cpu" if "+cpu" in importlib.metadata.version("vllm") else "cuda"
    except importlib.metadata.PackageNotFoundError:
        return "cuda"


@settings(max_examples=60, deadline=None)
@given(definition=definitions_for(recorded(installed_device()), installed_device()))
def test_vllms_own_parser_takes_every_line_a_definition_of_its_build_builds(definition):
    assert vllm_takes(vllm_command(definition, definition.host, definition.port))
