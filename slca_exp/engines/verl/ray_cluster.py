"""The Ray cluster a verl run trains on: the GPUs it has, and the cpu backend's session.

    RAY_ADDRESS set (a SLURM job's cluster, booted by ``slca_exp.launch.cluster``)
      | unset: this host (verl's trainer starts a local Ray; the cpu backend starts one here)
      -> require_gpus(cfg)       fewer GPUs than ``nnodes x n_gpus_per_node``: a ConfigError
                                 now, instead of verl waiting for its placement groups forever
      -> ray_session(cfg)        (cpu backend) this process connected for both stages, with
                                 the workers' environment for every actor

``ray.init`` installs a SIGTERM handler of Ray's that exits at once; every connection made here
keeps ours (``stopping.keeping_sigterm_handler``), so that ``scancel`` still closes the runs.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator

from omegaconf import DictConfig, OmegaConf

from slca_exp.core.problems import ConfigError, Problem
from slca_exp.core.process import RunKilled
from slca_exp.engines.verl import stopping


def available_gpus() -> tuple[int, str]:
    """GPUs verl's trainer can get, and where: the Ray cluster of ``RAY_ADDRESS``, or this host."""
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        import torch

        return torch.cuda.device_count(), "this host"
    import ray

    with stopping.keeping_sigterm_handler():
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        return int(ray.cluster_resources().get("GPU", 0)), f"the Ray cluster at {address}"
    finally:
        ray.shutdown()


def require_gpus(cfg: DictConfig) -> None:
    """Fail now, naming the keys, when the cluster has fewer GPUs than the config asks for.

    verl's trainer would otherwise wait for its GPU placement groups forever.

    Raises:
        ConfigError: on ``engine.verl.n_gpus_per_node`` (and ``nnodes``).

    """
    nodes, per_node = int(cfg.trainer.nnodes), int(cfg.trainer.n_gpus_per_node)
    have, where = available_gpus()
    if have >= nodes * per_node:
        return
    raise ConfigError(
        [
            Problem(
                "engine.verl.n_gpus_per_node",
                f"the run needs engine.verl.nnodes x n_gpus_per_node = {nodes} x {per_node} GPUs "
                f"but {where} has {have}; verl's trainer would wait for them forever",
                "run it where the GPUs are (e.g. launcher=slurm_gpu_4node), or lower "
                "engine.verl.nnodes / engine.verl.n_gpus_per_node",
            )
        ]
    )


@contextlib.contextmanager
def ray_session(cfg: DictConfig) -> Iterator[str]:
    """Connect this process to the run's Ray cluster for both stages (the cpu backend).

    The cluster of ``RAY_ADDRESS`` (a SLURM job's, booted by ``slca_exp.launch.cluster`` with
    logical GPU slots), else a local one started here with ``ray_kwargs.ray_init``'s CPU and
    logical GPU slots (verl's resource pools ask Ray for GPUs only). Every actor of the run
    gets the workers' environment (verl's defaults and ``ray_kwargs.ray_init.runtime_env``,
    as verl's ``run_ppo`` would merge them); the SFT stage's driver, a separate process, joins
    the same cluster through ``RAY_ADDRESS`` with the same environment
    (:data:`slca_exp.engines.verl.cpu.sft.RUNTIME_ENV`).

    Args:
        cfg: the run's prepared verl config.

    Yields:
        The cluster's GCS address.

    """
    import ray
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    from slca_exp.engines.verl.cpu.sft import RUNTIME_ENV

    runtime_env = OmegaConf.to_container(
        OmegaConf.merge(get_ppo_ray_runtime_env(cfg), cfg.ray_kwargs.ray_init.runtime_env),
        resolve=True,
    )
    address = os.environ.get("RAY_ADDRESS")
    if address:
        print(f"slca-exp: verl runs on the Ray cluster at {address}")
        with stopping.keeping_sigterm_handler():
            ray.init(address=address, runtime_env=runtime_env, logging_level="WARNING")
    else:
        init = cfg.ray_kwargs.ray_init
        with stopping.keeping_sigterm_handler():
            ray.init(
                num_cpus=init.num_cpus,
                num_gpus=init.num_gpus,
                runtime_env=runtime_env,
                include_dashboard=False,
                logging_level="WARNING",
            )
    gcs = ray.get_runtime_context().gcs_address
    saved = {name: os.environ.get(name) for name in ("RAY_ADDRESS", RUNTIME_ENV)}
    os.environ["RAY_ADDRESS"] = gcs
    os.environ[RUNTIME_ENV] = json.dumps(runtime_env)
    killed = False
    try:
        yield gcs
    except (RunKilled, KeyboardInterrupt):
        killed = True
        raise
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        # Killed on the job's cluster: the runs are closed first (SLURM kills the task soon
        # after SIGTERM); the job's Ray bootstrap disconnects this driver afterwards.
        if not (killed and address):
            ray.shutdown()
