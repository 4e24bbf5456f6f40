"""``slca-exp rollouts`` on a real MLflow sqlite store whose run logged rollouts as a training
run logs them (``rollouts/<split>/step_<N>.jsonl``): through ``slca_exp.commands.main`` in this
process, and once as the installed console script."""

import html
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from mlflow.tracking import MlflowClient

from slca_exp.commands import main
from slca_exp.core.shown import compact
from slca_exp.rollouts.files import RECORDS, file_name, folder, write_records
from slca_exp.tracking.rollout_text import Palette
from tests.rollouts.samples import step_records

EXE = str(Path(sys.executable).parent / "slca-exp")
ANSI = re.compile(r"\x1b\[")
HEADER = re.compile(r"^━━ step (\d+) · (\w+) · group (\S+) · sample (\d+) · (\w+) ━━$", re.M)


def log_step(client, run_id, records, split, step, tmp):
    path = write_records(records, tmp / split / file_name(step, RECORDS))
    client.log_artifact(run_id, str(path), folder(split))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store: run ``rl-run`` (train steps 1 and 10, val step 10), two runs named ``twin`` in
    two experiments, run ``Bob's run`` (a quote in its name) that logged no rollouts, and run
    ``val-only`` that logged only a validation (step 0)."""
    root = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(uri)
    art = (root / "mlartifacts").as_uri()
    first = client.create_experiment("slca-exp", artifact_location=art)
    other = client.create_experiment("other", artifact_location=art)
    run = client.create_run(first, run_name="rl-run").info.run_id
    written = root / "written"
    records = {(s, "train"): step_records(s, "train") for s in (1, 10)}
    records[10, "val"] = step_records(10, "val")
    for (step, split), recs in records.items():
        log_step(client, run, recs, split, step, written / str(step))
    # what a training run logs beside the records: ignored
    (written / "table.json").write_text("{}")
    client.log_artifact(run, str(written / "table.json"), "rollouts/train")
    twins = [client.create_run(e, run_name="twin").info.run_id for e in (first, other)]
    quiet = client.create_run(first, run_name="Bob's run").info.run_id
    val_only = client.create_run(first, run_name="val-only").info.run_id
    log_step(client, val_only, step_records(0, "val"), "val", 0, written / "val-only")
    return SimpleNamespace(
        root=root, uri=uri, run=run, twins=twins, quiet=quiet, val_only=val_only, records=records
    )


def rollouts(store, *args):
    return main(["rollouts", *args, "--tracking-uri", store.uri])


def headers(out):
    return HEADER.findall(out)


def test_the_default_is_the_last_logged_train_step(store, capsys):
    assert rollouts(store, store.run) == 0
    out = capsys.readouterr().out
    found = headers(out)
    assert len(found) == 4 and {(h[0], h[1]) for h in found} == {("10", "train")}
    assert [(h[2], h[3], h[4]) for h in found] == [
        (r.group, str(r.sample), r.rank) for r in store.records[10, "train"]
    ]
    assert "train step 10, 4 rollouts" in out.splitlines()[0]
    assert f"run rl-run ({store.run})" in out.splitlines()[0]


def test_segments_advantages_rewards_and_calls_are_shown(store, capsys):
    assert rollouts(store, store.run, "--step", "10") == 0
    out = capsys.readouterr().out
    best = store.records[10, "train"][0]
    tool_turn, env_turn, summary_turn = best.turns
    assert f"── tool segment ({tool_turn.tokens} tokens, A=+0.800) ──" in out
    assert "── tool response (env, not trained) ──" in out
    assert f"── summary segment ({summary_turn.tokens} tokens, A=-0.500) ──" in out
    assert "── summary segment" in out and "A=-0.900" in out and "A=-1.100" in out  # the worst
    tokens = (
        f"tokens: tool {best.segment_tokens('tool')}, summary {best.segment_tokens('summary')}, "
        f"env {best.segment_tokens('env')} (not trained)"
    )
    assert f"A: tool +0.800, summary -0.500 | {tokens}" in out
    parts = "format 1.000 name 1.000 key 1.000 value 0.500 parallel 1.000"
    assert f"reward  tool 0.900 ({parts})" in out
    assert "summary 0.750 (rating 4/5, judge ok)" in out
    assert "total 1.600 (routed: tool 0.900, summary 0.750)" in out
    # the worst of group train-9: the judge failed, its total is not a number
    assert "summary — (rating —, judge failed: HTTP 500 after 1 attempt)" in out
    assert "total — (routed" in out
    assert '↳ call get_weather({"city": "Paris"})' in out
    assert 'answer (ok, recorded, not cached): {"temp": 21}' in out
    assert "It is 21 degrees in Paris." in out and "prompt  Weather in Paris?" in out
    assert env_turn.text.split("\n")[0] in out


def test_step_1_and_validation(store, capsys):
    assert rollouts(store, store.run, "--step", "1") == 0
    out = capsys.readouterr().out
    assert {h[0] for h in headers(out)} == {"1"} and len(headers(out)) == 4

    assert rollouts(store, store.run, "--val") == 0
    out = capsys.readouterr().out
    found = headers(out)
    assert [(h[0], h[1], h[2], h[4]) for h in found] == [
        ("10", "val", f"val-{k}", "unranked") for k in range(3)
    ]
    assert out.count("A: — (validation") == 3 and "A=— (validation)" in out
    assert "+0.800" not in out and "-0.500" not in out


@pytest.mark.parametrize("rank", ["best", "worst"])
def test_best_or_worst_shows_only_those(store, capsys, rank):
    assert rollouts(store, store.run, f"--{rank}") == 0
    out = capsys.readouterr().out
    found = headers(out)
    assert len(found) == 2 and {h[4] for h in found} == {rank}
    assert f"2 rollouts ranked {rank}" in out


def test_best_and_worst_together_are_refused(store, capsys):
    assert rollouts(store, store.run, "--best", "--worst") == 2
    err = capsys.readouterr().err
    assert "--best" in err and "--worst" in err and "pick one" in err


def test_a_run_is_found_by_name(store, capsys):
    assert rollouts(store, "rl-run", "--worst") == 0
    out = capsys.readouterr().out
    assert f"run rl-run ({store.run})" in out and len(headers(out)) == 2


def test_an_ambiguous_name_is_refused_listing_the_runs(store, capsys):
    assert rollouts(store, "twin") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert "matches 2 runs" in err and "pass one of these run ids" in err
    for run_id in store.twins:
        assert run_id in err
    assert "experiment slca-exp, started 20" in err and "experiment other, started 20" in err


def test_an_unknown_run_is_refused(store, capsys):
    assert rollouts(store, "no-such-run") == 2
    err = capsys.readouterr().err
    assert "'no-such-run'" in err and "--tracking-uri" in err and store.run in err  # latest runs
    assert rollouts(store, "0" * 32) == 2  # looks like an id
    assert "'" + "0" * 32 + "'" in capsys.readouterr().err


def test_a_step_not_logged_is_refused_listing_the_steps(store, capsys):
    assert rollouts(store, store.run, "--step", "5") == 2
    err = capsys.readouterr().err
    assert "--step 5" in err and "logged train steps: 1, 10." in err
    assert rollouts(store, store.run, "--val", "--step", "1") == 2
    assert "logged val steps: 10." in capsys.readouterr().err


def test_a_run_without_rollouts_names_the_setting(store, capsys):
    assert rollouts(store, "Bob's run") == 2  # found by its name, quote and all
    err = capsys.readouterr().err
    assert f"run Bob's run ({store.quiet}) logged no rollouts" in err
    assert "tracking.rollouts.every=0 turns them off" in err
    assert rollouts(store, store.quiet, "--val") == 2
    assert "tracking.rollouts.every" in capsys.readouterr().err


def test_a_run_with_only_validation_rollouts_points_to_val(store, capsys):
    assert rollouts(store, "val-only") == 2
    err = capsys.readouterr().err
    assert "logged no train rollouts" in err and "val rollouts at steps 0: add --val" in err
    assert rollouts(store, "val-only", "--val") == 0
    assert [h[:2] for h in headers(capsys.readouterr().out)] == [("0", "val")] * 3


def test_no_rollout_ranked_so_is_refused(store, capsys):
    assert rollouts(store, store.run, "--val", "--best") == 2
    err = capsys.readouterr().err
    assert "--best" in err and "validation rollouts are not ranked" in err


def test_html_writes_the_credit_view_of_the_selected_rollouts(store, capsys, tmp_path):
    out = tmp_path / "view.html"
    assert rollouts(store, store.run, "--best", "--html", str(out)) == 0
    assert f"credit view: {out}" in capsys.readouterr().out
    text = html.unescape(out.read_text(encoding="utf-8")).replace("\xa0", " ")
    selected = [r for r in store.records[10, "train"] if r.rank == "best"]
    for record in selected:
        for token in record.token_text:
            assert token.strip() in text, token
    assert "no idea" not in text  # the worst rollouts' summaries are not selected


def test_html_into_a_missing_folder_is_refused(store, capsys, tmp_path):
    out = tmp_path / "missing" / "view.html"
    assert rollouts(store, store.run, "--html", str(out)) == 2
    captured = capsys.readouterr()
    assert "--html" in captured.err and "does not exist" in captured.err and captured.out == ""
    assert not out.parent.exists()
    assert rollouts(store, store.run, "--html", str(tmp_path)) == 2  # a folder
    assert "--html" in capsys.readouterr().err


def test_bad_flags_and_values_exit_2_naming_the_flag(store, capsys):
    assert rollouts(store, store.run, "--step", "ten") == 2
    err = capsys.readouterr().err
    assert "--step" in err and "'ten' is not a step number" in err
    assert rollouts(store, store.run, "--frobnicate") == 2
    assert "--frobnicate" in capsys.readouterr().err
    assert main(["rollouts"]) == 2
    assert "RUN" in capsys.readouterr().err


def test_a_missing_store_is_refused(tmp_path, capsys):
    assert main(["rollouts", "x", "--tracking-uri", f"sqlite:///{tmp_path}/none.db"]) == 2
    assert "no MLflow store at" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()


def test_help_lists_every_flag(capsys):
    assert main(["rollouts", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: slca-exp rollouts")
    for flag in ("RUN", "--step", "--val", "--best", "--worst", "--html", "--tracking-uri"):
        assert flag in out, flag


def test_no_colour_unless_a_terminal_without_no_color(store, capsys, monkeypatch):
    assert rollouts(store, store.run) == 0
    assert not ANSI.search(capsys.readouterr().out)  # captured: not a terminal
    terminal = SimpleNamespace(isatty=lambda: True)
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert Palette.for_stream(terminal).on
    assert ANSI.search(Palette.for_stream(terminal).signed(0.8, "+0.800"))
    monkeypatch.setenv("NO_COLOR", "1")
    assert not Palette.for_stream(terminal).on
    assert Palette.for_stream(terminal).signed(0.8, "+0.800") == "+0.800"


def test_long_step_lists_are_shortened():
    assert compact([1, 10], "steps") == "1, 10"
    assert compact([1, *range(10, 210, 10)], "steps") == "1, 10, 20, ..., 200 (21 steps)"
    irregular = [k * k for k in range(40)]
    shown = compact(irregular, "steps")
    assert "..." in shown and shown.endswith("(40 steps)") and len(shown) < 120


def test_the_console_script_on_the_default_store(store, tmp_path):
    """The installed ``slca-exp`` on ``$SLCA_EXP_ROOT/mlflow.db``, piped: plain text."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "NO_COLOR")}
    res = subprocess.run(
        [EXE, "rollouts", "rl-run", "--step", "1", "--worst"],
        cwd=tmp_path,
        env={**env, "SLCA_EXP_ROOT": str(store.root)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr
    found = headers(res.stdout)
    assert [(h[0], h[4]) for h in found] == [("1", "worst"), ("1", "worst")]
    assert "── tool segment (" in res.stdout and "A=-1.100" in res.stdout
    assert not ANSI.search(res.stdout)
    res = subprocess.run(
        [EXE, "rollouts", "twin"],
        cwd=tmp_path,
        env={**env, "SLCA_EXP_ROOT": str(store.root)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 2 and "matches 2 runs" in res.stderr
    assert "Traceback" not in res.stderr
