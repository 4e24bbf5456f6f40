"""The ``hf`` rollout backend: verl's token-in/token-out generation server, with transformers.

verl's agent loops send each turn's prompt ids to a rollout server and read back the response
ids and their log-probs (``TokenOutput``); between steps the trainer pushes its updated weights
to the server. vLLM and SGLang need a GPU; this backend answers the same calls on CPU:

    HFReplica        a verl ``RolloutReplica`` (``rollout.name=hf``): launches one
                     :class:`HFServer` Ray actor per replica, named after the replica
    HFServer         a transformers causal LM; ``generate`` samples one sequence with the
                     rollout's temperature / top-p / top-k and returns the log-probs of the
                     processed distribution (as vLLM's ``processed_logprobs``)
    HFServerAdapter  the worker-side ``BaseRollout`` living in the trainer process: verl hands it
                     the trainer's weights after every update; it gathers them and loads them
                     into the server

Every weight update is appended to the file ``SLCA_EXP_ROLLOUT_LOG`` names, when set (the run
folder's ``verl/rollout_weights.jsonl``): the step, the tensors loaded and their L2 norm, so a
run shows that the server generated with the trainer's new weights at every step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Iterable
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from slca_exp.engines.verl.cpu import ROLLOUT_LOG_ENV

logger = logging.getLogger(__name__)

SERVER_NAME = "slca_exp_hf_rollout_{rank}"
"""The Ray actor name of replica ``rank``'s server (the adapter finds it by name)."""
MIN_LOGPROB = -1e4
"""Stands for ``-inf`` (a token outside top-k / top-p) in the returned log-probs."""


class HFServer:
    """A Ray actor serving verl's ``generate`` from a transformers causal LM on CPU.

    Args:
        config: verl's rollout config (``prompt_length``, ``response_length``, ``seed``).
        model_config: verl's model config (``local_path``: the HF checkpoint).
        replica_rank: the replica it serves.

    """

    def __init__(self, config: Any, model_config: Any, replica_rank: int) -> None:  # noqa: ANN401
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self.config = config
        self.replica_rank = replica_rank
        path = getattr(model_config, "local_path", None) or model_config.path
        self.model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
        gen = self.model.generation_config
        eos = gen.eos_token_id
        self.eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.pad = gen.pad_token_id if gen.pad_token_id is not None else (self.eos or [0])[0]
        self.global_steps: int | None = None
        self.generator = torch.Generator().manual_seed(int(getattr(config, "seed", 0) or 0))
        self._lock = asyncio.Lock()

    def ready(self) -> bool:
        """Answered once the model is loaded (the replica waits for it)."""
        return True

    def max_new_tokens(self, prompt_len: int, sampling_params: dict[str, Any]) -> int:
        """The turn's token budget: asked for, capped by the response and context lengths."""
        cfg = self.config
        wanted = sampling_params.get("max_tokens") or sampling_params.get("max_new_tokens")
        wanted = min(int(wanted or cfg.response_length), int(cfg.response_length))
        room = int(cfg.prompt_length) + int(cfg.response_length) - prompt_len
        return max(1, min(wanted, room))

    def generate_now(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> TokenOutput:
        """Sample one response to ``prompt_ids`` (blocking); stops after an eos token."""
        temperature = float(sampling_params.get("temperature", 1.0) or 0.0)
        kwargs: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens(len(prompt_ids), sampling_params),
            "eos_token_id": self.eos or None,
            "pad_token_id": self.pad,
        }
        if temperature > 0:
            top_k = int(sampling_params.get("top_k", -1) or -1)
            kwargs.update(
                do_sample=True,
                temperature=temperature,
                top_p=float(sampling_params.get("top_p", 1.0) or 1.0),
                top_k=top_k if top_k > 0 else 0,
            )
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        ids = torch.tensor([prompt_ids], dtype=torch.long)
        with torch.no_grad(), _seeded(self.generator):
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                output_scores=True,
                return_dict_in_generate=True,
                **kwargs,
            )
        new = out.sequences[0, ids.shape[1] :].tolist()
        # scores are the processed logits (temperature, top-k, top-p applied)
        logps = [
            float(torch.log_softmax(score[0].float(), dim=-1)[tok])
            for score, tok in zip(out.scores, new, strict=False)
        ]
        cut = next((i + 1 for i, tok in enumerate(new) if tok in self.eos), len(new))
        new, logps = new[:cut], [max(lp, MIN_LOGPROB) for lp in logps[:cut]]
        return TokenOutput(
            token_ids=new,
            log_probs=logps if sampling_params.get("logprobs") else None,
            stop_reason="completed",
            num_preempted=0,
            extra_fields={"global_steps": self.global_steps},
        )

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,  # noqa: ANN401 - verl's signature; text only here
        video_data: Any = None,  # noqa: ANN401
        **_: Any,  # noqa: ANN401
    ) -> TokenOutput:
        """Verl's server call: one turn's response (requests are served one at a time)."""
        if image_data is not None or video_data is not None:
            raise ValueError("the hf rollout backend serves text only (image/video data given)")
        prompt = [int(t) for t in prompt_ids]
        async with self._lock:
            return await asyncio.to_thread(self.generate_now, prompt, dict(sampling_params))

    async def update_weights(self, named: dict[str, torch.Tensor], global_steps: Any) -> int:  # noqa: ANN401
        """Load the trainer's weights (every parameter, by name); returns how many tensors."""
        async with self._lock:
            missing, unexpected = self.model.load_state_dict(named, strict=False)
            if unexpected:
                raise RuntimeError(
                    f"the trainer sent weights the rollout model does not have: {unexpected[:5]}"
                )
            self.global_steps = global_steps
            norm = sum(float(t.double().pow(2).sum()) for t in named.values()) ** 0.5
        record = {
            "time": time.time(),
            "global_steps": global_steps,
            "tensors": len(named),
            "missing": sorted(missing),
            "l2": norm,
        }
        logger.info("rollout weights updated: %s", record)
        path = os.environ.get(ROLLOUT_LOG_ENV)
        if path:
            with open(path, "a") as fh:
                fh.write(json.dumps(record) + "\n")
        return len(named)

    # What verl's replica and checkpoint manager call on every server; nothing to do on CPU
    # (no KV cache to free, no GPU memory to give back to the trainer).
    async def wake_up(self) -> None:
        """Nothing to wake: the model stays loaded."""
        return None

    async def sleep(self) -> None:
        """Nothing to free: there is no GPU memory to give back."""
        return None

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        """Nothing to abort: requests are served one at a time, to the end."""
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self) -> None:
        """Generation is never paused."""
        return None

    async def clear_kv_cache(self) -> None:
        """The transformers model keeps no cache between requests."""
        return None

    async def release_kv_cache(self) -> None:
        """The transformers model keeps no cache between requests."""
        return None

    async def resume_kv_cache(self) -> None:
        """The transformers model keeps no cache between requests."""
        return None

    async def start_profile(self, **_: Any) -> None:  # noqa: ANN401
        """Profiling is verl's on GPUs; nothing here."""
        return None

    async def stop_profile(self) -> None:
        """Profiling is verl's on GPUs; nothing here."""
        return None


class _seeded:  # noqa: N801 - used as a context manager
    """Sample from ``generator``'s stream: the server's draws do not depend on other code."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def __enter__(self) -> None:
        self.saved = torch.get_rng_state()
        torch.set_rng_state(self.generator.get_state())

    def __exit__(self, *_: object) -> None:
        self.generator.set_state(torch.get_rng_state())
        torch.set_rng_state(self.saved)


class HFReplica(RolloutReplica):
    """One :class:`HFServer` per replica; its weights come from the colocated trainer."""

    async def launch_servers(self) -> None:
        """Start the replica's server actor and wait until its model is loaded."""
        name = SERVER_NAME.format(rank=self.replica_rank)
        server = (
            ray.remote(HFServer)
            .options(name=name, num_cpus=0, max_concurrency=self.max_concurrency)
            .remote(
                config=self.config, model_config=self.model_config, replica_rank=self.replica_rank
            )
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = name  # a key for verl's load balancer: there is no HTTP server


class HFServerAdapter(BaseRollout):
    """The trainer-side end of the ``hf`` backend: pushes the trainer's weights to the server."""

    def __init__(
        self,
        config: Any,  # noqa: ANN401
        model_config: Any,  # noqa: ANN401
        device_mesh: Any,  # noqa: ANN401
        replica_rank: int = -1,
    ) -> None:
        super().__init__(config, model_config, device_mesh)
        c = self.config
        world = c.tensor_model_parallel_size * c.data_parallel_size * c.pipeline_model_parallel_size
        rank = int(os.environ.get("RANK", "0"))
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.is_leader = rank % world == 0
        self._server: Any = None

    def _handle(self) -> Any:  # noqa: ANN401
        if self._server is None:
            self._server = ray.get_actor(SERVER_NAME.format(rank=self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        """Nothing to resume: the server keeps its weights and has no KV cache to rebuild."""
        return None

    async def release(self) -> None:
        """Nothing to release: the trainer and the server do not share a GPU."""
        return None

    async def update_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        wire_format: str = "named_tensors",
        **kwargs: Any,  # noqa: ANN401
    ) -> None:
        """Gather every (sharded) tensor and load them into the replica's server."""
        if wire_format != "named_tensors":
            raise ValueError(
                f"the hf rollout backend takes full named tensors, not {wire_format!r} "
                "(leave actor_rollout_ref.rollout.checkpoint_engine at its default)"
            )
        named = {}
        for name, tensor in weights:  # every rank iterates: gathering a shard is collective
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            if self.is_leader:
                named[name] = full.detach().to("cpu", torch.float32).clone()
        if self.is_leader:
            await self._handle().update_weights.remote(named, kwargs.get("global_steps"))
