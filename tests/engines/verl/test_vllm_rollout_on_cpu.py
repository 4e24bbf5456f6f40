"""verl's own vLLM rollout on vLLM's CPU build: ``experiment=verl_smoke`` as a GPU run generates.

One ``slca-exp train experiment=verl_smoke`` run, shared here, on the recipe's own rollout
(``engine.verl.cpu_rollout=vllm``): verl's vLLM HTTP server and tool agent loop, its bucketed
weight sync over shared memory into vLLM after every update (through the ``cpu`` backend's
worker extension), the tiny built-in backbone after verl's SFT, then :data:`STEPS` steps of
SLCA-GRPO. The judge and the simulator are the loopback services of the shared verl run
(``test_verl_trains_on_cpu``): ratings by reply length, every other simulator call failing.

What proves the weight sync is the log-probs vLLM reports for the tokens it sampled (verl's
``rollout_log_probs``, dumped with each step's batch), against the same tokens' log-probs under
the weights the trainer had at that step (``old_log_probs``) and, as the control, under the SFT
weights RL started from: at step 1 the three agree; at step 2, after an update, vLLM agrees
with the trainer and no longer with the SFT weights. The run takes about 5 minutes on a busy
2-core host (vLLM's start inside verl about 1 of them; the fixture prints it).
"""

from __future__ import annotations

import math

import pytest

from tests.skip_policy import require

require("verl", reason="needs the verl extra")
require("vllm", reason="needs vLLM's CPU build (make install)")
pytestmark = [pytest.mark.verl, pytest.mark.slow]

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from slca_exp.engines.verl.cpu import VLLM_WORKER_EXTENSION  # noqa: E402
from slca_exp.estimators import EstimatorParams  # noqa: E402
from slca_exp.estimators.segments import split_segments  # noqa: E402
from tests.engines.verl.test_verl_trains_on_cpu import (  # noqa: E402
    JUDGE_MODEL,
    JUDGE_TIMEOUT_S,
    SIM_MODEL,
    Services,
    VerlRun,
    load_policy,
    native_advantages,
    response_log_probs,
    train,
)
from tests.rollouts.checks import check_run_rollouts  # noqa: E402

STEPS = 2
"""RL steps: the first generates with the SFT's weights, the second with an update's."""
PROMPTS, GROUP = 4, 4
SFT_STEPS, SFT_LR = 100, 5e-3
"""verl's SFT of the built-in backbone: enough for rollouts that call tools (40 steps at
verl_smoke's 3e-3 left a policy none of whose 32 rollouts made a call)."""
RL_LR = 1e-3
"""Large enough that one update moves the sampled tokens' log-probs far past the tolerance."""
SYNC_TOLERANCE = 2e-4
"""Largest |log p_vLLM - log p_trainer| of a sampled token. Both compute in float32 from the same
weights, vLLM with its CPU kernels and the trainer with torch's, in other orders of operations;
measured: 2.4e-6 and 1.9e-5 in two runs (the longer responses, the larger)."""
MOVED = 0.1
"""The control: one update moves some sampled token's log-prob by more than this (measured: 3.8
and 11.7 in the same two runs), so stale weights could not pass the sync check."""


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    """verl_smoke through verl's vLLM rollout: verl's SFT, then SLCA-GRPO from its weights."""
    args = [
        "experiment=verl_smoke",
        "data.rows=16",
        "data.seed=0",
        "engine.sft.enabled=true",
        f"engine.sft.steps={SFT_STEPS}",
        "engine.sft.batch_size=8",
        f"engine.sft.lr={SFT_LR}",
        f"engine.verl.train_batch_size={PROMPTS}",
        f"algorithm.group_size={GROUP}",
        "engine.verl.ppo_mini_batch_size=4",
        f"engine.verl.total_training_steps={STEPS}",
        f"engine.verl.lr={RL_LR}",
        "engine.verl.use_kl_loss=false",
        "engine.verl.dump_batches=true",
        "tracking.rollouts.every=1",
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
        "simulator.cache=false",
        "simulator.check_required_args=false",
        "simulator.check_types=false",
    ]
    run = train(tmp_path_factory.mktemp("verl-vllm"), Services(faults=False), args)
    print(f"\nverl run with the vLLM rollout: {run.wall_s:.0f} s wall for SFT and {STEPS} steps")
    return run


def sft_folder(run: VerlRun):
    (folder,) = (run.verl_dir / "sft").glob(f"global_step_{SFT_STEPS}/huggingface")
    return folder


def masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return values[mask.bool()]


def log_prob_gaps(run: VerlRun, step: int, folder) -> tuple[float, float, float]:
    """At ``step``: max |vLLM - trainer|, max |vLLM - weights in folder|, max |trainer - folder|.

    Over every sampled token the loss sees (the response mask), as verl scores them: the logits
    divided by the rollout temperature.
    """
    batch = run.batch(step)
    config = OmegaConf.load(run.verl_dir / "ppo_trainer.yaml")
    temperature = float(config.actor_rollout_ref.rollout.temperature)
    theirs = response_log_probs(load_policy(folder), batch, temperature)
    served, trained = batch["rollout_log_probs"], batch["old_log_probs"]
    rows = zip(served, trained, batch["response_mask"], theirs, strict=True)
    gaps = [0.0, 0.0, 0.0]
    for rollout, trainer, mask, reference in rows:
        n = len(reference)
        keep = mask[:n].bool()
        vllm, actor, ref = rollout[:n][keep], trainer[:n][keep], reference[keep]
        for i, (a, b) in enumerate(((vllm, actor), (vllm, ref), (actor, ref))):
            if a.numel():
                gaps[i] = max(gaps[i], float((a - b).abs().max()))
    return gaps[0], gaps[1], gaps[2]


def test_verl_smoke_runs_to_finished_through_verls_vllm_rollout(vllm_run):
    config = OmegaConf.load(vllm_run.verl_dir / "ppo_trainer.yaml")
    rollout = config.actor_rollout_ref.rollout
    assert rollout.name == "vllm"
    assert rollout.engine_kwargs.vllm.worker_extension_cls == VLLM_WORKER_EXTENSION
    run = vllm_run.client.get_run(vllm_run.run_id)
    assert run.info.status == "FINISHED"
    assert sorted(vllm_run.metric("training/global_step")) == list(range(1, STEPS + 1))
    assert set(vllm_run.metric("training/rollout_probs_diff_valid").values()) == {1.0}
    for phase in ("gen", "update_weights", "old_log_prob", "update_actor"):
        assert sorted(vllm_run.metric(f"timing_s/{phase}")) == list(range(1, STEPS + 1)), phase


def test_rl_starts_from_the_sft_weights_and_vllm_generates_with_them(vllm_run):
    config = OmegaConf.load(vllm_run.verl_dir / "ppo_trainer.yaml")
    folder = sft_folder(vllm_run)
    assert config.actor_rollout_ref.model.path == str(folder)
    to_trainer, to_sft, trainer_to_sft = log_prob_gaps(vllm_run, 1, folder)
    print(f"step 1: |vLLM - trainer| {to_trainer:.2e}, |vLLM - SFT| {to_sft:.2e}")
    assert to_trainer <= SYNC_TOLERANCE and to_sft <= SYNC_TOLERANCE
    assert trainer_to_sft <= SYNC_TOLERANCE


def test_after_an_update_vllm_generates_with_the_new_weights(vllm_run):
    """Step 2's tokens: vLLM's log-probs are the updated trainer's, no longer the SFT's."""
    to_trainer, to_sft, trainer_to_sft = log_prob_gaps(vllm_run, 2, sft_folder(vllm_run))
    print(
        f"step 2: |vLLM - trainer| {to_trainer:.2e}, |vLLM - SFT| {to_sft:.2e}, "
        f"|trainer - SFT| {trainer_to_sft:.2e}"
    )
    assert trainer_to_sft > MOVED  # the control: the update moved what stale weights would say
    assert to_sft > MOVED
    assert to_trainer <= SYNC_TOLERANCE


def test_the_actor_gets_our_advantages_bit_equal(vllm_run):
    from slca_exp.preflight.compose import compose_run

    params = EstimatorParams.from_config(compose_run(vllm_run.args).algorithm)
    moved = 0
    for step in range(1, STEPS + 1):
        batch = vllm_run.batch(step)
        assert len(batch["uid"]) == PROMPTS * GROUP
        ours = native_advantages(batch, params)
        assert torch.equal(ours.advantages, batch["advantages"]), step
        moved += int((batch["advantages"].abs().sum(1) > 0).sum())
    assert moved > 0  # equal all-zero advantages would prove nothing


def test_per_segment_metrics_and_rollout_traces_are_in_mlflow(vllm_run, tmp_path):
    for name in ("adv/tool/mean", "adv/summary/mean", "reward/tool/mean", "reward/summary/mean"):
        values = vllm_run.metric(name)
        assert sorted(values) == list(range(1, STEPS + 1)), name
        assert all(math.isfinite(v) for v in values.values()), name
    train_traces = check_run_rollouts(vllm_run.client, vllm_run.run_id, tmp_path)["train"]
    assert sorted({int(t.info.tags["slca.step"]) for t in train_traces}) == [1, 2]
    assert {t.info.tags["slca.engine"] for t in train_traces} == {"verl"}
    for trace in train_traces:
        batch = vllm_run.batch(int(trace.info.tags["slca.step"]))
        root = trace.data.spans[0].attributes
        split = split_segments(batch["response_mask"])
        tokens = root["slca.tokens.tool"] + root["slca.tokens.summary"]
        assert tokens in {int(m.sum()) for m in batch["response_mask"]}, root
        assert split.tool_mask.shape == batch["advantages"].shape
