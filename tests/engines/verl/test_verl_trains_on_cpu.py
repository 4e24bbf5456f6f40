"""verl trains: one small ``slca-exp train engine=verl engine.verl.backend=cpu`` run, shared here.

The run is what a user starts from the command line, sized like ``experiment=verl_smoke`` without
its SFT stage: the ``tool_caller`` checkpoint (a tiny policy that already writes tool calls) as
the backbone, 4 prompts x 4 rollouts per step, :data:`STEPS` steps of SLCA-GRPO through verl's
own PPO trainer, one intra-op thread per verl process. Both frozen services are one
OpenAI-compatible loopback server on 127.0.0.1 (:class:`Services`), started by the fixture:

- the judge (``judge=openai``) rates a final reply by its length alone (shorter is better,
  :func:`rating_of`), so that the rollouts of a group differ and their summary advantages are
  not zero; a few requests fail: HTTP 500 or a hang past the judge's timeout
  (``reward.judge_failure=absent``);
- the simulator (``simulator=sgls``) answers every other tool call with HTTP 500 (the others
  with a fixed JSON result), the way a simulator service fails.

What verl writes is read back: the MLflow run, ``rollout_weights.jsonl`` (the rollout server's
weight updates), each step's batch as the actor received it (``engine.verl.dump_batches``),
verl's checkpoints of the actor (HF weights, every :data:`SAVE_EVERY` steps) and verl's own
rollout dump (``trainer.rollout_data_dir``, decoded without special tokens). The run
costs about 2-3 minutes on a shared 2-core host, verl's start-up included (the fixture prints it),
plus the ``tool_caller`` checkpoint the engine tests share.
"""

from __future__ import annotations

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

pytest.importorskip("verl", reason="needs the verl extra")
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
from tests.planted import PLANTED, SECRET, SECRET_ENV, leaks, mlflow_texts  # noqa: E402

STEPS = 12
"""RL steps of the run."""
PROMPTS, GROUP = 4, 4
ROLLOUTS = PROMPTS * GROUP
"""Rollouts per step; every one of them is judged once (the strict reward asks the judge for each,
and the judge's short-circuits are off), so the judge's requests come in steps of this many."""
JUDGE_MODEL, SIM_MODEL = "loopback-judge", "loopback-simulator"
REPLY_BANDS = (15, 40, 80, 160)
"""Final replies longer than each of these many characters lose one rating point (5 down to 1)."""
FAILURE_PERIOD = 3 * ROLLOUTS
JUDGE_FAILURES = {2: "500", ROLLOUTS + 5: "hang"}
"""Judge request k (in arrival order) fails as ``JUDGE_FAILURES[k % FAILURE_PERIOD]``: in every
three steps one request answered HTTP 500, one left hanging, and one step without failures."""
JUDGE_TIMEOUT_S, HANG_S = 3.0, 30.0
SIM_ANSWER = json.dumps({"status": "success", "result": {"value": 42, "state": "ok"}})
PROBS_TOLERANCE = 1e-4
"""Largest |p_server - p_trainer| of a sampled token allowed (``training/rollout_probs_diff_max``).

Both sides compute in float32 from the same weights; what is left is the order of float
operations (a cached token-by-token forward on the server, a batched one in the trainer): 1e-6 to
4e-6 measured. One update moves some tokens' probability ratio past PPO's clip (0.2) already."""
SAVE_EVERY = 4
"""verl checkpoints the actor (HF weights) after every this many steps' updates."""

_REPLY = re.compile(r"<final_answer>\n(.*)\n</final_answer>", re.S)


def rating_of(reply: str) -> int:
    """The loopback judge's rating of a final reply: 5 for at most 15 characters, down to 1."""
    return 5 - sum(len(reply) > band for band in REPLY_BANDS)


@dataclass
class Services:
    """The loopback judge and simulator: answers, and every request's fate in arrival order."""

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
        fate = JUDGE_FAILURES.get(len(self.judged) % FAILURE_PERIOD, "ok")
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


@pytest.fixture(scope="module")
def verl_run(tool_caller, tmp_path_factory):
    """The shared run: ``slca-exp train`` as a user runs it, against the loopback services."""
    work = tmp_path_factory.mktemp("verl-trains")
    root, rollout_dir = work / "out", work / "rollouts"
    services = Services()
    exe = shutil.which("slca-exp") or str(Path(sys.executable).parent / "slca-exp")
    with serve_in_thread(route=services.route) as server:
        url = server.base_url
        args = [
            "experiment=verl_smoke",
            "engine.sft.enabled=false",
            "backbone.source=local",
            "backbone.name=tool-caller",
            f"backbone.path={tool_caller.folder}",
            "data.rows=16",
            "data.seed=0",
            f"engine.verl.train_batch_size={PROMPTS}",
            f"algorithm.group_size={GROUP}",
            "engine.verl.ppo_mini_batch_size=2",  # two updates per step
            f"engine.verl.total_training_steps={STEPS}",
            f"engine.verl.save_freq={SAVE_EVERY}",  # weights after some updates, in HF format
            "engine.verl.total_epochs=3",
            "engine.verl.lr=1e-3",
            "engine.verl.use_kl_loss=false",
            "engine.verl.dump_batches=true",
            # one intra-op thread per verl process: on a shared 2-core host, processes that
            # each take every core stall one another (the actor update measured 10x slower)
            f"engine.verl.overrides=['trainer.rollout_data_dir={rollout_dir}',"
            "'trainer.val_before_train=false',"
            "'actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]',"
            "'ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS=1',"
            "'ray_kwargs.ray_init.runtime_env.env_vars.MKL_NUM_THREADS=1']",
            "reward.judge_failure=absent",
            "judge=openai",
            *PLANTED,  # a secret through every config route: test_no_secret_in_any_store
            f"judge.base_url={url}",
            f"judge.model={JUDGE_MODEL}",
            f"judge.timeout_s={JUDGE_TIMEOUT_S}",
            "judge.max_retries=0",
            "judge.cache=false",
            "judge.short_circuit_no_tool_response=false",
            "judge.min_reply_chars=0",
            "simulator=sgls",
            f"simulator.base_url={url}",
            f"simulator.model={SIM_MODEL}",
            "simulator.max_retries=0",
            "simulator.timeout_s=60",
            "simulator.cache=false",
            # every call of a listed tool reaches the service, whatever its arguments
            "simulator.check_required_args=false",
            "simulator.check_types=false",
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
    print(f"\nverl run: {wall:.0f} s wall for {STEPS} steps of {ROLLOUTS} rollouts")
    assert result.returncode == 0, result.stderr[-4000:]
    (verl_dir,) = (root / "runs").glob("*/verl")
    run_id = json.loads((verl_dir / "run_ids.json").read_text())["mlflow"]
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    return VerlRun(result, wall, args, services, root, verl_dir, rollout_dir, client, run_id)


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


def test_the_rollout_server_generates_with_the_trainers_new_weights_every_step(
    verl_run, tool_caller
):
    from transformers import AutoModelForCausalLM

    lines = (verl_run.verl_dir / "rollout_weights.jsonl").read_text().splitlines()
    updates = [json.loads(line) for line in lines]
    # the trainer's weights before the first step, then after each step's update
    assert [u["global_steps"] for u in updates] == list(range(STEPS + 1))
    assert all(u["missing"] == [] for u in updates)
    backbone = AutoModelForCausalLM.from_pretrained(tool_caller.folder)
    state = backbone.state_dict()
    assert updates[0]["tensors"] == len(state)
    start = math.sqrt(sum(float(t.double().pow(2).sum()) for t in state.values()))
    assert updates[0]["l2"] == pytest.approx(start, rel=1e-9)  # the backbone's own weights
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
    with_tool = moved = 0
    for step in range(1, STEPS + 1):
        batch = verl_run.batch(step)
        assert len(batch["infos"]) == len(batch["uid"]) == ROLLOUTS
        ours = native_advantages(batch, params)
        assert torch.equal(ours.advantages, batch["advantages"]), step
        split = split_segments(batch["response_mask"])
        with_tool += int(split.has_tool.sum())
        moved += int(((batch["advantages"] * split.tool_mask).abs().sum(1) > 0).sum())
    print(f"rollouts with a tool segment: {with_tool}, with a tool advantage: {moved}")
    assert with_tool > 0  # both segments were there to be routed


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


def test_verls_update_moves_the_policy_along_our_advantages(verl_run, tool_caller):
    """A step's update raises the log-probs of tokens with positive advantages, lowers the rest.

    The test above pins that the advantages verl's actor trained on are exactly our estimator's,
    each segment's on that segment's tokens; this one pins what the actor does with them. The
    batch of a step holds the actor's log-probs of its responses before the step's update
    (``old_log_probs``); verl checkpoints the weights after every :data:`SAVE_EVERY`-th. PPO's
    surrogate, sum(advantage x (new - old log-prob)) over the response tokens, must have risen:
    an actor that negated the advantages, or applied them to other tokens, lowers it. The
    log-probs are recomputed here first with the weights the first step started from, and must
    be the trainer's own, so that the comparison is between like and like.
    """
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from slca_exp.engines.verl.engine import final_hf_checkpoint

    config = OmegaConf.load(verl_run.verl_dir / "ppo_trainer.yaml")
    temperature = float(config.actor_rollout_ref.rollout.temperature)
    first = verl_run.batch(1)
    start = AutoModelForCausalLM.from_pretrained(tool_caller.folder, torch_dtype=torch.float32)
    for row, logp in enumerate(response_log_probs(start, first, temperature)):
        mask = first["response_mask"][row, : len(logp)].bool()
        old = first["old_log_probs"][row, : len(logp)]
        assert torch.allclose(logp[mask], old[mask], atol=PROBS_TOLERANCE), row
    checkpoints = verl_run.verl_dir / "checkpoints"
    assert final_hf_checkpoint(checkpoints) == (
        checkpoints / f"global_step_{STEPS}" / "actor" / "huggingface",
        STEPS,
    )
    gains = {}
    for step in range(SAVE_EVERY, STEPS + 1, SAVE_EVERY):
        folder = checkpoints / f"global_step_{step}" / "actor" / "huggingface"
        after = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
        batch = verl_run.batch(step)
        gain, moved = 0.0, 0
        for row, logp in enumerate(response_log_probs(after, batch, temperature)):
            mask = batch["response_mask"][row, : len(logp)].bool()
            advantage = batch["advantages"][row, : len(logp)][mask]
            gain += float(
                (advantage * (logp - batch["old_log_probs"][row, : len(logp)])[mask]).sum()
            )
            moved += int((advantage != 0).sum())
        if moved:  # a step whose every group agreed has nothing to move along
            gains[step] = gain
    print(f"surrogate gain of each checkpointed step's update: {gains}")
    assert gains and all(gain > 0 for gain in gains.values()), gains


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
    assert {"500", "hang"} <= fates  # both kinds happened ...
    assert 0 in failures.values() and max(failures.values()) > 0  # ... at some steps, not all


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
    from slca_exp.config.schema import SimulatorConfig
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
