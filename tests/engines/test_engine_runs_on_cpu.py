"""The local engine run as a user runs it: the CLI in a subprocess, a kill, a resume."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from mlflow.tracking import MlflowClient

from tests.planted import PLANTED, SECRET, SECRET_ENV, leaks, mlflow_texts
from tests.rollouts.checks import traces_of

EXE = str(Path(sys.executable).parent / "slca-exp")
TINY = [
    "data.rows=16",
    "engine.sft.steps=5",
    "engine.sft.batch_size=4",
    "engine.val_rows=2",
    "algorithm.group_size=2",
    "engine.rollout.prompts_per_step=2",
    "engine.rollout.max_turn_tokens=32",
    "engine.rollout.max_response_tokens=96",
    "engine.checkpoint_every=1",
    "engine.progress=false",
]


def train(tmp_path, *overrides, timeout=300, wait=True):
    args = [EXE, "train", *TINY, f"tracking.root={tmp_path / 'out'}", *overrides]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env[SECRET_ENV] = SECRET  # what PLANTED carries into a run
    if not wait:
        return subprocess.Popen(
            args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    return subprocess.run(
        args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
    )


def runs(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    found = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    return client, found


def test_a_few_steps_through_the_cli_leave_a_finished_recorded_run(tmp_path):
    res = train(tmp_path, "engine.rl.steps=2", "engine.rl.mask_rule=corrected", *PLANTED)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "validation (sft" in res.stderr and "validation (rl" in res.stderr
    # paths under the folder the command ran in are named from there, and open from there
    assert "open it with: slca-exp ui --tracking-uri sqlite:///out/mlflow.db\n" in res.stderr
    client, found = runs(tmp_path)
    (run,) = found
    assert run.info.status == "FINISHED"
    # it ends with one block saying where everything is, and train.log holds its slca-exp: lines
    block = res.stderr[res.stderr.index("slca-exp: ---- where to look ----") :].splitlines()
    checkpoint = next(line for line in block if line.startswith("slca-exp: checkpoint: "))
    assert checkpoint.startswith("slca-exp: checkpoint: out/runs/")
    assert (tmp_path / checkpoint.split(": ", 2)[2]).is_file()
    run_line = f"slca-exp: run FINISHED: MLflow run {run.info.run_id} (experiment slca-exp) in "
    assert block[1] == f"{run_line}sqlite:///out/mlflow.db"
    compare = "slca-exp: compare: slca-exp compare slca-exp --tracking-uri sqlite:///out/mlflow.db"
    assert compare in block, block
    shown = next(x for x in block if "output folder: " in x).split("output folder: ")[1]
    assert shown.startswith("outputs/")  # Hydra's run folder, under the launch folder
    folder = tmp_path / shown
    logged = (folder / "train.log").read_text()
    ours = [line for line in res.stderr.splitlines() if line.startswith("slca-exp: ")]
    assert ours and all(f"] - {line}" in logged for line in ours), logged
    assert "requests failed" not in res.stderr  # nothing failed: no failure counts
    assert {"slca.backbone", "slca.reward", "slca.judge", "slca.data"} <= set(run.data.tags)
    for name in (
        "reward/tool/mean",
        "adv/tool/mean",
        "adv/summary/abs_mean",
        "segment/summary/present_frac",
        "segment/cutoff_frac",
        "val/segment/cutoff_frac",
        "train/loss",
        "perf/time/generate",
        "val/reward/tool/mean",
        "val/success_at_0.9",
    ):
        assert name in run.data.metrics, name
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
    assert sorted(steps) == [1, 2]
    recipe = json.loads(
        Path(client.download_artifacts(run.info.run_id, "recipe.json", str(tmp_path))).read_text()
    )
    assert recipe["data"]["files"]["train"]["rows"] == 16
    assert recipe["engine"]["rl"]["mask_rule"] == "corrected"
    # The trained policy is the run's logged model: its HF folder, copied into MLflow.
    (model,) = client.search_logged_models([run.info.experiment_id])
    assert model.source_run_id == run.info.run_id and model.name == "policy"
    assert model.tags["slca.fingerprint"] == run.data.tags["slca.fingerprint"]
    files = {f.path for f in client.list_logged_model_artifacts(model.model_id)}
    assert {"config.json", "model.safetensors"} <= files, files
    outputs = client.get_run(run.info.run_id).outputs.model_outputs
    assert [(o.model_id, o.step) for o in outputs] == [(model.model_id, 2)]
    # Its rollouts (the defaults: RL step 1 and each validation) are traces of the run, with
    # a table and a credit view per logged step; the secret grep below reads the traces too.
    traces = traces_of(client, run.info.run_id)
    logged = sorted({(t.info.tags["slca.split"], t.info.tags["slca.step"]) for t in traces})
    assert logged == [("train", "1"), ("val", "0"), ("val", "2")], logged
    assert {t.info.tags["slca.engine"] for t in traces} == {"local"}
    files = {a.path for a in client.list_artifacts(run.info.run_id, "rollouts/train")}
    assert {f"rollouts/train/step_000001.{kind}" for kind in ("json", "jsonl", "html")} == files
    # The planted secret: recorded as <redacted>, and in no store, checkpoint or log.
    assert run.data.params["judge.name"] == "<redacted>"
    texts = mlflow_texts(client, run.info.run_id, tmp_path / "artifacts")
    assert leaks(SECRET, [tmp_path], [*texts, res.stdout, res.stderr]) == []


def test_sigterm_checkpoints_marks_killed_and_the_same_command_resumes(tmp_path):
    steps = 24
    proc = train(tmp_path, f"engine.rl.steps={steps}", "tracking.log_model=false", wait=False)
    state = None
    deadline = time.time() + 240
    while time.time() < deadline:
        found = list((tmp_path / "out" / "runs").glob("*/state.json"))
        if found:
            state = json.loads(found[0].read_text())
            if state["step"] >= 2:
                break
        time.sleep(0.5)
    assert state is not None and state["step"] >= 2, proc.communicate(timeout=60)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "checkpointed at RL step" in err
    client, (killed,) = runs(tmp_path)
    assert killed.info.status == "KILLED"
    done = json.loads(found[0].read_text())["step"]
    assert done >= 2

    res = train(tmp_path, f"engine.rl.steps={steps}", "tracking.log_model=false")  # the same one
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming MLflow run" in res.stdout + res.stderr
    client, (run,) = runs(tmp_path)  # still one run
    assert run.info.run_id == killed.info.run_id and run.info.status == "FINISHED"
    logged = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
    assert sorted(logged) == list(range(1, steps + 1))  # every step once, across the kill
    # Only the finished run has a model: a reference to the policy's folder, no copy.
    (model,) = client.search_logged_models([run.info.experiment_id])
    assert model.source_run_id == run.info.run_id
    assert model.tags["mlflow.model.isExternal"] == "true"
    assert (Path(model.tags["slca.path"].removeprefix("file://")) / "config.json").is_file()
    assert client.list_logged_model_artifacts(model.model_id) == []


def test_rollout_masks_match_their_tokens(tool_caller):
    from slca_exp.backbones.hf import load_folder
    from slca_exp.engines.local.rollout import RolloutSettings
    from tests.engines.tool_caller import roller_for

    # a short SFT (shared with the sampling tests) so the policy writes tool calls and gets tool
    # responses back
    bb = load_folder(tool_caller.folder, name="tool-caller", dtype="float32")
    sft = tool_caller.rows
    roller = roller_for(bb)
    torch.manual_seed(0)
    rolls = roller.run(sft[:8], 2, RolloutSettings(2, 64, 256))
    torch.manual_seed(0)
    again = roller.run(sft[:8], 2, RolloutSettings(2, 64, 256))
    assert again.response_ids == rolls.response_ids  # determinism by seed

    # the appendix diagnostic: cos(grad_tool, grad_summary) from two masked backward passes
    from slca_exp.config.schema import RLConfig
    from slca_exp.engines.local.update import rl_update
    from slca_exp.estimators import EstimatorParams, RolloutScores, get_estimator

    packed = rolls.batch(roller.pad_id)
    n = len(rolls)
    scores = RolloutScores(tool=torch.rand(n), summary=torch.rand(n), total=torch.rand(n))
    adv = get_estimator("slca_grpo")(packed.response_mask, rolls.group, scores, EstimatorParams())
    optimizer = torch.optim.AdamW(bb.model.parameters(), lr=1e-6)
    stats = rl_update(bb.model, None, optimizer, packed, adv, RLConfig(grad_cos=True), 1.0)
    assert -1.0 <= stats["train/grad_cos"] <= 1.0
    tok = bb.tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    with_tools = 0
    for ids, mask, cut in zip(
        rolls.response_ids, rolls.response_mask, rolls.truncated, strict=True
    ):
        assert len(ids) == len(mask) and mask[0] == 1
        runs_ = []  # (mask value, tokens) of each contiguous run
        for t, m in zip(ids, mask, strict=True):
            if runs_ and runs_[-1][0] == m:
                runs_[-1][1].append(t)
            else:
                runs_.append((m, [t]))
        for k, (m, tokens) in enumerate(runs_):
            if m == 0:  # injected: exactly the template's tool turn, responses inside
                text = tok.decode(tokens)
                assert text.startswith("\n<|im_start|>user\n<tool_response>\n"), text
                assert text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
                with_tools += 1
            elif k < len(runs_) - 1 or not cut:  # generated: a whole assistant turn
                assert tokens[-1] == eos
    assert with_tools > 0


def test_a_judge_with_no_server_behind_it_is_an_outage_that_stop_ends_failed(tmp_path):
    """A judge URL nothing listens on (``judge=openai judge.base_url=http://127.0.0.1:9/v1``) with
    ``reward.judge_failure=stop``: the first RL step warns that every request failed, the run
    ends FAILED at that step, and the closing block counts the failed requests.
    """
    res = train(
        tmp_path,
        "judge=openai",
        "judge.base_url=http://127.0.0.1:9/v1",
        "judge.max_retries=0",
        "reward.judge_failure=stop",
        "engine.sft.enabled=false",
        "engine.rl.steps=3",
        "tracking.plots=false",
    )
    assert res.returncode == 1, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    warned = re.search(
        r"WARNING: every judge request of RL step 1 failed \((\d+) of \1\)", res.stderr
    )
    assert warned, res.stderr[-3000:]
    asked = int(warned.group(1))
    block = res.stderr[res.stderr.index("slca-exp: ---- where to look ----") :]
    assert "slca-exp: run FAILED: MLflow run " in block
    failed = (
        f"slca-exp: judge: {asked} of {asked} requests failed; every request failed in RL step 1"
    )
    assert failed in block
    assert res.stderr.splitlines()[-1].startswith(
        "slca-exp: every judge request of RL step 1 failed, so the run stops"
    )
    client, (run,) = runs(tmp_path)
    assert run.info.status == "FAILED"
    assert run.data.tags["slca.outage.judge"] == "1"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "judge/failures")]
    assert steps == [1]  # it stopped at the first outage
