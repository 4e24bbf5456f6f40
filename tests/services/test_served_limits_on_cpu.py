"""A judge or simulator budget its server cannot take is refused before a run (``limits.py``).

The loopback server reports ``max_model_len`` in ``GET /v1/models`` as vLLM does; it has no
``POST /tokenize``, so the prompt's floor is unknown there and one token is assumed (the real
vLLM, with its tokenizer, is asked in ``tests/launch/test_serve_vllm_slurm.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.preflight.compose import compose_run
from slca_exp.preflight.served_limits import served_limit_problems
from slca_exp.preflight.validate import validate
from slca_exp.services.limits import count_prompt_tokens, length_problems
from slca_exp.services.loopback import DEFAULT_MODEL, serve_in_thread

EXE = str(Path(sys.executable).parent / "slca-exp")


def judged_by(url: str, *more: str):
    overrides = ["judge=openai", f"judge.base_url={url}", f"judge.model={DEFAULT_MODEL}", *more]
    return validate(compose_run(overrides))


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(1, 70_000),
    max_tokens=st.integers(1, 70_000),
    prompt=st.one_of(st.none(), st.integers(0, 70_000)),
)
def test_a_budget_is_refused_exactly_when_it_and_the_prompt_exceed_the_limit(
    limit, max_tokens, prompt
):
    card = {"id": "m", "max_model_len": limit}
    problems = length_problems("judge", max_tokens, card, "http://h/v1", prompt)
    assert bool(problems) == (max_tokens + max(prompt or 0, 1) > limit)
    for problem in problems:
        assert problem.key == "judge.max_tokens"
        assert f"max_model_len {limit}" in problem.what and str(max_tokens) in problem.what


def test_a_card_without_a_length_is_no_limit():
    assert length_problems("judge", 10**6, {"id": "m"}, "http://h/v1") == []
    assert length_problems("judge", 10**6, None, "http://h/v1") == []


def test_the_servers_limit_refuses_the_shipped_judge_budget_naming_key_and_limit():
    with serve_in_thread(max_model_len=1024) as server:
        config = judged_by(server.base_url)  # the shipped judge.max_tokens: 8192
        (problem,) = served_limit_problems([config])
        assert problem.key == "judge.max_tokens"
        assert "8192" in problem.what and "max_model_len 1024" in problem.what
        assert server.base_url in problem.what and "judge.max_tokens=" in problem.fix
        assert served_limit_problems([judged_by(server.base_url, "judge.max_tokens=1023")]) == []
        # no /tokenize here: the floor is unknown, and nothing is invented for it
        assert count_prompt_tokens(server.base_url, DEFAULT_MODEL, "hello") is None


def test_a_server_that_reports_no_length_or_does_not_answer_is_not_this_checks_problem():
    with serve_in_thread() as server:  # no max_model_len in its cards
        assert served_limit_problems([judged_by(server.base_url)]) == []
    assert served_limit_problems([judged_by("http://127.0.0.1:9/v1")], timeout_s=1) == []


def test_validate_refuses_it_and_a_run_stops_before_its_first_step(tmp_path):
    with serve_in_thread(max_model_len=1024) as server:
        args = ["judge=openai", f"judge.base_url={server.base_url}", f"judge.model={DEFAULT_MODEL}"]
        res = subprocess.run(
            [EXE, "validate", *args], capture_output=True, text=True, timeout=300, cwd=tmp_path
        )
        assert res.returncode == 2, res.stdout + res.stderr
        assert "judge.max_tokens" in res.stderr and "max_model_len 1024" in res.stderr
        res = subprocess.run(
            [EXE, "train", *args, f"tracking.root={tmp_path / 'out'}", "engine.rl.steps=1"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        assert res.returncode != 0
        assert "judge.max_tokens" in res.stderr and "max_model_len 1024" in res.stderr
        assert server.completions == []  # no request was sent: no step ran
        assert not list((tmp_path / "out").glob("runs/*/state.json"))
