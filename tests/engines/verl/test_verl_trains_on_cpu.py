"""verl trains: one small ``slca-exp train engine=verl engine.verl.backend=cpu`` run, shared here.

The run is what a user starts from the command line, sized like ``experiment=verl_smoke``: the
``tool_caller`` checkpoint (a tiny policy that already writes tool calls) as the backbone,
:data:`SFT_STEPS` steps of verl's own SFT trainer on the split's gold trajectories, then 4
prompts x 8 rollouts per step, :data:`STEPS` steps of SLCA-GRPO through verl's own PPO trainer
from the SFT's weights, one intra-op thread per verl process. Both frozen services are one
OpenAI-compatible loopback server on 127.0.0.1 (:class:`Services`), started by the fixture:

- the judge (``judge=openai``) rates a final reply by its length alone (shorter is better,
  :func:`rating_of`), so that the rollouts of a group differ and their summary advantages are
  not zero; a few requests fail, chosen by their content (:func:`fate_of`): HTTP 500 or a hang
  past the judge's timeout (``reward.judge_failure=absent``);
- the simulator (``simulator=sgls``) answers every other tool call with HTTP 500 (the others
  with a fixed JSON result), the way a simulator service fails.

What verl writes is read back: the MLflow run and the SFT's child run, ``rollout_weights.jsonl``
(the rollout server's weight updates), each step's batch as the actor received it
(``engine.verl.dump_batches``), verl's checkpoints (the SFT's, and the actor's every
:data:`SAVE_EVERY` steps, HF weights) and verl's own rollout dump (``trainer.rollout_data_dir``,
decoded without special tokens).

A second, shorter run is the control of the learning checks (:func:`flipped_run`): the same
recipe from the SFT's weights (no SFT stage of its own), :data:`FLIPPED_STEPS` steps, with every
advantage's sign flipped inside verl's estimator; its updates must move the log-probabilities
the other way. Its actor also measures the gradient conflict at every update
(``engine.rl.grad_cos``). The two runs
and the checks that reread their checkpoints take about 7 minutes on an idle 2-core host
(4:20 and 1:50 for the runs, verl's start-ups included; the fixtures print them), plus the
``tool_caller`` checkpoint the engine tests share.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.skip_policy import require

require("verl", reason="needs the verl extra")
pytestmark = [pytest.mark.verl, pytest.mark.slow]

import torch  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from slca_exp.engines.verl.rewards import (  # noqa: E402
    NO_SUMMARY_KEY,
    SUMMARY_FAILED_KEY,
    SUMMARY_KEY,
    TOOL_KEY,
    TOTAL_KEY,
)
from slca_exp.estimators import EstimatorParams, RolloutScores, get_estimator  # noqa: E402
from slca_exp.estimators.segments import split_segments  # noqa: E402
from slca_exp.judges.base import LABELS  # noqa: E402
from slca_exp.services.loopback import Behaviour, RecordedRequest, serve_in_thread  # noqa: E402
from slca_exp.tracking.redact import REDACTED  # noqa: E402
from slca_exp.tracking.rollout_traces import CONDITIONAL  # noqa: E402
from tests.planted import PLANTED, SECRET, SECRET_ENV, leaks, mlflow_texts  # noqa: E402
from tests.rollouts.checks import check_run_rollouts, signature  # noqa: E402

STEPS = 12
"""RL steps of the run."""
PROMPTS, GROUP = 4, 8
ROLLOUTS = PROMPTS * GROUP
"""Rollouts per step; every one of them is judged once (the strict reward asks the judge for each,
and the judge's short-circuits are off), so the judge's requests come in steps of this many."""
JUDGE_MODEL, SIM_MODEL = "loopback-judge", "loopback-simulator"
REPLY_BANDS = (15, 40, 80, 160)
"""Final replies longer than each of these many characters lose one rating point (5 down to 1)."""
FAULT_MODULUS = 32
FAULTS = {0: "500", 1: "hang"}
"""A judge request fails as ``FAULTS[h % FAULT_MODULUS]``, ``h`` a hash of its messages: the same
request always meets the same fate, whenever it arrives and whatever came before it. One request
in 32 is answered HTTP 500 and one in 32 is left hanging past the judge's timeout: over the run's
384 requests both kinds happen unless fewer than about 200 of them are distinct, (31/32)^200 =
0.2% each."""
JUDGE_TIMEOUT_S, HANG_S = 3.0, 30.0
SIM_ANSWER = json.dumps({"status": "success", "result": {"value": 42, "state": "ok"}})
PROBS_TOLERANCE = 1e-4
"""Largest |p_server - p_trainer| of a sampled token allowed (``training/rollout_probs_diff_max``).

Both sides compute in float32 from the same weights; what is left is the order of float
operations (a cached token-by-token forward on the server, a batched one in the trainer): 1e-6 to
4e-6 measured. One update moves some tokens' probability ratio past PPO's clip (0.2) already."""
SAVE_EVERY = 1
"""verl checkpoints the actor (HF weights) after every this many steps' updates."""
RL_LR = 5e-4
"""The RL stage's learning rate (both runs)."""
SFT_STEPS, SFT_BATCH, SFT_LR = 40, 8, 3e-3
"""verl's SFT stage of the shared run: 40 steps of 8 gold trajectories of the split the
``tool_caller`` learnt from (80 steps of the local engine's SFT). Fewer (12 steps of 4 at 1e-3)
left a policy whose calls mostly did not parse: too few tool segments to route advantages to."""
SFT_LOSS = "train/loss"
"""verl's SFT trainer's loss metric (per step, in the SFT stage's child run)."""
SFT_LOSS_RATIO = 0.5
"""The mean loss of the SFT's last three steps is below this fraction of its first three's.
Measured in four runs: 0.507 -> 0.018 (a ratio of 0.036) each time (the SFT's data order and
initial weights are fixed); with 12 steps of 4 at 1e-3, 0.451 -> 0.193 (0.43)."""
TEMPERATURE = 1.0
"""Rollout temperature: varied calls within a group, so that tool scores and advantages differ."""
BOOTSTRAP, CONFIDENCE = 2000, 0.975
"""How a segment's move is told from noise (:func:`moves`): the contrast must stay above 0 in
97.5% of 2000 resamples of the rollouts (one-sided, the rollout the unit of resampling)."""
"""verl's SFT stage of the shared run: 12 steps of 4 gold trajectories, the ``tool_caller``'s
own rows (it had 80 steps of the local engine's SFT on them)."""
FLIPPED_STEPS = 4
"""RL steps of the control run; it checkpoints after each."""
FLIP = ("algorithm.slca.tool_weight=-1.0", "algorithm.slca.summary_weight=-1.0")
"""verl overrides of the control run: each advantage's sign flipped in verl's own estimator."""

_REPLY = re.compile(r"<final_answer>\n(.*)\n</final_answer>", re.S)


def rating_of(reply: str) -> int:
    """The loopback judge's rating of a final reply: 5 for at most 15 characters, down to 1."""
    return 5 - sum(len(reply) > band for band in REPLY_BANDS)


def fate_of(text: str) -> str:
    """What the loopback judge does with a request: ``ok``, ``500`` or ``hang``, by its text."""
    h = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    return FAULTS.get(h % FAULT_MODULUS, "ok")


@dataclass
class Services:
    """The loopback judge and simulator: answers, and every request's fate in arrival order.

    Attributes:
        faults: whether the judge fails some requests (:func:`fate_of`); the simulator fails
            every other call either way.
        verl_overrides: verl overrides the run adds (the control's flipped signs).

    """

    faults: bool = True
    verl_overrides: tuple[str, ...] = ()
    judged: list[tuple[int, str]] = field(default_factory=list)  # (rating, fate) per request
    simulated: list[str] = field(default_factory=list)  # fate per request
    lock: threading.Lock = field(default_factory=threading.Lock)

    def route(self, request: RecordedRequest) -> Behaviour:
        body = request.json() or {}
        with self.lock:
            if body.get("model") == JUDGE_MODEL:
                return self._judge(request)
            fate = "500" if len(self.simulated) % 2 == 0 else "ok"
            self.simulated.append(fate)
            return Behaviour(status=500) if fate == "500" else Behaviour(content=SIM_ANSWER)

    def _judge(self, request: RecordedRequest) -> Behaviour:
        found = _REPLY.search(request.text)
        rating = rating_of(found.group(1) if found else "")
        fate = fate_of(request.text) if self.faults else "ok"
        self.judged.append((rating, fate))
        answer = (
            f"<response_quality><reasoning>Judged by its length.</reasoning>"
            f"<rating>{LABELS[rating - 1]}</rating></response_quality>"
        )
        if fate == "500":
            return Behaviour(status=500)
        return Behaviour(content=answer, hang_s=HANG_S if fate == "hang" else 0.0)

    def judge_steps(self) -> list[list[tuple[int, str]]]:
        """The judge's requests cut into the run's steps (the trainer is synchronous)."""
        return [self.judged[i : i + ROLLOUTS] for i in range(0, len(self.judged), ROLLOUTS)]


@dataclass
class VerlRun:
    """What the run left behind, read once."""

    result: subprocess.CompletedProcess
    wall_s: float
    args: list[str]
    services: Services
    root: Path
    verl_dir: Path
    rollout_dir: Path
    client: MlflowClient
    run_id: str

    def metric(self, key: str) -> dict[int, float]:
        """verl's step -> value of an MLflow metric of the run."""
        return {m.step: m.value for m in self.client.get_metric_history(self.run_id, key)}

    def batch(self, step: int) -> dict:
        """The batch verl's actor received at ``step`` (``engine.verl.dump_batches``)."""
        return torch.load(self.verl_dir / "batches" / f"step_{step}.pt", weights_only=False)

    def rollouts(self, step: int) -> list[dict]:
        """verl's own dump of the step's rollouts (prompt and response text, no special tokens)."""
        lines = (self.rollout_dir / f"{step}.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]


def _cli_env() -> dict[str, str]:
    """This environment minus what would send the run to someone else's Ray cluster or run."""
    drop = ("RAY_ADDRESS", "MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI", "SLCA_EXP_ROOT")
    return {k: v for k, v in os.environ.items() if k not in drop}


def train(work: Path, services: Services, args: list[str]) -> VerlRun:
    """``slca-exp train ARGS`` as a user runs it, against ``services``; what it left behind."""
    root, rollout_dir = work / "out", work / "rollouts"
    exe = shutil.which("slca-exp") or str(Path(sys.executable).parent / "slca-exp")
    with serve_in_thread(route=services.route) as server:
        url = server.base_url
        args = [
            *args,
            f"engine.verl.overrides=['trainer.rollout_data_dir={rollout_dir}',"
            "'trainer.val_before_train=false',"
            "'actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]',"
            # one intra-op thread per verl process: on a shared 2-core host, processes that
            # each take every core stall one another (the actor update measured 10x slower)
            "'ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS=1',"
            "'ray_kwargs.ray_init.runtime_env.env_vars.MKL_NUM_THREADS=1'"
            + "".join(f",'{o}'" for o in services.verl_overrides)
            + "]",
            f"judge.base_url={url}",
            f"simulator.base_url={url}",
            f"tracking.root={root}",
        ]
        start = time.monotonic()
        process = subprocess.Popen(
            [exe, "train", *args],
            cwd=work,
            env={**_cli_env(), SECRET_ENV: SECRET},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its Ray processes can be ended with it, by its group id
        )
        try:
            out, err = process.communicate(timeout=1200)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
        wall = time.monotonic() - start
    result = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    assert result.returncode == 0, result.stderr[-4000:]
    (verl_dir,) = (root / "runs").glob("*/verl")
    run_id = json.loads((verl_dir / "run_ids.json").read_text())["mlflow"]
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    return VerlRun(result, wall, args, services, root, verl_dir, rollout_dir, client, run_id)


def recipe_args(tool_caller, steps: int, save_every: int) -> list[str]:
    """What both runs share: the ``tool_caller`` backbone, the loopback judge and simulator."""
    return [
        "experiment=verl_smoke",
        # the transformers rollout: test_vllm_rollout_on_cpu runs verl's vLLM rollout; these
        # 12 + 4 steps of learning checks are on the tool_caller checkpoint, whose 16-wide
        # attention heads vLLM's CPU build has no kernel for
        "engine.verl.cpu_rollout=hf",
        "backbone.source=local",
        "backbone.name=tool-caller",
        f"backbone.path={tool_caller.folder}",
        "data.rows=16",
        "data.seed=0",
        f"engine.verl.train_batch_size={PROMPTS}",
        f"algorithm.group_size={GROUP}",
        "engine.verl.ppo_mini_batch_size=2",  # two updates per step, two prompts' groups each
        f"engine.verl.temperature={TEMPERATURE}",
        f"engine.verl.total_training_steps={steps}",
        f"engine.verl.save_freq={save_every}",  # weights after some updates, in HF format
        "engine.verl.total_epochs=3",
        f"engine.verl.lr={RL_LR}",
        "engine.verl.use_kl_loss=false",
        "engine.verl.dump_batches=true",
        "reward.judge_failure=absent",
        "judge=openai",
        f"judge.model={JUDGE_MODEL}",
        f"judge.timeout_s={JUDGE_TIMEOUT_S}",
        "judge.max_retries=0",
        "judge.cache=false",
        "judge.short_circuit_no_tool_response=false",
        "judge.min_reply_chars=0",
        "simulator=sgls",
        f"simulator.model={SIM_MODEL}",
        "simulator.max_retries=0",
        "simulator.timeout_s=60",
        "simulator.cache=false",
        # every call of a listed tool reaches the service, whatever its arguments
        "simulator.check_required_args=false",
        "simulator.check_types=false",
    ]


@pytest.fixture(scope="module")
def verl_run(tool_caller, tmp_path_factory):
    """The shared run: verl's SFT of ``tool_caller``, then SLCA-GRPO from the SFT's weights."""
    args = [
        *recipe_args(tool_caller, STEPS, SAVE_EVERY),
        "engine.sft.enabled=true",
        f"engine.sft.steps={SFT_STEPS}",
        f"engine.sft.batch_size={SFT_BATCH}",
        f"engine.sft.lr={SFT_LR}",
        *PLANTED,  # a secret through every config route: test_no_secret_in_any_store
    ]
    run = train(tmp_path_factory.mktemp("verl-trains"), Services(faults=True), args)
    print(f"\nverl run: {run.wall_s:.0f} s wall for SFT and {STEPS} steps of {ROLLOUTS} rollouts")
    return run


@pytest.fixture(scope="module")
def flipped_run(verl_run, tool_caller, tmp_path_factory):
    """The control: the same verl path with every advantage's sign flipped, no SFT stage.

    verl's estimator reads its post-normalisation weights from verl's own ``algorithm.slca``
    section; -1 for both turns each advantage it hands the actor into its negative. (The
    recipe's ``algorithm.tool_weight`` refuses a negative weight: a user never trains this way.)
    It runs after the shared run (``verl_run``), never beside it on the same cores.
    """
    services = Services(faults=False, verl_overrides=FLIP)
    args = [
        *recipe_args(tool_caller, FLIPPED_STEPS, 1),
        "engine.sft.enabled=false",
        f"backbone.path={sft_weights(verl_run)}",  # where the shared run's RL stage started
        f"engine.verl.test_freq={FLIPPED_STEPS}",  # one validation, after its last step
        # success@k normalises the total by w_process + w_summary: with 0.25, a rollout whose
        # tool calls are right passes k = 0.7 whatever its reply's rating (measured with 1.0: no
        # rollout passed any k). SLCA-GRPO's advantages read the two scores, not the total.
        "reward.summary_weight=0.25",
        "engine.rl.grad_cos=true",  # the diagnostic's two extra passes, at every update
    ]
    run = train(tmp_path_factory.mktemp("verl-flipped"), services, args)
    print(f"\nflipped verl run: {run.wall_s:.0f} s wall for {FLIPPED_STEPS} steps")
    return run


@pytest.fixture(scope="module")
def local_run(verl_run, flipped_run, tool_caller, tmp_path_factory):
    """The shared run's recipe on the local engine: one RL step, after the verl runs.

    The components are the shared run's (the reward, the loopback judge and simulator, the
    split) and its RL stage's weights (verl's SFT of ``tool_caller``); the engine and its sizes
    differ, and a lower temperature than verl's 1.0 so that the logged rollouts (each of four
    groups' best and worst) make well-formed tool calls: at 1.0 the first try's four had none.
    """
    work = tmp_path_factory.mktemp("local-same-recipe")
    kept = [a for a in recipe_args(tool_caller, STEPS, SAVE_EVERY) if not a.startswith("engine.")]
    args = [
        *("experiment=smoke" if a == "experiment=verl_smoke" else a for a in kept),
        "engine=local",
        "engine.sft.enabled=false",
        f"backbone.path={sft_weights(verl_run)}",
        "engine.rl.steps=1",
        "engine.rollout.prompts_per_step=4",
        "engine.rollout.max_turn_tokens=96",
        "engine.rollout.max_response_tokens=320",
        "engine.rollout.temperature=0.7",
        "tracking.rollouts.per_step=8",
        "engine.val_rows=2",
        "engine.progress=false",
        f"tracking.root={work / 'out'}",
    ]
    exe = shutil.which("slca-exp") or str(Path(sys.executable).parent / "slca-exp")
    start = time.monotonic()
    with serve_in_thread(route=Services(faults=False).route) as server:
        urls = [f"judge.base_url={server.base_url}", f"simulator.base_url={server.base_url}"]
        result = subprocess.run(
            [exe, "train", *args, *urls],
            cwd=work,
            env=_cli_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert result.returncode == 0, result.stderr[-4000:]
    print(f"\nlocal run of the same recipe: {time.monotonic() - start:.0f} s wall")
    client = MlflowClient(f"sqlite:///{work / 'out' / 'mlflow.db'}")
    (run,) = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    return client, run.info.run_id, work


def test_the_runs_rollouts_are_traces_with_a_table_and_a_credit_view(verl_run, tmp_path):
    """Steps 1 and 10 (``tracking.rollouts.every=10``): each group's best and worst rollout."""
    by_split = check_run_rollouts(verl_run.client, verl_run.run_id, tmp_path)
    train = by_split["train"]
    assert sorted({int(t.info.tags["slca.step"]) for t in train}) == [1, 10]
    assert len(train) == 2 * 4  # tracking.rollouts.per_step at each logged step
    assert {t.info.tags["slca.engine"] for t in train} == {"verl"}
    # each trace's advantages are those verl's actor received at that step
    for trace in train:
        step = int(trace.info.tags["slca.step"])
        batch = verl_run.batch(step)
        root = trace.data.spans[0].attributes
        tokens = root["slca.tokens.tool"] + root["slca.tokens.summary"]
        summary_adv = root["slca.adv.summary"]
        rows = zip(batch["response_mask"], batch["advantages"], strict=True)
        matches = [
            i
            for i, (mask, adv) in enumerate(rows)
            if int(mask.sum()) == tokens and float(adv[mask.bool()][-1]) == summary_adv
        ]
        assert matches, (step, root)
    # the rewards and advantages as feedback, from the recipe's reward, judge and estimator
    tags = verl_run.client.get_run(verl_run.run_id).data.tags
    for trace in train:
        root = trace.data.spans[0].attributes
        got = {a.name: a for a in trace.info.assessments}
        assert got["advantage_summary"].value == root["slca.adv.summary"]
        assert got["reward_tool"].value == root["slca.reward.tool"]
        assert got["reward_tool"].source.source_id == tags["slca.reward"]
        assert got["advantage_summary"].source.source_id == tags["slca.estimator"]
        if "slca.adv.tool" in root:  # a rollout without a tool segment has no tool advantage
            assert got["advantage_tool"].value == root["slca.adv.tool"]
        else:
            assert "advantage_tool" not in got
        assert got["judge_status"].value == root["slca.judge.status"]
        assert got["judge_status"].source.source_id == tags["slca.judge"]
        if "slca.reward.rating" in root:
            assert got["judge_rating"].value == root["slca.reward.rating"]
    tools = [s for t in train for s in t.data.spans if s.span_type == "TOOL"]
    assert all(s.outputs["simulator"].startswith("sgls") for s in tools)
    # Which calls the logged rollouts hold, and so which of the simulator's alternating
    # answers, is the policy's choice: each span's status must match its own answer.
    answered = [s.outputs for s in tools if s.outputs["content"] is not None]
    assert answered, "no logged rollout holds an answered tool call"
    for out in answered:
        if out["status"] == "failed":  # the simulator's HTTP 500, after its retries
            assert json.loads(out["content"]) == {"error": "tool unavailable"}, out
        elif out["status"] == "ok":
            assert json.loads(out["content"]) == json.loads(SIM_ANSWER), out
        else:  # a call verl's tool refused itself (an unknown function): its own message
            assert out["status"] in ("schema_error", None) and out["content"], out
    assert all(s.outputs["status"] is None for s in tools if s.outputs["content"] is None)


def test_a_separator_dropped_from_verls_rollouts_is_caught_where_it_was(verl_run, tool_caller):
    """verl's own rollouts carry no drift (``check_run_rollouts``); one token less is caught."""
    from transformers import AutoTokenizer

    from slca_exp.rollouts.drift import check_drift
    from slca_exp.rollouts.files import RECORDS, artifact_path, read_records
    from tests.rollouts.drift import first_glue_position, without_token

    tok = AutoTokenizer.from_pretrained(tool_caller.folder)
    path = verl_run.client.download_artifacts(
        verl_run.run_id, artifact_path("train", 1, RECORDS), str(verl_run.root / "drift")
    )
    records = list(read_records(Path(path)))
    assert [r.drift.mismatched for r in records] == [0] * len(records)
    assert all(check_drift(r, tok) == r.drift for r in records)
    turned = [(r, first_glue_position(r)) for r in records if first_glue_position(r) is not None]
    assert turned, "no logged verl rollout has a tool turn"
    for record, position in turned:
        drift = check_drift(without_token(tok, record, position), tok)
        assert (drift.mismatched, drift.first, drift.where) == (1, position, "tool turn")
        assert drift.expected.startswith("\n")


def test_both_engines_traces_carry_the_same_span_kinds_and_attribute_names(verl_run, local_run):
    client, run_id, _ = local_run
    local = signature(check_run_rollouts(client, run_id, local_run[2] / "dl")["train"])
    verl = signature(
        check_run_rollouts(verl_run.client, verl_run.run_id, local_run[2] / "v")["train"]
    )
    assert set(local) == set(verl) == {"tags", "feedback", "AGENT", "CHAT_MODEL", "TOOL"}
    for kind in local:
        assert local[kind] - CONDITIONAL == verl[kind] - CONDITIONAL, kind
    # judge_rating: only where a judge rated (both runs' train traces hold some)
    assert "judge_rating:LLM_JUDGE" in local["feedback"] & verl["feedback"]


def test_the_run_finishes_every_step_in_the_recipes_mlflow_run(verl_run):
    run = verl_run.client.get_run(verl_run.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["slca.estimator"] == "slca_grpo"
    assert sorted(verl_run.metric("training/global_step")) == list(range(1, STEPS + 1))
    assert (verl_run.verl_dir / "finished").is_file()
    dumped = sorted(int(p.stem.split("_")[1]) for p in (verl_run.verl_dir / "batches").glob("*.pt"))
    assert dumped == list(range(1, STEPS + 1))
    step = verl_run.metric("timing_s/step")
    print(f"verl step: {sum(step.values()) / len(step):.1f} s mean, {max(step.values()):.1f} max")


def test_the_rollout_server_generates_with_the_trainers_new_weights_every_step(verl_run):
    lines = (verl_run.verl_dir / "rollout_weights.jsonl").read_text().splitlines()
    updates = [json.loads(line) for line in lines]
    # the trainer's weights before the first step (the SFT's: the test below), then after each
    # step's update
    assert [u["global_steps"] for u in updates] == list(range(STEPS + 1))
    assert all(u["missing"] == [] for u in updates)
    norms = [u["l2"] for u in updates]
    assert all(a != b for a, b in zip(norms, norms[1:], strict=False)), norms  # every step moved
    # the server sampled with what the trainer computes its log-probs from, at every step
    diff = verl_run.metric("training/rollout_probs_diff_max")
    assert sorted(diff) == list(range(1, STEPS + 1))
    assert max(diff.values()) <= PROBS_TOLERANCE, diff
    assert set(verl_run.metric("training/rollout_probs_diff_valid").values()) == {1.0}


def native_advantages(batch: dict, params: EstimatorParams) -> torch.Tensor:
    """Our estimator on the dumped rollouts: their masks, groups and the reward side's scores.

    A summary the judge could not score (``reward.judge_failure=absent``) is NaN: absent, as the
    trainer hands it over. The rest is what the reward manager reported for each rollout.
    """
    infos = batch["infos"]
    absent = [bool(i[SUMMARY_FAILED_KEY]) and not i[NO_SUMMARY_KEY] for i in infos]
    summary = [math.nan if a else float(i[SUMMARY_KEY]) for i, a in zip(infos, absent, strict=True)]
    total = [math.nan if a else float(i[TOTAL_KEY]) for i, a in zip(infos, absent, strict=True)]
    scores = RolloutScores(
        tool=torch.tensor([float(i[TOOL_KEY]) for i in infos]),
        summary=torch.tensor(summary),
        total=torch.tensor(total),
    )
    return get_estimator("slca_grpo")(batch["response_mask"], batch["uid"], scores, params)


@pytest.fixture(scope="module")
def params(verl_run):
    """The recipe's estimator hyper-parameters (the run's composed ``algorithm``)."""
    from slca_exp.preflight.compose import compose_run

    args = [a for a in verl_run.args if a not in PLANTED]  # its variable is the run's only
    return EstimatorParams.from_config(compose_run(args).algorithm)


def test_the_advantages_verls_actor_receives_are_our_estimators_at_every_step(verl_run, params):
    """Equal, bit for bit, at every step; and neither segment's advantages all zero.

    Equality of all-zero advantages would prove nothing about the routing: the run must have
    rollouts whose tool advantage and rollouts whose summary advantage is non-zero.
    """
    with_tool = tool_moved = summary_moved = 0
    for step in range(1, STEPS + 1):
        batch = verl_run.batch(step)
        assert len(batch["infos"]) == len(batch["uid"]) == ROLLOUTS
        ours = native_advantages(batch, params)
        assert torch.equal(ours.advantages, batch["advantages"]), step
        split = split_segments(batch["response_mask"])
        with_tool += int(split.has_tool.sum())
        tool_moved += int(((batch["advantages"] * split.tool_mask).abs().sum(1) > 0).sum())
        summary_moved += int(((batch["advantages"] * split.summary_mask).abs().sum(1) > 0).sum())
    print(
        f"rollouts with a tool segment: {with_tool}, with a tool advantage: {tool_moved}, "
        f"with a summary advantage: {summary_moved}"
    )
    assert with_tool > 0 and tool_moved > 0 and summary_moved > 0


def response_log_probs(model, batch: dict, temperature: float) -> list[torch.Tensor]:
    """``model``'s log-prob of each response token of ``batch``, as verl's actor computes it.

    One row at a time, unpadded: the prompt's and the response's token ids, one forward pass,
    the logits divided by the rollout temperature, the log-softmax at each response token.
    """
    out = []
    with torch.no_grad():
        for prompt, response in zip(batch["prompts"], batch["responses"], strict=True):
            ids = torch.tensor([prompt + response])
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
            picked = torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])
            out.append(picked.squeeze(1))
    return out


def sft_weights(run: VerlRun) -> Path:
    """The HF folder verl's SFT stage saved in ``run`` (its last step)."""
    (folder,) = (run.verl_dir / "sft").glob(f"global_step_{SFT_STEPS}/huggingface")
    return folder


def load_policy(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)


def temperature_of(run: VerlRun) -> float:
    from omegaconf import OmegaConf

    config = OmegaConf.load(run.verl_dir / "ppo_trainer.yaml")
    return float(config.actor_rollout_ref.rollout.temperature)


def weights_digest(folder: Path) -> str:
    """A sha256 over every tensor of the safetensors weights in ``folder``, by name."""
    from safetensors.torch import load_file

    digest = hashlib.sha256()
    for file in sorted(folder.glob("*.safetensors")):
        tensors = load_file(file)
        for name in sorted(tensors):
            digest.update(name.encode())
            digest.update(tensors[name].float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def test_verls_sft_loss_falls(verl_run):
    """verl's own SFT trainer, on CPU, learns the gold trajectories: its loss falls.

    The SFT stage logs into a child run of the recipe's run (tag ``slca.stage=sft``).
    """
    children = verl_run.client.search_runs(
        [verl_run.client.get_run(verl_run.run_id).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{verl_run.run_id}'",
    )
    (sft,) = [r for r in children if r.data.tags.get("slca.stage") == "sft"]
    assert sft.info.status == "FINISHED"
    loss = {m.step: m.value for m in verl_run.client.get_metric_history(sft.info.run_id, SFT_LOSS)}
    assert sorted(loss) == list(range(1, SFT_STEPS + 1)), loss
    first, last = loss[1], loss[SFT_STEPS]
    early = sum(loss[s] for s in range(1, 4)) / 3
    late = sum(loss[s] for s in range(SFT_STEPS - 2, SFT_STEPS + 1)) / 3
    print(f"verl SFT loss: {first:.3f} -> {last:.3f} (first 3: {early:.3f}, last 3: {late:.3f})")
    assert late < early * SFT_LOSS_RATIO, (early, late)


def test_rl_starts_from_the_weights_verls_sft_saved(verl_run, tool_caller):
    """The RL stage's actor and rollout server load what the SFT stage saved, not the backbone.

    Three views of one fact: the weights the rollout server received before the first step have
    the SFT checkpoint's norm and tensor count; the actor's log-probs of the first step's
    responses (``old_log_probs``) are the SFT checkpoint's, to float rounding; and the
    backbone the SFT started from gives other log-probs, so the match is not vacuous.
    """
    folder = sft_weights(verl_run)
    assert weights_digest(folder) != weights_digest(tool_caller.folder)  # the SFT moved them
    sft = load_policy(folder)
    state = sft.state_dict()
    weights_log = (verl_run.verl_dir / "rollout_weights.jsonl").read_text()
    first_update = json.loads(weights_log.splitlines()[0])
    assert first_update["global_steps"] == 0 and first_update["tensors"] == len(state)
    l2 = math.sqrt(sum(float(t.double().pow(2).sum()) for t in state.values()))
    assert first_update["l2"] == pytest.approx(l2, rel=1e-9)
    batch, temperature = verl_run.batch(1), temperature_of(verl_run)
    before = load_policy(tool_caller.folder)
    farthest = 0.0
    for row, (logp, backbone) in enumerate(
        zip(
            response_log_probs(sft, batch, temperature),
            response_log_probs(before, batch, temperature),
            strict=True,
        )
    ):
        mask = batch["response_mask"][row, : len(logp)].bool()
        old = batch["old_log_probs"][row, : len(logp)]
        assert torch.allclose(logp[mask], old[mask], atol=PROBS_TOLERANCE), row
        farthest = max(farthest, float((backbone[mask] - old[mask]).abs().max()))
    assert farthest > 100 * PROBS_TOLERANCE, farthest


Changes = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
"""Per response: the advantage, the log-prob change and the segment of each learnable token."""


def log_prob_changes(run: VerlRun, step: int) -> Changes:
    """Each response of ``step``: its advantages, new - old log-probs and segment, per token.

    ``old`` is the actor's log-prob before the step's update (the batch's ``old_log_probs``);
    ``new`` is recomputed with the weights verl checkpointed right after that update. Only
    learnable tokens are kept; the segment is 1 for tool tokens and 2 for summary tokens.
    """
    folder = run.verl_dir / "checkpoints" / f"global_step_{step}" / "actor" / "huggingface"
    batch = run.batch(step)
    split = split_segments(batch["response_mask"])
    segment = split.tool_mask.long() + 2 * split.summary_mask.long()
    out = []
    policy = load_policy(folder)
    for row, logp in enumerate(response_log_probs(policy, batch, temperature_of(run))):
        n = len(logp)
        mask = batch["response_mask"][row, :n].bool()
        change = (logp - batch["old_log_probs"][row, :n])[mask]
        out.append((batch["advantages"][row, :n][mask], change, segment[row, :n][mask]))
    return out


@dataclass(frozen=True)
class Moves:
    """How an update moved the log-probs of one segment's tokens, by the sign of their advantage.

    Attributes:
        up: mean log-prob change (nats) of the tokens with a positive advantage.
        down: mean log-prob change of the tokens with a negative advantage.
        contrast: ``up - down``: how far the update moved the tokens it was asked to raise
            above those it was asked to lower.
        low: the contrast's one-sided lower bound at :data:`CONFIDENCE`, by a bootstrap over
            the rollouts (a rollout's tokens move together: they are not independent draws).
        rollouts: rollouts whose segment had a non-zero advantage.

    """

    up: float
    down: float
    contrast: float
    low: float
    rollouts: int


def moves(rows: Changes, codes: tuple[int, ...]) -> Moves:
    """:class:`Moves` of the tokens whose segment is one of ``codes``, over ``rows``."""
    import numpy as np

    kept = [(a, c, torch.isin(s, torch.tensor(codes))) for a, c, s in rows]
    ours = [(a[k].double().numpy(), c[k].double().numpy()) for a, c, k in kept]
    picked = [(a, c) for a, c in ours if (a != 0).any()]  # rollouts with something to follow

    def measured(which) -> tuple[float, float]:
        adv = np.concatenate([picked[i][0] for i in which])
        change = np.concatenate([picked[i][1] for i in which])
        up, down = change[adv > 0], change[adv < 0]
        return (up.mean() if len(up) else np.nan), (down.mean() if len(down) else np.nan)

    if not picked:
        return Moves(math.nan, math.nan, math.nan, math.nan, 0)
    up, down = measured(range(len(picked)))
    rng = np.random.default_rng(0)
    resampled = [measured(rng.integers(0, len(picked), len(picked))) for _ in range(BOOTSTRAP)]
    contrasts = np.array([u - d for u, d in resampled])  # NaN: a resample without one side
    low = float(np.quantile(np.nan_to_num(contrasts, nan=-np.inf), 1 - CONFIDENCE, method="lower"))
    return Moves(float(up), float(down), float(up - down), low, len(picked))


SEGMENTS = {"tool": (1,), "summary": (2,), "all": (1, 2)}
"""The tokens each :class:`Moves` reads, by segment code (1 tool, 2 summary)."""


def segment_moves(run: VerlRun, steps: range) -> dict[str, Moves]:
    """:class:`Moves` of each segment and of both, over the checkpointed ``steps`` of ``run``."""
    rows = [r for step in steps for r in log_prob_changes(run, step)]
    return {name: moves(rows, codes) for name, codes in SEGMENTS.items()}


def test_each_segment_lifts_its_positive_advantage_tokens_above_its_negative_ones(verl_run):
    """Each segment's update does what its own advantages ask, read token by token.

    Over every step of the run, the tool tokens with a positive tool advantage end up higher,
    relative to where the step started them, than the tool tokens with a negative one, and the
    same for the summary tokens and the summary advantage; beyond noise (:data:`CONFIDENCE`).

    Why the contrast and not each side's sign: every token of a segment shares the drift of the
    whole update (one set of weights learns from both segments). Measured on this recipe: the
    tool tokens with a positive advantage moved by +0.002 nats on average and those with a
    negative one by -0.034 (contrast 0.036, one-sided lower bound 0.014 over 48 rollouts); the
    summary's contrast 0.100 (bound 0.085, 316 rollouts). In four earlier runs with 16 rollouts a
    step the tool tokens of rollouts whose tool advantage was zero drifted by -0.17 to +0.01 nats
    in a step, and the positive ones' mean by -0.05 to +0.04, while the contrast kept its sign:
    tool 0.03 to 0.05, summary 0.10 to 0.24.
    """
    found = segment_moves(verl_run, range(SAVE_EVERY, STEPS + 1, SAVE_EVERY))
    print(f"log-prob moves per segment: {found}")
    for name in ("tool", "summary"):
        move = found[name]
        assert move.rollouts >= 2, (name, move)  # both segments had advantages to follow
        assert move.low > 0, (name, move)


def test_flipped_advantages_move_the_policy_the_other_way(verl_run, flipped_run, params):
    """The control: the same verl path trained on the negated advantages moves the policy back.

    The flipped run's actor received exactly the negatives of our estimator's advantages, and
    followed them: measured against our estimator's advantages, its contrast over all learnable
    tokens, and over the summary tokens alone, is negative beyond noise, where the shared run's
    is positive. Its tool segment alone is printed, not asserted: measured, 29 of its rollouts
    had a tool advantage, contrast 0.035 with a lower bound of 0.008 (with 16 rollouts a step, 0
    to 4 rollouts): too thin a margin for a check that must not fail by chance.
    """
    for step in range(1, FLIPPED_STEPS + 1):
        batch = flipped_run.batch(step)
        assert torch.equal(-native_advantages(batch, params).advantages, batch["advantages"]), step
    trained = segment_moves(verl_run, range(SAVE_EVERY, STEPS + 1, SAVE_EVERY))
    flipped = segment_moves(flipped_run, range(1, FLIPPED_STEPS + 1))  # its own advantages
    print(f"trained: {trained}\nflipped: {flipped}")
    for name in ("all", "summary"):
        assert flipped[name].rollouts >= 2, (name, flipped)
        ours = -flipped[name].contrast  # the flipped run's contrast under our advantages
        ours_high = -flipped[name].low  # and its one-sided upper bound
        assert trained[name].low > 0 and ours < ours_high < 0, (name, trained, flipped)


def test_verls_validation_logs_our_val_metrics_from_the_same_rollouts(flipped_run):
    """verl's validation pass logs the local engine's ``val/*`` names, success@k included.

    Each equals what verl itself aggregates from the same rollouts' reward info (its
    ``val-aux/<source>/slca/...`` means of one data source): the reward means up to the order
    the floats are summed in; ``val/success@k`` and ``val/tool_success@k``, for every k, exactly
    (the mean of each rollout's 0/1 flag, k/N both ways). The equality says something only
    where a rate is neither 0 nor 1, so at least one of them must be: a flag or a count that
    differed from ours would then show. Measured over its 16 validation rollouts: success@0.7
    0.25, 0.19 and once 0.0, tool_success@0.7 0.31 and 0.19; success@0.9 and @1.0 were 0 in
    every run. (Which rates land inside (0, 1) varies from run to run on CPU, so no single one
    is required to.)
    """
    from slca_exp.core import names
    from slca_exp.engines.verl.rewards import success_key
    from slca_exp.tracking.mlflow import mlflow_key

    metrics = flipped_run.client.get_run(flipped_run.run_id).data.metrics

    def verls(key: str) -> float:
        """verl's ``mean@1`` of a reward-info key over the validation rollouts."""
        tail = "/" + mlflow_key(f"{key}/mean@1")
        (value,) = [v for k, v in metrics.items() if k.startswith("val-aux/") and k.endswith(tail)]
        return value

    assert metrics["val/reward/tool/hierr/mean"] == pytest.approx(
        verls("slca/tool/hierr"), rel=1e-12
    )
    assert metrics["val/reward/tool/mean"] == pytest.approx(verls("slca/tool/score"), rel=1e-12)
    ours = {}
    for k in names.SUCCESS_THRESHOLDS:
        for name in (names.val_success(k), names.val_tool_success(k)):
            ours[name] = metrics[mlflow_key(name)]
            assert ours[name] == verls(success_key(name)), (name, metrics)
        assert ours[names.val_success(k)] <= ours[names.val_success(0.7)]
    print(f"\nvalidation success@k: {ours}")
    assert any(0.0 < rate < 1.0 for rate in ours.values()), ours
    steps = [
        m.step
        for m in flipped_run.client.get_metric_history(flipped_run.run_id, "val/success_at_0.9")
    ]
    assert steps == [FLIPPED_STEPS]


def test_the_judges_ratings_are_what_the_reward_side_recorded(verl_run):
    steps = verl_run.services.judge_steps()
    assert len(steps) == STEPS and all(len(s) == ROLLOUTS for s in steps)
    means = [sum(rating for rating, _ in s) / len(s) for s in steps]
    print(f"mean judge rating per step: {[round(m, 2) for m in means]}")
    # the ratings the reward side recorded are the judge's, rollout for rollout
    for step, requests in enumerate(steps, start=1):
        rated = sorted(r for r, fate in requests if fate == "ok")
        infos = verl_run.batch(step)["infos"]
        assert sorted(i["slca/judge/rating"] for i in infos if i["slca/judge/rating"] > 0) == rated


def test_judge_failures_are_absent_summaries_counted_and_the_run_goes_on(verl_run, params):
    failures = verl_run.metric("judge/failures")
    steps = verl_run.services.judge_steps()
    assert len(steps) == STEPS  # every step ran, whatever its judge did
    for step, requests in enumerate(steps, start=1):
        injected = sum(fate != "ok" for _, fate in requests)
        batch = verl_run.batch(step)
        failed = [i["slca/judge_status"] == "failed" for i in batch["infos"]]
        assert failures[step] == injected == sum(failed), step
        split = split_segments(batch["response_mask"])
        for row, info in enumerate(batch["infos"]):
            if not failed[row]:
                assert math.isfinite(info["slca/judge/score"])
                continue
            assert math.isnan(info["slca/judge/score"])
            if info["slca/tool/should_no_call"]:  # the no-call penalty overrides the summary
                assert not info[SUMMARY_FAILED_KEY]
                continue
            assert info[SUMMARY_FAILED_KEY] and info[SUMMARY_KEY] == 0.0
            summary_tokens = split.summary_mask[row]
            assert not batch["advantages"][row][summary_tokens].any()  # absent: no advantage
    fates = {fate for s in steps for _, fate in s}
    assert {"500", "hang"} <= fates  # both kinds happened, to a few requests (2 in 16)
    assert 0 < sum(failures.values()) < STEPS * ROLLOUTS // 4


def test_the_gradient_conflict_is_logged_at_every_update_of_the_control_run(verl_run, flipped_run):
    """``engine.rl.grad_cos``: verl's actor measured it at every step, logged under our names.

    A segment's gradient norm is 0 exactly when none of its tokens had a non-zero advantage in
    the batch the actor received; the cosine is NaN when a segment has no token at all, else in
    [-1, 1] (0 for a zero gradient). The shared run, which leaves the switch off, logs none of it.
    """
    steps = list(range(1, FLIPPED_STEPS + 1))
    cos = flipped_run.metric("train/grad_cos")
    norms = {seg: flipped_run.metric(f"train/grad_norm_{seg}") for seg in ("tool", "summary")}
    assert sorted(cos) == steps and all(sorted(n) == steps for n in norms.values())
    for step in steps:
        split = split_segments(flipped_run.batch(step)["response_mask"])
        advantages = flipped_run.batch(step)["advantages"]
        for seg, mask in (("tool", split.tool_mask), ("summary", split.summary_mask)):
            moved = bool(advantages[mask].any())
            assert math.isfinite(norms[seg][step]) and (norms[seg][step] > 0) == moved, seg
        both = bool(split.tool_mask.any()) and bool(split.summary_mask.any())
        assert -1.0 <= cos[step] <= 1.0 if both else math.isnan(cos[step]), step
    assert any(math.isfinite(c) for c in cos.values())
    metrics = flipped_run.client.get_run(flipped_run.run_id).data.metrics
    assert not [k for k in metrics if k.startswith("actor/slca_")]  # logged under ours only
    assert verl_run.metric("train/grad_cos") == {}  # off unless asked for
    timing = {
        name: sorted(run.metric("timing_s/update_actor").values())
        for name, run in (("without", verl_run), ("with", flipped_run))
    }
    median = {name: values[len(values) // 2] for name, values in timing.items()}
    print(
        f"grad_cos: {cos}\nnorms: {norms}\nactor update, median s: {median} "
        f"(ratio {median['with'] / median['without']:.2f})"
    )


def test_every_step_counts_its_judge_and_simulator_requests_and_none_was_an_outage(verl_run):
    assert verl_run.metric("judge/requests") == dict.fromkeys(range(1, STEPS + 1), ROLLOUTS)
    asked, lost = verl_run.metric("simulator/requests"), verl_run.metric("simulator/failures")
    assert set(asked) <= set(range(1, STEPS + 1)) and set(lost) == set(asked)
    assert sum(lost.values()) == verl_run.services.simulated.count("500")  # every other call
    assert sum(asked.values()) == len(verl_run.services.simulated)
    assert "slca.outage.judge" not in verl_run.client.get_run(verl_run.run_id).data.tags
    assert "every judge request" not in verl_run.result.stdout + verl_run.result.stderr


def test_a_simulator_error_reaches_the_policy_as_the_local_engine_words_it(verl_run, tool_caller):
    from transformers import AutoTokenizer

    from slca_exp.backbones.chat import tool_turn_text
    from slca_exp.config.services import SimulatorConfig
    from slca_exp.core.rows import Row
    from slca_exp.rewards.types import ToolCall
    from slca_exp.simulators import build_simulator

    failed = verl_run.services.simulated.count("500")
    assert failed >= 1
    # what the local engine injects when its simulator service fails on a call
    schema = Row(tool_caller.rows[0]).tools()[0]
    call = ToolCall(schema["function"]["name"], {})
    with serve_in_thread(status=500) as down:
        config = SimulatorConfig(
            name="down",
            backend="sgls",
            model=SIM_MODEL,
            base_url=down.base_url,
            max_retries=0,
            cache=False,
            check_required_args=False,
        )
        with build_simulator(config) as simulator:
            answer = simulator.respond(call, schema)
    assert answer.status == "failed", answer
    tokenizer = AutoTokenizer.from_pretrained(tool_caller.folder)
    turn = tokenizer(tool_turn_text([answer.content]), add_special_tokens=False)["input_ids"]
    expected = tokenizer.decode(turn, skip_special_tokens=True)  # as verl's dump decodes
    seen = sum(
        rollout["output"].count(expected)
        for step in range(1, STEPS + 1)
        for rollout in verl_run.rollouts(step)
    )
    assert 1 <= seen <= failed, (seen, failed, expected)


def test_verls_prompts_list_the_rows_own_tools_as_the_local_engine_does(verl_run, tool_caller):
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from slca_exp.backbones.chat import render_prompt
    from slca_exp.core.rows import Row

    tokenizer = AutoTokenizer.from_pretrained(tool_caller.folder)
    rows = pq.read_table(verl_run.verl_dir / "data" / "train.parquet").to_pylist()
    by_question = {r["reward_model"]["ground_truth"]["question_content"]: r for r in rows}
    for rollout in verl_run.rollouts(1):
        row = by_question[rollout["gts"]["question_content"]]
        local = render_prompt(tokenizer, list(row["prompt"]), Row(row).tools())
        ids = tokenizer(local, add_special_tokens=False)["input_ids"]
        assert rollout["input"] == tokenizer.decode(ids, skip_special_tokens=True)


def test_no_secret_in_any_store(verl_run, tmp_path):
    """The planted secret reached verl's config as ``<redacted>`` and is in no store or log."""
    params = verl_run.client.get_run(verl_run.run_id).data.params
    assert params["slca_exp/judge/name"] == params["judge.name"] == REDACTED  # verl's and ours
    texts = mlflow_texts(verl_run.client, verl_run.run_id, tmp_path)
    stdio = [verl_run.result.stdout, verl_run.result.stderr]
    stores = [verl_run.root, verl_run.rollout_dir, verl_run.root.parent / "outputs", tmp_path]
    assert leaks(SECRET, stores, texts + stdio) == []
