"""slca-exp's verl trainer: verl's own v1 advantage step, with our segment flags and metrics.

``SLCATrainer._compute_advantage`` runs verl's ``PPOTrainer._compute_advantage`` unchanged. Its
TransferQueue is replaced by an in-memory store that keeps rows as verl's agent loop puts them
(``list_of_dict_to_tensordict`` of ``AgentLoopOutput.as_dict`` fields: nested response tensors,
``extra_fields`` with ``reward_extra_info``); everything else is verl's and ours.
"""

import numpy as np
import pytest
import torch

from tests.skip_policy import require

require("verl", reason="needs the verl extra")
pytestmark = pytest.mark.verl

import transfer_queue  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.trainer.ppo.v1 import get_trainer_cls  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402

from slca_exp.core import names  # noqa: E402
from slca_exp.engines.verl import plugin  # noqa: E402, F401 - registers the trainer
from slca_exp.engines.verl.keys import OUR_KEY  # noqa: E402
from slca_exp.engines.verl.rewards import (  # noqa: E402
    NO_SUMMARY_KEY,
    SUMMARY_KEY,
    TOOL_KEY,
    place_segment_scores,
    reward_metrics,
)
from slca_exp.engines.verl.tools import SIM_FAILURES_KEY, SIM_REQUESTS_KEY  # noqa: E402
from slca_exp.engines.verl.trainer import TRAINER_MODE, SLCATrainer, registered  # noqa: E402
from slca_exp.estimators import slca_grpo_advantages  # noqa: E402
from slca_exp.estimators.segments import split_segments  # noqa: E402
from slca_exp.services.outage import ServiceOutage  # noqa: E402


class MemoryQueue:
    """``kv_batch_get`` / ``kv_batch_put`` over a dict: rows in, TensorDicts out, as verl's."""

    def __init__(self):
        self.rows = {}

    def kv_batch_get(self, keys, partition_id, select_fields):
        rows = [self.rows[(partition_id, k)] for k in keys]
        fields = [f for f in select_fields if f in rows[0]]  # absent fields are not returned
        return list_of_dict_to_tensordict([{f: row[f] for f in fields} for row in rows])

    def kv_batch_put(self, keys, partition_id, fields):
        for i, key in enumerate(keys):
            row = self.rows[(partition_id, key)]
            for name in fields.keys():  # noqa: SIM118 - a TensorDict
                row[name] = fields[name][i]
        tags = [{"status": "success"} for _ in keys]
        return KVBatchMeta(keys=list(keys), tags=tags, partition_id=partition_id)


# One group of 4 rollouts of one prompt: (response mask, R_tool, R_sum, ends on a tool call).
GROUP = [
    ([1, 1, 0, 0, 1, 1, 1, 0], 0.9, 0.75, False),
    ([1, 1, 1, 0, 0, 1, 1], 0.2, 1.0, False),
    ([1, 0, 0, 1, 1, 0, 1, 1, 1], 0.6, 0.25, True),  # cut off: its last run is a tool call
    ([1, 1, 1, 1], 0.0, 0.5, False),  # no call: a summary only
]


def info(r_tool, r_sum, ends_on_tool, corrected):
    return {
        TOOL_KEY: r_tool,
        SUMMARY_KEY: r_sum,
        "slca/total_score": r_tool + r_sum,
        "slca/summary_failed": 0,
        "slca/ends_on_tool": int(ends_on_tool),
        NO_SUMMARY_KEY: int(ends_on_tool and corrected),
        "slca/tool/score": r_tool,
        "slca/tool/should_no_call": 0,
        "slca/judge/score": r_sum,
        "slca/judge/rating": int(1 + 4 * r_sum),
        "slca/judge_status": "ok",
        "slca/judge/cached": 0,
        "slca/judge/latency_ms": 12.0,
        **{f"slca/tool/{part}": r_tool for part in names.TOOL_COMPONENTS},
    }


def queue_with_group(corrected):
    """The group as verl's agent loop leaves it in the TransferQueue; the batch and masks."""
    queue, keys, masks = MemoryQueue(), [], []
    for i, (mask, r_tool, r_sum, ends) in enumerate(GROUP):
        key = f"prompt0_{i}_0"  # {uid}_{session}_{index}
        mask = torch.tensor(mask)
        extra = {"reward_extra_info": info(r_tool, r_sum, ends, corrected)}
        scores = place_segment_scores(mask, r_tool, r_sum, has_summary=not (ends and corrected))
        queue.rows[("train", key)] = {
            "uid": "prompt0",
            "response_mask": mask,
            "rm_scores": scores,
            "extra_fields": extra,
        }
        keys.append(key)
        masks.append(mask)
    width = max(len(m) for m in masks)
    padded = torch.stack([torch.nn.functional.pad(m, (0, width - len(m))) for m in masks])
    tags = [{"status": "success"} for _ in keys]
    return queue, KVBatchMeta(keys=keys, tags=tags, partition_id="train"), padded


def trainer(mask_rule):
    """The trainer with just what its advantage step reads (no GPUs, no workers)."""
    slca = {"tool_weight": 1.0, "summary_weight": 1.0, "eps": 1e-6, "mask_rule": mask_rule}
    config = OmegaConf.create(
        {
            "algorithm": {
                "adv_estimator": "slca_grpo",
                "use_kl_in_reward": False,
                "gamma": 1.0,
                "lam": 1.0,
                "norm_adv_by_std_in_grpo": True,
                "slca": slca,
            },
            "actor_rollout_ref": {"rollout": {"n": len(GROUP)}},
        }
    )
    instance = SLCATrainer.__new__(SLCATrainer)
    instance.config = config
    instance.global_steps = 1
    return instance


def advantages(queue, batch, width):
    rows = [queue.rows[("train", k)]["advantages"] for k in batch.keys]
    return torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])


def test_the_plugin_registers_our_trainer_in_verls_registry():
    assert registered() and get_trainer_cls(TRAINER_MODE) is SLCATrainer


@pytest.mark.parametrize("mask_rule", ["parity", "corrected"])
def test_verls_advantage_step_routes_each_score_and_logs_our_metrics(monkeypatch, mask_rule):
    corrected = mask_rule == "corrected"
    queue, batch, mask = queue_with_group(corrected)
    monkeypatch.setattr(transfer_queue, "kv_batch_get", queue.kv_batch_get)
    monkeypatch.setattr(transfer_queue, "kv_batch_put", queue.kv_batch_put)
    metrics = {}
    trainer(mask_rule)._compute_advantage(batch, metrics)

    split = split_segments(mask)
    ends = torch.tensor([g[3] for g in GROUP])
    if corrected:
        split = split.without_summary(ends)
    r_tool = torch.tensor([g[1] for g in GROUP])
    r_sum = torch.tensor([0.0 if (g[3] and corrected) else g[2] for g in GROUP])
    expected = slca_grpo_advantages(split, ["prompt0"] * len(GROUP), r_tool, r_sum)
    got = advantages(queue, batch, mask.shape[1])
    torch.testing.assert_close(got, expected.advantages, atol=1e-5, rtol=0)
    # the cut-off rollout: under parity its last tool call takes the summary's advantage; the
    # corrected rule gives every one of its tokens the tool advantage
    cut = got[2][mask[2].bool()]
    assert (len(set(cut.tolist())) == 1) is corrected
    # our metric names, in the metrics verl logs at this step
    for seg in names.SEGMENTS:
        assert metrics[names.adv(seg, "mean")] == pytest.approx(
            expected.stats[names.adv(seg, "mean")]
        )
    present = 3 / 4 if corrected else 1.0  # corrected: the cut-off rollout has no summary
    assert metrics[names.present_frac("summary")] == pytest.approx(present)
    assert metrics["reward/tool/mean"] == pytest.approx(np.mean([g[1] for g in GROUP]))
    assert metrics["judge/latency_ms"] == pytest.approx(12.0)
    assert set(metrics) <= set(names.METRICS)


def test_a_summary_the_judge_could_not_score_is_left_out_of_its_groups_normalisation(
    monkeypatch,
):
    queue, batch, mask = queue_with_group(False)
    row = queue.rows[("train", batch.keys[1])]  # judge failure under judge_failure=absent
    row["extra_fields"]["reward_extra_info"].update(
        {
            SUMMARY_KEY: 0.0,
            "slca/summary_failed": 1,
            "slca/judge/score": float("nan"),
            "slca/judge_status": "failed",
        }
    )
    row["rm_scores"] = place_segment_scores(row["response_mask"], GROUP[1][1], 0.0)
    monkeypatch.setattr(transfer_queue, "kv_batch_get", queue.kv_batch_get)
    monkeypatch.setattr(transfer_queue, "kv_batch_put", queue.kv_batch_put)
    metrics = {}
    trainer("parity")._compute_advantage(batch, metrics)
    r_tool = torch.tensor([g[1] for g in GROUP])
    r_sum = torch.tensor([g[2] for g in GROUP])
    r_sum[1] = float("nan")  # absent, not 0
    expected = slca_grpo_advantages(mask, ["prompt0"] * len(GROUP), r_tool, r_sum)
    got = advantages(queue, batch, mask.shape[1])
    torch.testing.assert_close(got, expected.advantages, atol=1e-5, rtol=0)
    assert metrics[names.present_frac("summary")] == pytest.approx(3 / 4)
    assert metrics["judge/failures"] == 1.0


def test_corrected_without_our_trainer_fails_loudly_instead_of_reading_parity():
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    _, _, mask = queue_with_group(True)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": torch.zeros(mask.shape), "response_mask": mask}
    )
    data.non_tensor_batch["uid"] = np.array(["p"] * len(GROUP), dtype=object)
    config = trainer("corrected").config.algorithm
    with pytest.raises(RuntimeError, match="trainer.v1.trainer_mode=slca_sync"):
        compute_advantage(data, adv_estimator="slca_grpo", config=config)


def test_reward_metrics_leave_out_absent_summaries_and_other_managers_rows():
    rows = [info(0.5, 0.75, False, False), info(1.0, 0.0, False, False), {}]
    rows[1].update({"slca/judge/score": float("nan"), "slca/summary_failed": 1})
    rows[1]["slca/judge_status"] = "failed"
    stats = reward_metrics(rows)
    assert stats["reward/summary/mean"] == pytest.approx(0.75)  # the failed judge is absent
    assert stats["reward/tool/mean"] == pytest.approx(0.75)
    assert stats["judge/failures"] == 1.0
    assert reward_metrics([{}, {"acc": 1.0}]) == {}


def test_a_step_whose_every_judge_request_failed_stops_the_run_under_stop(monkeypatch, capsys):
    queue, batch, _ = queue_with_group(False)
    for key in batch.keys:
        row = queue.rows[("train", key)]["extra_fields"]
        row["reward_extra_info"].update(
            {"slca/summary_failed": 1, "slca/judge/score": float("nan")}
        )
        row["reward_extra_info"]["slca/judge_status"] = "failed"
        row[SIM_REQUESTS_KEY], row[SIM_FAILURES_KEY] = 2, 1  # the simulator half answered
    monkeypatch.setattr(transfer_queue, "kv_batch_get", queue.kv_batch_get)
    monkeypatch.setattr(transfer_queue, "kv_batch_put", queue.kv_batch_put)
    absent = trainer("parity")
    absent.config[OUR_KEY] = {"reward": {"judge_failure": "absent"}}
    metrics = {}
    absent._compute_advantage(batch, metrics)  # goes on, loudly
    n = len(GROUP)
    assert metrics["judge/requests"] == metrics["judge/failures"] == n
    assert metrics["simulator/requests"] == 2 * n and metrics["simulator/failures"] == n
    err = capsys.readouterr().err
    assert f"WARNING: every judge request of RL step 1 failed ({n} of {n})" in err
    assert "every simulator request" not in err
    stop = trainer("parity")
    stop.config[OUR_KEY] = {"reward": {"judge_failure": "stop"}}
    with pytest.raises(ServiceOutage, match="reward.judge_failure=stop"):
        stop._compute_advantage(batch, {})
