"""``engine=verl``: the run, launched as verl's own PPO trainer on the job's Ray cluster.

    check(config, recipe)          every verl problem of the translated config, before anything
                                   starts (``train.prepare`` calls it, in the CLI's pre-check too)
    run(config, recipe, tracker)
      -> prepare: the translated config (``config.py``) plus the trackers' run ids; the data
         copies with ``extra_info.tools_kwargs``, the tool and agent-loop configs, and
         ``ppo_trainer.yaml``, all in ``<run folder>/verl``; the estimators and the trainer
         checked registered in a fresh process with the workers' environment
      -> [SFT stage, ``sft.py``, when ``engine.sft.enabled``: the RL stage starts from its weights]
      -> launch: ``verl.trainer.main_ppo.run_ppo`` with verl's ``TaskRunnerV1``, unmodified. On
         SLURM the Ray cluster is the one the job's tasks booted (``RAY_ADDRESS``, exported by
         ``slca_exp.launch.cluster``); elsewhere verl starts a local one.

One MLflow run per recipe: verl's MLflow logger attaches to the run that holds our recipe
(``MLFLOW_RUN_ID`` in the workers' environment), and its W&B logger resumes ours (``WANDB_RUN_ID``,
``WANDB_RESUME=allow``). verl's metrics and ours (``trainer.py``) land there, at verl's step. The
SFT stage logs into a child run of it (``<run name>-sft``, tag ``slca.stage=sft``): verl logs each
trainer's whole config as parameters, and the SFT trainer's ``trainer.*`` and ``data.*`` values
differ from the RL trainer's, which one run cannot hold. The run ids are kept in ``<run
folder>/verl/run_ids.json``: a requeued job continues the same runs, and verl resumes from its
latest checkpoint (``trainer.resume_mode``).

On SLURM (``slca_exp.launch.requeue``) the time-limit signal during the RL stage asks verl's
trainer to stop at its next step boundary, after a verl checkpoint of every step it logged
(``stopping.py``); the job then requeues, and the requeued job resumes from that checkpoint
into the same MLflow run at the next step. A signal during the SFT stage stops it at once: the
requeued job runs the short SFT stage again in a new child run (the stopped one is closed
KILLED). SIGTERM (``scancel``) stops everything at once and the runs are closed KILLED.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from slca_exp.config.schema import RunConfig
from slca_exp.config.validate import ConfigError, Problem
from slca_exp.engines.verl import config as translate
from slca_exp.engines.verl import stopping
from slca_exp.engines.verl.checks import check_verl_config
from slca_exp.launch.requeue import preemption_stops
from slca_exp.launch.task import NodeResources
from slca_exp.tracking.base import RunKilled, RunPreempted

RUN_IDS_FILE = "run_ids.json"
"""``<run folder>/verl/run_ids.json``: the tracker runs an unfinished verl run logs to."""
FINISHED_FILE = "finished"
"""``<run folder>/verl/finished``: written when verl's trainer returned."""
MODEL_KEY = "actor_rollout_ref.model.path"


@dataclass
class VerlRunResult:
    """What a verl run returns (and Hydra records as the job's return value).

    Attributes:
        run_dir: ``<run folder>/verl``: the configs, data copies and verl's checkpoints.
        config_path: the ``ppo_trainer.yaml`` verl ran.
        model_path: the weights the RL stage started from (the SFT checkpoint or the backbone).
        files: every file written for verl.

    """

    run_dir: str
    config_path: str
    model_path: str
    files: list[str] = field(default_factory=list)


@dataclass
class Launch:
    """A prepared verl run: its config (with the trackers' ids) and what was written for it."""

    cfg: DictConfig
    folder: Path
    config_path: Path
    env: dict[str, str]
    files: list[Path]


class VerlEngine:
    """``engine=verl``: registered in ``slca_exp.engines.ENGINES``."""

    def check(self, config: RunConfig, recipe: Any = None) -> list[Problem]:  # noqa: ANN401
        """Every problem of the run's verl config (:func:`check`)."""
        return check(config, recipe)

    def ray_node(self, config: RunConfig) -> NodeResources:
        """What each Ray node of a submitit job of this run declares (``slca_exp.launch``).

        The cpu backend: logical CPU slots (verl's actors each ask for one and mostly wait) and
        ``engine.verl.n_gpus_per_node`` logical GPU slots (verl's resource pools ask Ray for
        GPUs only). The cuda backend: the task's own CPUs and GPUs.
        """
        if translate.backend_of(config) != "cpu":
            return NodeResources()
        from slca_exp.engines.verl import cpu

        return NodeResources(
            num_cpus=cpu.RAY_LOGICAL_CPUS, num_gpus=config.engine.verl.n_gpus_per_node
        )

    def resume_ids(self, config: RunConfig) -> dict[str, str] | None:
        """Tracker run ids of an unfinished earlier run of this exact config (to continue it)."""
        folder = translate.verl_dir(config)
        path = folder / RUN_IDS_FILE
        if not path.is_file() or (folder / FINISHED_FILE).exists():
            return None
        try:
            ids = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return {str(k): str(v) for k, v in ids.items()} if isinstance(ids, dict) else None

    def remember_run_ids(self, config: RunConfig, run_ids: dict[str, str]) -> None:
        """Note the tracker runs this config logs to, as soon as they are open.

        A job stopped before verl started (a time limit announced early) then continues the
        same runs when it is requeued. A ``finished`` marker of an earlier run of the same config
        is removed: this run is not finished.
        """
        if not run_ids:
            return
        folder = translate.verl_dir(config)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / FINISHED_FILE).unlink(missing_ok=True)
        _write_run_ids(folder, run_ids)

    def checkpoint(self, config: RunConfig) -> Path | None:
        """The latest verl checkpoint of the run (``global_step_<N>``); None before the first."""
        folder = translate.verl_dir(config) / "checkpoints"
        try:
            step = int((folder / "latest_checkpointed_iteration.txt").read_text().strip())
        except (OSError, ValueError):
            return None
        return folder / f"global_step_{step}"

    def run(self, config: RunConfig, recipe: Any, tracker: Any) -> VerlRunResult:  # noqa: ANN401
        """Prepare the verl run, then SFT and RL through verl on the job's Ray cluster."""
        from slca_exp.engines.verl.sft import finished_sft, run_sft

        clock = _Clock()
        launch = prepare(config, recipe, tracker)
        cpu = translate.backend_of(config) == "cpu"
        if not cpu:
            require_gpus(launch.cfg)
        with ray_session(launch) if cpu else contextlib.nullcontext():
            weights = finished_sft(config, recipe)  # a requeued job does not repeat its SFT
            if config.engine.sft.enabled and weights is None:
                env, child = sft_env(config, launch.env)
                try:
                    with clock("SFT"):
                        weights = run_sft(config, recipe, env=env)
                except (RunKilled, KeyboardInterrupt):
                    # SFT's process is gone (subprocess.run waits for it): this write is last
                    _end_run(config, child, "KILLED")
                    raise
                except BaseException:
                    _end_run(config, child, "FAILED")
                    raise
                _end_run(config, child, "FINISHED")
            if weights is not None:  # the RL stage starts from the SFT weights
                with open_dict(launch.cfg):
                    OmegaConf.update(launch.cfg, MODEL_KEY, str(weights))
                translate.write_verl_config(launch.cfg, launch.config_path)
            model_path = str(OmegaConf.select(launch.cfg, MODEL_KEY))
            # From here the time-limit signal asks the trainer to stop after a checkpoint; a
            # signal once it has finished changes nothing.
            request = launch.folder / stopping.STOP_REQUEST_FILE
            with clock("RL"), preemption_stops(lambda: request.write_text("")):
                stopped = run_trainer(launch)
                if stopped is None:
                    (launch.folder / FINISHED_FILE).write_text("")
        if stopped is not None:
            print(
                f"slca-exp: verl checkpointed at RL step {stopped.step} in "
                f"{stopped.checkpoint or '(no step to save)'}; the requeued job resumes there "
                f"(after {clock.report()})",
                file=sys.stderr,
                flush=True,
            )
            raise RunPreempted(f"verl's trainer stopped after RL step {stopped.step}")
        final = final_hf_checkpoint(launch.folder / "checkpoints")
        if final is not None:  # the run's logged model
            tracker.log_model(final[0], name="policy", step=final[1])
        print(f"slca-exp: verl run took {clock.report()}", flush=True)
        return VerlRunResult(
            run_dir=str(launch.folder),
            config_path=str(launch.config_path),
            model_path=model_path,
            files=[str(p) for p in launch.files],
        )


def final_hf_checkpoint(checkpoints: Path) -> tuple[Path, int] | None:
    """The last actor checkpoint verl wrote in HF format, and its step (None: there is none).

    verl records its last step in ``latest_checkpointed_iteration.txt`` and writes the HF
    weights, config and tokenizer into ``global_step_<N>/actor/huggingface`` when ``hf_model``
    is among ``actor_rollout_ref.actor.checkpoint.save_contents``.
    """
    try:
        step = int((checkpoints / "latest_checkpointed_iteration.txt").read_text().strip())
    except (OSError, ValueError):
        return None
    folder = checkpoints / f"global_step_{step}" / "actor" / "huggingface"
    return (folder, step) if (folder / "config.json").is_file() else None


class _Clock:
    """Wall time of the run and of its stages, for the closing line."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.stages: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.stages[stage] = time.perf_counter() - begin

    def report(self) -> str:
        """``4m12s (SFT 2m50s, RL 1m10s, set-up 12s)``."""
        total = time.perf_counter() - self.start
        parts = [f"{name} {_minutes(s)}" for name, s in self.stages.items()]
        parts.append(f"set-up {_minutes(total - sum(self.stages.values()))}")
        return f"{_minutes(total)} ({', '.join(parts)})"


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"


def check(config: RunConfig, recipe: Any = None) -> list[Problem]:  # noqa: ANN401
    """Every problem of the run's verl configs, RL and (when on) SFT; [] when valid.

    verl's own checks included (``check_verl_config``, ``check_sft_config``), and, when a
    command's jobs run on this host (``slca_exp.preflight.runs_here``), the GPUs it asks for.
    """
    from slca_exp.engines.verl.sft import check_sft_config, sft_config

    problems: list[Problem] = []
    if translate.backend_of(config) == "cpu":
        from slca_exp.engines.verl import cpu

        v = config.engine.verl
        problems += cpu.problems(v.strategy, v.tensor_model_parallel_size)
    try:
        cfg = translate.verl_config(config, recipe)
        problems += check_verl_config(cfg)
    except ConfigError as err:
        problems += err.problems
    else:
        from slca_exp.preflight import runs_here

        # A command whose jobs run here: the GPUs verl would wait for must be here too.
        if runs_here() and not problems and translate.backend_of(config) != "cpu":
            try:
                require_gpus(cfg)
            except ConfigError as err:
                problems += err.problems
    if config.engine.sft.enabled:
        try:
            problems += check_sft_config(sft_config(config, recipe))
        except ConfigError as err:
            problems += err.problems
    return problems


def sft_env(config: RunConfig, env: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """The SFT stage's variables: the RL stage's, with a child MLflow run of the recipe's run.

    Returns:
        ``(variables, the child run's id or None)``; W&B gets a run of its own (no resume).

    """
    child_env = {
        k: v for k, v in env.items() if k not in ("MLFLOW_RUN_ID", "WANDB_RUN_ID", "WANDB_RESUME")
    }
    parent = env.get("MLFLOW_RUN_ID")
    if not parent:
        return child_env, None
    from mlflow.tracking import MlflowClient

    from slca_exp.tracking.mlflow import store_uri

    client = MlflowClient(store_uri(config.tracking))
    recipe_run = client.get_run(parent)
    name = f"{recipe_run.info.run_name or parent}-sft"
    tags = {"mlflow.parentRunId": parent, "slca.stage": "sft"}
    child = client.create_run(recipe_run.info.experiment_id, run_name=name, tags=tags)
    child_env["MLFLOW_RUN_ID"] = child.info.run_id
    return child_env, child.info.run_id


def _end_run(config: RunConfig, run_id: str | None, status: str) -> None:
    """Close an MLflow run we opened (``FAILED`` when the stage failed)."""
    if run_id is None:
        return
    from mlflow.tracking import MlflowClient

    from slca_exp.tracking.mlflow import store_uri

    MlflowClient(store_uri(config.tracking)).set_terminated(run_id, status)


def tracker_env(run_ids: dict[str, str], base: dict[str, str] | None = None) -> dict[str, str]:
    """Variables that make verl's loggers write into our tracker runs.

    Args:
        run_ids: backend -> run id (``tracker.run_ids()``).
        base: the workers' variables so far (kept, as text: an override such as
            ``ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS=1`` reads as a number).

    """
    env = {str(name): str(value) for name, value in (base or {}).items()}
    if "mlflow" in run_ids:
        env["MLFLOW_RUN_ID"] = run_ids["mlflow"]
    if "wandb" in run_ids:
        env["WANDB_RUN_ID"] = run_ids["wandb"]
        env["WANDB_RESUME"] = "allow"
    return env


def prepare(config: RunConfig, recipe: Any, tracker: Any) -> Launch:  # noqa: ANN401
    """Translate, write and verify everything verl needs; nothing is launched.

    verl's checks of the translated configs ran before (:func:`check`, from
    ``slca_exp.train.prepare``); the trackers' run ids added here change no checked value.

    Raises:
        ConfigError: the config cannot be translated, or a split is not readable here.
        RegistrationError: verl would not find our estimators or trainer (names the module).

    """
    from slca_exp.engines.verl.plugin import check_registered

    cfg = translate.verl_config(config, recipe)
    ids_of = getattr(tracker, "run_ids", None)
    run_ids = dict(ids_of()) if callable(ids_of) else {}
    env_key = translate.ENV_VARS_KEY
    env = tracker_env(run_ids, dict(OmegaConf.select(cfg, env_key) or {}))
    folder = translate.verl_dir(config)
    with open_dict(cfg):
        OmegaConf.update(cfg, env_key, env, merge=False, force_add=True)
        # the same path in every job of the run: verl logs its config as the run's parameters,
        # which a resumed run must not change
        OmegaConf.update(
            cfg, stopping.STOP_KEY, str(folder / stopping.STOP_REQUEST_FILE), force_add=True
        )
    files = translate.write_side_files(config, cfg, require_data=True)
    config_path = translate.write_verl_config(cfg, folder / translate.CONFIG_FILE)
    _write_run_ids(folder, run_ids)
    stopping.clear(folder)  # an earlier job's stop request is not this job's
    check_registered(
        [str(cfg.algorithm.adv_estimator)],
        env,
        trainer_mode=str(OmegaConf.select(cfg, "trainer.v1.trainer_mode")),
    )
    return Launch(cfg, folder, config_path, env, [*files, config_path])


def _write_run_ids(folder: Path, run_ids: dict[str, str]) -> None:
    """``run_ids.json``, written atomically (a job may be stopped at any moment)."""
    tmp = folder / (RUN_IDS_FILE + ".tmp")
    tmp.write_text(json.dumps(run_ids, sort_keys=True))
    os.replace(tmp, folder / RUN_IDS_FILE)


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
def ray_session(launch: Launch) -> Iterator[str]:
    """Connect this process to the run's Ray cluster for both stages (the cpu backend).

    The cluster of ``RAY_ADDRESS`` (a SLURM job's, booted by ``slca_exp.launch.cluster`` with
    logical GPU slots), else a local one started here with ``ray_kwargs.ray_init``'s CPU and
    logical GPU slots (verl's resource pools ask Ray for GPUs only). Every actor of the run
    gets the workers' environment (verl's defaults and ``ray_kwargs.ray_init.runtime_env``,
    as verl's ``run_ppo`` would merge them); the SFT stage's driver, a separate process, joins
    the same cluster through ``RAY_ADDRESS`` with the same environment
    (:data:`slca_exp.engines.verl.cpu.sft.RUNTIME_ENV`).

    Yields:
        The cluster's GCS address.

    """
    import ray
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    from slca_exp.engines.verl.cpu.sft import RUNTIME_ENV

    cfg = launch.cfg
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


def run_trainer(launch: Launch) -> stopping.Stopped | None:
    """Run verl's PPO trainer (``run_ppo`` + ``TaskRunnerV1``) with the prepared config.

    Connects to the Ray cluster ``RAY_ADDRESS`` names (the SLURM job's), or lets verl start a
    local one, which is shut down afterwards.

    Returns:
        Where the trainer stopped when it was asked to stop for a requeue before its last
        step (``stopping.py``); ``None`` when it trained to the end.

    """
    import ray
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.utils.device import auto_set_device

    cfg = launch.cfg
    if OmegaConf.select(cfg, "trainer.device") != "cpu":  # the cpu backend says so already
        auto_set_device(cfg)
    ours = not ray.is_initialized()
    if os.environ.get("RAY_ADDRESS"):
        print(f"slca-exp: verl runs on the Ray cluster at {os.environ['RAY_ADDRESS']}")
    try:
        stopping.answering_signals(run_ppo, cfg, task_runner_class=TaskRunnerV1)
    finally:
        if ours and ray.is_initialized():
            ray.shutdown()
    return stopping.Stopped.read(launch.folder)
