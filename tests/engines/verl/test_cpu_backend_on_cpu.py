"""The cpu backend's parts on their own: the verl internals it relies on, the platform, the hf
rollout server, and what ``engine.verl.backend`` puts into the translated config.

The whole backend running verl's trainers end to end is tested in ``test_verl_trains_on_cpu.py``.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from tests.skip_policy import require

require("verl", reason="needs the verl extra")

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from slca_exp.engines.verl import cpu  # noqa: E402
from slca_exp.engines.verl.cpu import internals  # noqa: E402
from slca_exp.engines.verl.engine import check  # noqa: E402
from slca_exp.engines.verl.keys import ENV_VARS_KEY  # noqa: E402
from slca_exp.engines.verl.rl_config import verl_config  # noqa: E402
from slca_exp.preflight.compose import compose_run  # noqa: E402
from slca_exp.preflight.validate import validate  # noqa: E402
from tests.engines.tiny_world import build_world  # noqa: E402


def test_the_verl_internals_the_cpu_backend_relies_on_are_unchanged():
    assert internals.check() == [], "\n".join(internals.check())


def test_a_changed_internal_is_reported_with_its_name_and_the_verl_version(monkeypatch):
    from importlib.metadata import version

    from verl.workers.rollout import base

    monkeypatch.delattr(base, "_ROLLOUT_REGISTRY")
    (found,) = internals.check()
    assert f"verl {version('verl')}" in found and "ROLLOUT_REGISTRY" in found


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_verl_worker_opens_its_process_group_with_gloo_on_the_cpu_platform():
    """verl's own call, on the platform: it finds the gloo group the platform opened."""
    code = textwrap.dedent(
        """
        import torch.distributed as dist
        from verl.plugin.platform import get_platform
        from verl.utils.device import get_device_name
        from verl.utils.distributed import initialize_global_process_group_ray

        initialize_global_process_group_ray(timeout_second=None)
        print(dist.get_backend(), get_platform().device_name, get_device_name())
        dist.destroy_process_group()
        """
    )
    env = {
        **os.environ,
        "VERL_PLATFORM": cpu.PLATFORM,
        "VERL_USE_EXTERNAL_MODULES": cpu.PLATFORM_MODULE,
        "VERL_USE_EXTERNAL_PLUGINS": "none",
        "WG_BACKEND": "ray",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
    }
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split()[-3:] == ["gloo", "cpu", "cpu"]


def test_the_cpu_platform_is_never_picked_without_being_asked_for():
    from slca_exp.engines.verl.cpu.platform import PlatformCPU

    env = os.environ.pop("VERL_PLATFORM", None)
    try:
        assert not PlatformCPU().is_platform_available(use_smi_check=True)
    finally:
        if env is not None:
            os.environ["VERL_PLATFORM"] = env


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from slca_exp.engines.verl.cpu.rollout import HFServer

    world = build_world(tmp_path_factory)
    config = SimpleNamespace(prompt_length=64, response_length=12, seed=0)
    return HFServer(config, SimpleNamespace(local_path=str(world.backbone.path)), 0), world


def _logprobs(model, prompt, response):
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None]).squeeze(1)


def test_the_server_returns_the_log_probs_of_what_it_sampled(server):
    hf, world = server
    prompt = world.backbone.tokenizer("what is the weather", add_special_tokens=False).input_ids
    out = hf.generate_now(prompt, {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True})
    assert 0 < len(out.token_ids) <= 12 and len(out.log_probs) == len(out.token_ids)
    expected = _logprobs(hf.model, prompt, out.token_ids)
    torch.testing.assert_close(torch.tensor(out.log_probs), expected, rtol=0, atol=1e-5)


def test_pushed_weights_are_the_ones_the_server_generates_with(server, tmp_path, monkeypatch):
    import asyncio

    hf, world = server
    log = tmp_path / "weights.jsonl"
    monkeypatch.setenv(cpu.ROLLOUT_LOG_ENV, str(log))
    prompt = world.backbone.tokenizer("sum the numbers", add_special_tokens=False).input_ids
    greedy = {"temperature": 0.0, "logprobs": True}
    before = hf.generate_now(prompt, greedy)
    torch.manual_seed(1)
    # every parameter once (a tied embedding is one parameter under two state-dict names)
    new = {k: v.detach() + 0.5 * torch.randn_like(v) for k, v in hf.model.named_parameters()}
    assert asyncio.run(hf.update_weights(new, global_steps=3)) == len(new)
    after = hf.generate_now(prompt, greedy)
    for name, tensor in hf.model.named_parameters():
        assert torch.equal(tensor, new[name]), name
    assert (before.token_ids, before.log_probs) != (after.token_ids, after.log_probs)
    expected = _logprobs(hf.model, prompt, after.token_ids)
    # greedy: the processed distribution is the model's own (log-prob of the argmax token)
    torch.testing.assert_close(torch.tensor(after.log_probs), expected, rtol=0, atol=1e-5)
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["global_steps"] == 3 and record["tensors"] == len(new)
    assert record["l2"] == pytest.approx(
        sum(float(t.double().pow(2).sum()) for t in new.values()) ** 0.5
    )
    assert after.extra_fields["global_steps"] == 3


def test_weights_the_model_does_not_have_are_refused(server):
    import asyncio

    hf, _ = server
    with pytest.raises(RuntimeError, match="does not have"):
        asyncio.run(hf.update_weights({"no.such.weight": torch.zeros(1)}, global_steps=0))


def _run_config(*overrides):
    return validate(compose_run(["experiment=verl_smoke", *overrides]))


def test_the_cpu_backend_translates_to_verls_vllm_rollout_gloo_and_the_platform_first():
    cfg = verl_config(_run_config("backbone.source=local", "backbone.path=/ckpt"))
    env = OmegaConf.select(cfg, ENV_VARS_KEY)
    modules = env["VERL_USE_EXTERNAL_MODULES"].split(",")
    assert modules[0] == cpu.PLATFORM_MODULE and modules[-1].endswith("verl.plugin")
    assert env["VERL_PLATFORM"] == "cpu"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == cpu.VLLM_ENV["VLLM_CPU_KVCACHE_SPACE"]
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.name, rollout.calculate_log_probs, cfg.trainer.device) == ("vllm", True, "cpu")
    # what vLLM's CPU build cannot do (sleep mode) is off; float32 as the trainer computes
    assert (rollout.enable_sleep_mode, rollout.free_cache_engine, rollout.dtype) == (
        False,
        False,
        "float32",
    )
    assert rollout.engine_kwargs.vllm.worker_extension_cls == cpu.VLLM_WORKER_EXTENSION
    assert cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "fp32"
    assert cfg.ray_kwargs.ray_init.num_gpus == 1


def test_the_worker_extension_verl_hands_vllm_is_verls_own_with_the_cpu_weight_sync():
    require("vllm", reason="needs vLLM's CPU build (make install)")
    import importlib

    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

    module, name = cpu.VLLM_WORKER_EXTENSION.rsplit(".", 1)
    extension = getattr(importlib.import_module(module), name)
    assert issubclass(extension, vLLMColocateWorkerExtension)
    assert "update_weights_from_ipc" in vars(extension)  # the one method it replaces


def test_the_head_sizes_the_check_knows_are_the_installed_vllms():
    require("vllm", reason="needs vLLM's CPU build (make install)")
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == cpu.VLLM_HEAD_SIZES


def test_the_transformers_rollout_is_one_key_away():
    cfg = verl_config(
        _run_config("engine.verl.cpu_rollout=hf", "backbone.source=local", "backbone.path=/ckpt")
    )
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.name == "hf" and "worker_extension_cls" not in rollout.engine_kwargs.vllm
    assert "VLLM_CPU_KVCACHE_SPACE" not in OmegaConf.select(cfg, ENV_VARS_KEY)


def test_a_backbone_whose_heads_vllms_cpu_attention_cannot_run_is_refused(tmp_path):
    problems = check(_run_config("backbone.arch.num_heads=4", f"tracking.root={tmp_path}"))
    (problem,) = [p for p in problems if p.key == "backbone.arch.num_heads"]
    assert "16 wide" in problem.what and "32" in problem.what
    assert "engine.verl.cpu_rollout=hf" in problem.fix
    problems = check(
        _run_config(
            "backbone.arch.num_heads=4", "engine.verl.cpu_rollout=hf", f"tracking.root={tmp_path}"
        )
    )
    assert "backbone.arch.num_heads" not in {p.key for p in problems}


def test_the_cuda_backend_is_left_as_it_was():
    cfg = verl_config(
        _run_config("engine.verl.backend=cuda", "backbone.source=local", "backbone.path=/ckpt")
    )
    env = OmegaConf.select(cfg, ENV_VARS_KEY)
    assert cpu.PLATFORM_MODULE not in env["VERL_USE_EXTERNAL_MODULES"]
    assert "VERL_PLATFORM" not in env
    assert cfg.actor_rollout_ref.rollout.name == "vllm" and cfg.trainer.device == "cuda"


def test_auto_is_the_cpu_backend_on_a_host_without_a_gpu():
    assert not torch.cuda.is_available()
    cfg = verl_config(
        _run_config("engine.verl.backend=auto", "backbone.source=local", "backbone.path=/ckpt")
    )
    assert cfg.actor_rollout_ref.rollout.name == "vllm" and cfg.trainer.device == "cpu"


def test_what_the_cpu_backend_cannot_run_is_refused_naming_the_keys(tmp_path):
    config = _run_config(
        "engine.verl.strategy=fsdp",
        "engine.verl.tensor_model_parallel_size=2",
        f"tracking.root={tmp_path}",
    )
    problems = {p.key: p for p in check(config)}
    assert "fsdp2" in problems["engine.verl.strategy"].fix
    assert "=1" in problems["engine.verl.tensor_model_parallel_size"].fix
