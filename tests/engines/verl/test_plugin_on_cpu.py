"""Our estimators inside verl: registered by the plugin, run by verl's own advantage code (v1).

The batch is built as verl's v1 trainer builds it in ``_compute_advantage``: a ``DataProto``
with ``response_mask``, ``token_level_rewards`` (the reward side's two scores on the last token
of each segment, minus a per-token KL term as ``use_kl_in_reward`` applies it) and the ``uid``
array; the advantages come out of ``compute_advantage_for_multi_trajectories``.
"""

import os
import subprocess
import sys
import uuid

import numpy as np
import pytest
import torch

from tests.skip_policy import require

require("verl", reason="needs the verl extra")
pytestmark = pytest.mark.verl

from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories  # noqa: E402

from slca_exp.engines.verl import plugin  # noqa: E402
from slca_exp.engines.verl.estimators import params_from, segment_scores  # noqa: E402
from slca_exp.estimators import slca_grpo_advantages, toolpo_grpo_advantages  # noqa: E402

PROBE = (
    "from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY as R;"
    "print(sorted(n for n in ('slca_grpo', 'toolpo_grpo') if n in R))"
)


def fresh_verl(**env):
    """A new Python that imports verl with ``env`` (entry points off: only the variable counts)."""
    full = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}
    full.update({"VERL_USE_EXTERNAL_PLUGINS": "none", **env})
    return subprocess.run(
        [sys.executable, "-c", PROBE], env=full, capture_output=True, text=True, timeout=300
    )


def test_the_environment_variable_registers_both_estimators_in_a_fresh_process():
    res = fresh_verl(**plugin.worker_env())
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "['slca_grpo', 'toolpo_grpo']"
    without = fresh_verl()
    assert without.stdout.strip() == "[]"  # nothing else registers them: the check is needed


def test_the_installed_entry_point_registers_them_too():
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    res = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.stdout.strip() == "['slca_grpo', 'toolpo_grpo']", res.stderr[-2000:]


def test_a_missing_registration_is_caught_before_training_naming_the_module(monkeypatch):
    monkeypatch.setenv("VERL_USE_EXTERNAL_PLUGINS", "none")
    monkeypatch.delenv("VERL_USE_EXTERNAL_MODULES", raising=False)
    with pytest.raises(plugin.RegistrationError) as err:
        plugin.check_registered(["slca_grpo"])
    assert "slca_grpo" in str(err.value) and "slca_exp.engines.verl.plugin" in str(err.value)
    plugin.check_registered(["slca_grpo", "toolpo_grpo"], plugin.worker_env())
    plugin.check_registered(["grpo"])  # verl's own: nothing to check


def test_a_module_verl_cannot_import_is_named_with_its_import_error(monkeypatch):
    monkeypatch.setenv("VERL_USE_EXTERNAL_PLUGINS", "none")
    env = plugin.worker_env({"VERL_USE_EXTERNAL_MODULES": "no_such_slca_module"})
    with pytest.raises(plugin.RegistrationError) as err:
        plugin.check_registered(["slca_grpo"], env)
    assert "no_such_slca_module" in str(err.value) and "ModuleNotFoundError" in str(err.value)


def runs_of(mask_row):
    """(start, end) of every run of 1s, in order (a plain loop: independent of the estimator)."""
    runs, start = [], None
    for t, v in enumerate(mask_row.tolist() + [0]):
        if v and start is None:
            start = t
        elif not v and start is not None:
            runs.append((start, t))
            start = None
    return runs


def verl_batch(batch, length, group, seed, kl=0.05):
    """token_level_rewards, response_mask, uid and the per-rollout scores the reward side set."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(batch, length, dtype=torch.int64)
    for b in range(batch):
        pos = 0
        for _ in range(int(torch.randint(0, 4, (1,), generator=gen))):  # tool turns
            n = int(torch.randint(1, 5, (1,), generator=gen))
            mask[b, pos : pos + n] = 1
            pos += n + int(torch.randint(1, 4, (1,), generator=gen))  # tool response, mask 0
        n = int(torch.randint(0, 6, (1,), generator=gen))  # the summary (may be empty)
        mask[b, pos : min(pos + n, length)] = 1
    r_tool = torch.rand(batch, generator=gen)
    r_sum = torch.randint(1, 6, (batch,), generator=gen).float() / 5
    rewards = torch.zeros(batch, length)
    tool, summary = torch.zeros(batch), torch.zeros(batch)
    for b in range(batch):
        runs = runs_of(mask[b])
        if len(runs) >= 2:
            rewards[b, runs[-2][1] - 1] += r_tool[b]  # last token of the tool segment
        if runs:
            rewards[b, runs[-1][1] - 1] += r_sum[b]  # last token of the summary
    rewards -= kl * torch.rand(batch, length, generator=gen) * mask  # use_kl_in_reward
    for b in range(batch):
        runs = runs_of(mask[b])
        for i, (s, e) in enumerate(runs):
            target = summary if i == len(runs) - 1 else tool
            target[b] += rewards[b, s:e].sum()
    rng = np.random.default_rng(seed)
    uids = [str(uuid.UUID(int=int(i))) for i in rng.integers(0, 2**62, batch // group + 1)]
    index = np.array([uids[i // group] for i in range(batch)], dtype=object)
    return rewards, mask, index, tool, summary


def algorithm(name, **slca):
    return OmegaConf.create(
        {
            "adv_estimator": name,
            "norm_adv_by_std_in_grpo": True,
            "gamma": 1.0,
            "lam": 1.0,
            "slca": slca,
        }  # fmt: skip
    )


def run_verl(name, rewards, mask, index, config):
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask})
    data.non_tensor_batch["uid"] = index
    keys = [f"{u}_0_{i}" for i, u in enumerate(index)]  # the v1 trainer's {uid}_{session}_{i}
    out = compute_advantage_for_multi_trajectories(
        data, batch_keys=keys, adv_estimator=name, config=config
    )
    return out.batch["advantages"], out.batch["returns"]


@pytest.mark.parametrize(("batch", "length", "group"), [(8, 24, 4), (64, 40, 8)])
@pytest.mark.parametrize("seed", [0, 1])
def test_verl_runs_slca_grpo_exactly_as_ours(batch, length, group, seed):
    rewards, mask, index, tool, summary = verl_batch(batch, length, group, seed)
    config = algorithm("slca_grpo", tool_weight=0.7, summary_weight=1.3, eps=1e-6)
    adv, returns = run_verl("slca_grpo", rewards, mask, index, config)
    ours = slca_grpo_advantages(mask, index, tool, summary, tool_weight=0.7, summary_weight=1.3)
    torch.testing.assert_close(adv, ours.advantages, atol=1e-5, rtol=0)
    torch.testing.assert_close(returns, ours.advantages, atol=1e-5, rtol=0)
    assert adv.dtype == rewards.dtype


@pytest.mark.parametrize("seed", [0, 1])
def test_verl_runs_toolpo_grpo_exactly_as_ours(seed):
    rewards, mask, index, tool, summary = verl_batch(32, 30, 4, seed)
    config = algorithm("toolpo_grpo", toolpo_lambda=0.5)
    adv, _ = run_verl("toolpo_grpo", rewards, mask, index, config)
    ours = toolpo_grpo_advantages(mask, index, tool + summary, tool, toolpo_lambda=0.5)
    torch.testing.assert_close(adv, ours.advantages, atol=1e-5, rtol=0)


def test_segment_scores_are_the_masked_sums_and_params_follow_verls_config():
    rewards, mask, _, tool, summary = verl_batch(16, 20, 4, 3)
    scores = segment_scores(rewards, mask)
    torch.testing.assert_close(scores.tool, tool, atol=1e-6, rtol=0)
    torch.testing.assert_close(scores.summary, summary, atol=1e-6, rtol=0)
    torch.testing.assert_close(scores.total, tool + summary, atol=1e-6, rtol=0)
    off = OmegaConf.create({"norm_adv_by_std_in_grpo": False, "slca": {"tool_weight": 2.0}})
    assert params_from(off).norm_by_std is False and params_from(off).tool_weight == 2.0
    assert params_from(None).tool_weight == 1.0
