"""Judge and simulator registries, config options, validation and metric names."""

import pytest

from slca_exp.config.services import JudgeConfig, SimulatorConfig
from slca_exp.core.names import METRICS
from slca_exp.judges import JUDGES, Judge, batch_stats, build_judge, describe_judge
from slca_exp.judges.base import JudgeResult
from slca_exp.preflight.compose import check_overrides, compose_run
from slca_exp.preflight.sections import is_remote
from slca_exp.preflight.validate import validate
from slca_exp.registry import UnknownNameError
from slca_exp.simulators import SIMULATORS, Simulator, build_simulator, describe_simulator
from slca_exp.simulators import batch_stats as sim_stats
from slca_exp.simulators.base import ToolResponse


def test_registered_backends_match_the_schema_choices():
    assert JUDGES.names() == ["openai", "rubric"]
    assert SIMULATORS.names() == ["replay", "sgls"]
    with pytest.raises(UnknownNameError, match="openai, rubric"):
        build_judge(JudgeConfig(backend="gpt"))


def test_each_backend_says_whether_it_asks_a_server():
    assert {n: JUDGES.get(n).remote for n in JUDGES} == {"openai": True, "rubric": False}
    assert {n: SIMULATORS.get(n).remote for n in SIMULATORS} == {"replay": False, "sgls": True}
    assert is_remote("judge", "openai") and is_remote("simulator", "sgls")
    assert not is_remote("judge", "rubric") and not is_remote("judge", "no-such-judge")


def test_an_unregistered_backend_is_refused_with_the_registered_ones():
    _, problems = check_overrides(["judge.backend=rubrik", "simulator.backend=sgl"])
    assert [p.key for p in problems] == ["judge.backend", "simulator.backend"]
    assert "Did you mean 'rubric'? Known judges: openai, rubric" in problems[0].what
    assert "Known simulators: replay, sgls" in problems[1].what
    assert all("SLCA_EXP_PLUGINS" in p.fix for p in problems)


def test_local_backends_build_and_satisfy_the_protocols():
    with build_judge(JudgeConfig()) as judge, build_simulator(SimulatorConfig()) as sim:
        assert isinstance(judge, Judge) and isinstance(sim, Simulator)


def test_paper_options_compose_validate_and_describe_without_network(tmp_path, monkeypatch):
    monkeypatch.setenv("SLCA_EXP_CACHE_DIR", str(tmp_path))
    run = validate(compose_run(["judge=openai", "simulator=sgls"]))
    judge, sim = describe_judge(run.judge), describe_simulator(run.simulator)
    assert (judge["model"], judge["temperature"], judge["max_tokens"]) == (
        "openai/gpt-oss-120b",
        0.0,
        8192,
    )
    assert judge["prompt_version"] == "hierr-judge-v1" and len(judge["prompt_sha256"]) == 64
    assert (sim["model"], sim["temperature"]) == ("Qwen/Qwen3-235B-A22B-Instruct-2507", 0.6)
    assert run.judge.max_retries == 3 and list(tmp_path.iterdir()) == []


def test_validation_names_the_prompt_and_url_keys():
    _, problems = check_overrides(
        ["judge=openai", "judge.prompt=missing_v9.txt", "simulator=sgls", "simulator.base_url=x:1"]
    )
    assert [p.key for p in problems] == ["judge.prompt", "simulator.base_url"]
    assert "hierr_judge_v1.txt" in problems[0].fix
    _, fine = check_overrides(
        ["judge=openai", "judge.prompt=hierr_judge_v1.txt", "judge.backoff=exponential"]
    )
    assert fine == []
    _, bad = check_overrides(["judge.backoff=fibonacci", "simulator.backoff_s=-1"])
    assert [p.key for p in bad] == ["judge.backoff", "simulator.backoff_s"]


def test_metric_names_are_the_tracking_ones():
    judge = batch_stats(
        [JudgeResult.rated(3), JudgeResult.failed("x"), JudgeResult.short_circuit("r")]
    )
    sim = sim_stats([ToolResponse("{}", "ok", cached=True), ToolResponse("{}", "failed")])
    assert set(judge) | set(sim) <= set(METRICS)
    assert judge == {
        "judge/requests": 2.0,
        "judge/failures": 1.0,
        "judge/cache_hit_frac": 0.0,
        "judge/latency_ms": 0.0,
    }
    assert sim == {
        "simulator/requests": 2.0,
        "simulator/failures": 1.0,
        "simulator/cache_hit_frac": 0.5,
    }
    assert batch_stats([]) == {
        "judge/requests": 0.0,
        "judge/failures": 0.0,
        "judge/cache_hit_frac": 0.0,
        "judge/latency_ms": 0.0,
    }
