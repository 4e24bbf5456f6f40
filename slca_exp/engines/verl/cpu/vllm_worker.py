"""The vLLM worker extension of the ``cpu`` backend: verl's weight sync into vLLM's CPU build.

verl's vLLM rollout names a worker extension class that vLLM mixes into its worker
(``vLLMColocateWorkerExtension``); after every actor update the trainer sends its weights in
buckets (over shared memory where there is no CUDA IPC, as on a CPU) and the extension's
``update_weights_from_ipc`` loads them with ``model.load_weights``. That works once on vLLM's
CPU build and not twice: after a load, vLLM packs each linear layer's weight for its CPU GEMM
kernels and replaces ``layer.weight`` by an empty parameter without a ``weight_loader``
(``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm``), so the second load fails.

vLLM's own way to load weights into a model that has been processed is its layerwise reload
(``vllm.model_executor.model_loader.reload``, what ``GPUModelRunner.reload_weights`` runs, and
the CPU model runner inherits): the layers are put back in their checkpoint shape from the
metadata vLLM recorded when it built the model, each layer is loaded and processed again as soon
as all its weights have arrived, and what was not loaded is restored. :class:`CPUWorkerExtension`
receives verl's buckets exactly as verl does and loads them between vLLM's
``initialize_layerwise_reload`` and ``finalize_layerwise_reload``. It is named through verl's
public ``actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls``; nothing of verl's
or vLLM's is patched. LoRA adapters and quantized rollouts, which verl loads on other paths, are
refused (the ``cpu`` backend trains full float32 weights).
"""

from __future__ import annotations

from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension


class CPUWorkerExtension(vLLMColocateWorkerExtension):
    """verl's colocated worker extension whose weight sync reloads a processed CPU model."""

    def update_weights_from_ipc(
        self, peft_config: dict | None = None, base_sync_done: bool = False, use_shm: bool = False
    ) -> None:
        """Receive the trainer's weights as verl sends them and reload them layer by layer.

        Args:
            peft_config: verl's LoRA config; refused (the ``cpu`` backend has no LoRA rollout).
            base_sync_done: verl's flag that the base weights were sent once (LoRA only).
            use_shm: verl's choice of shared memory over CUDA IPC (always, on a CPU).

        Raises:
            ValueError: a LoRA or quantized rollout reached the ``cpu`` backend, which syncs
                full float32 weights only (verl loads those two on paths of their own).

        """
        import torch
        from verl.utils.vllm.vllm_quant_utils import is_quantized_model
        from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import (
            BucketedWeightReceiver,
        )
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        if peft_config or is_quantized_model(self.model_runner.vllm_config):
            raise ValueError(
                "the cpu backend's vLLM rollout syncs full unquantized weights only; LoRA and "
                "quantized rollouts need engine.verl.backend=cuda"
            )
        if self.device is None:
            self.device = torch.device("cpu")
        models = list(self._iter_all_models_with_config())
        for model, _ in models:
            initialize_layerwise_reload(model)

        def on_bucket_received(weights: list[tuple[str, torch.Tensor]], is_last: bool) -> None:
            # The layerwise reload keeps a layer's tensors until all of its weights have
            # arrived, and the receiver reuses one shared-memory buffer for every bucket: a
            # layer split across two buckets must not see the second overwrite the first.
            owned = [(name, tensor.clone()) for name, tensor in weights]
            self._update_weights(owned, peft_config=None, base_sync_done=base_sync_done)

        receiver = BucketedWeightReceiver(
            zmq_handle=self._get_zmq_handle(), device=self.device, use_shm=use_shm
        )
        receiver.receive_weights(on_bucket_received=on_bucket_received)
        for model, model_config in models:
            finalize_layerwise_reload(model, model_config)
