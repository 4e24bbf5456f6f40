"""``slca-exp rejudge`` on a real 2x2 sweep of the local engine: another judge's ratings.

``algorithm=grpo,slca_grpo`` x ``seed=0,1`` from the tiny tool-calling checkpoint, every step's
rollouts logged; then the sweep is rejudged by an LLM judge behind the loopback OpenAI-compatible
server, whose rating depends on the request (so the judges disagree now and then), twice.
"""

import subprocess

import pytest

from tests.engines.tool_caller import quick_sweep
from tests.tracking.sweeps import SLCA_EXE as EXE


@pytest.fixture(scope="module")
def sweep(tool_caller, tmp_path_factory):
    done = quick_sweep(
        tmp_path_factory.mktemp("rejudge"),
        tool_caller.folder,
        "algorithm=grpo,slca_grpo",
        "engine.rl.steps=2",
        "seed=0,1",
        "tracking.rollouts.every=1",
    )
    return done.folder, done.env, done.uri, done.parent, done.children


@pytest.mark.slow
def test_rejudge_logs_another_judges_ratings_on_every_trace_and_a_repeat_asks_nothing(sweep):
    from slca_exp.services.loopback import serve_in_thread

    tmp_path, env, uri, parent, children = sweep

    def rating(request):  # a second judge that disagrees now and then, the same way each time
        return f"<rating>{1 + len(request.text) % 5}</rating>"

    with serve_in_thread(content_fn=rating) as server:
        args = [
            EXE,
            "rejudge",
            parent.data.tags["slca.sweep"],
            "judge=openai",
            f"judge.base_url={server.base_url}",
            "judge.model=loopback",
            f"judge.cache_path={tmp_path / 'judge-cache.sqlite'}",
            "--tracking-uri",
            uri,
        ]
        first = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
        asked = len(server.completions)
        again = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert len(server.completions) == asked > 0  # the repeat is answered by the cache
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    out = first.stdout
    fresh = int(out.split("judge: ", 1)[1].split(" rollouts rated anew")[0])
    assert fresh >= asked  # identical requests are asked once
    assert "judge: 0 rollouts rated anew," in again.stdout
    assert out.count("Spearman rho") == len(children) + 1  # each run, and all of them
    assert "exact agreement" in out and "weighted kappa" in out
    sign = out.split("sign check:", 1)[1]
    (line,) = [x for x in sign.splitlines() if x.strip().startswith("all runs:")]
    assert "run's judge" in line and "new judge" in line and "(n=2)" in line, line
    assert ("sign kept" in line) or ("sign changed" in line), line
    # every trace of a judged rollout carries the new rating, once, from the new judge
    import mlflow

    mlflow.set_tracking_uri(uri)
    try:
        source = "openai:loopback@hierr-judge-v1"
        logged = 0
        for run in children:
            traces = mlflow.search_traces(
                run_id=run.info.run_id, locations=[run.info.experiment_id], return_type="list"
            )
            assert traces
            for trace in traces:
                status = {a.name: a for a in trace.info.assessments}["judge_status"].value
                mine = [a for a in trace.info.assessments if a.source.source_id == source]
                if status == "short_circuit":
                    continue  # the new judge short-circuits it too: no rating
                assert len(mine) == 1 and mine[0].name == "judge_rating", trace.info.assessments
                assert (
                    mine[0].value in (1, 2, 3, 4, 5) and mine[0].source.source_type == "LLM_JUDGE"
                )
                logged += 1
        assert f"feedback logged on {logged} traces" in out and "logged on 0 traces" in again.stdout
    finally:
        mlflow.set_tracking_uri(None)
