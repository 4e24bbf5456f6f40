"""``engine=verl``: the run, launched as verl's own PPO trainer on the job's Ray cluster.

    check(config, recipe)          every verl problem of the translated config, before anything
                                   starts (``train.prepare`` calls it, in the CLI's pre-check too)
    run(config, recipe, tracker)
      -> prepare: the translated config (``rl_config.py``) plus the trackers' run ids
         (``tracker_runs.py``); the data copies with ``extra_info.tools_kwargs``, the tool and
         agent-loop configs (``side_files.py``), and ``ppo_trainer.yaml``, all in ``<run
         folder>/verl``; the estimators and the trainer checked registered in a fresh process
         with the workers' environment
      -> [SFT stage, ``sft.py``, when ``engine.sft.enabled``: the RL stage starts from its weights]
      -> launch: ``verl.trainer.main_ppo.run_ppo`` with verl's ``TaskRunnerV1``, unmodified. On
         SLURM the Ray cluster is the one the job's tasks booted (``RAY_ADDRESS``, exported by
         ``slca_exp.launch.cluster``); elsewhere verl starts a local one (``ray_cluster.py``).

One MLflow run per recipe: verl's MLflow logger attaches to the run that holds our recipe
(``MLFLOW_RUN_ID`` in the workers' environment), and its W&B logger resumes ours (``WANDB_RUN_ID``,
``WANDB_RESUME=allow``). verl's metrics and ours (``trainer.py``) land there, at verl's step. The
SFT stage logs into a child run of it (``<run name>-sft``, tag ``slca.stage=sft``): verl logs each
trainer's whole config as parameters, and the SFT trainer's ``trainer.*`` and ``data.*`` values
differ from the RL trainer's, which one run cannot hold. The run ids are kept in ``<run
folder>/verl/run_ids.json``: a requeued job continues the same runs, and verl resumes from its
latest checkpoint (``trainer.resume_mode``).

On SLURM (``slca_exp.core.preemption``) the time-limit signal during the RL stage asks verl's
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
from slca_exp.core.checking import creating_nothing
from slca_exp.core.preemption import preemption_stops
from slca_exp.core.problems import ConfigError, Problem
from slca_exp.core.process import RunKilled, RunPreempted
from slca_exp.core.task import NodeResources
from slca_exp.engines.base import Engine
from slca_exp.engines.verl import stopping
from slca_exp.engines.verl.checks import check_sft_config, check_verl_config
from slca_exp.engines.verl.keys import CHECKPOINTS_DIR, CONFIG_FILE, ENV_VARS_KEY, SFT_CONFIG_FILE
from slca_exp.engines.verl.ray_cluster import ray_session, require_gpus
from slca_exp.engines.verl.rl_config import verl_config
from slca_exp.engines.verl.schema import VerlEngineConfig
from slca_exp.engines.verl.sft import finished_sft, run_sft
from slca_exp.engines.verl.sft_config import sft_config
from slca_exp.engines.verl.side_files import write_side_files, write_verl_config
from slca_exp.engines.verl.tracker_runs import (
    FINISHED_FILE,
    end_run,
    saved_run_ids,
    sft_env,
    tracker_env,
    write_run_ids,
)
from slca_exp.engines.verl.translation import backend_of, verl_dir

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


class VerlEngine(Engine):
    """``engine=verl``: registered in ``slca_exp.engines.ENGINES``."""

    schema = VerlEngineConfig
    checkpointable = True

    def check(self, config: RunConfig, recipe: Any = None) -> list[Problem]:  # noqa: ANN401
        """Every problem of the run's verl config (:func:`check`)."""
        return check(config, recipe)

    def describe(self, config: RunConfig, *, write: bool) -> str:
        """The translated verl configs: printed (``--cfg job``) or written (``--dry-run``).

        The RL config (``ppo_trainer.yaml`` and its side files) and, when ``engine.sft.enabled``,
        the SFT config (``sft_trainer.yaml``). verl's own validation of them is part of the
        engine's check, which every job passed before; nothing is built for them here (a
        built-in backbone's checkpoint is named as built at launch).

        Raises:
            ConfigError: a config cannot be translated.

        """
        with creating_nothing():
            cfg = verl_config(config)
            sft_cfg = sft_config(config) if config.engine.sft.enabled else None
        if not write:
            text = f"# engine=verl: the translated verl config ({CONFIG_FILE} + ours)\n"
            text += OmegaConf.to_yaml(cfg) + "\n"
            if sft_cfg is not None:
                text += f"# engine=verl: the translated verl SFT config ({SFT_CONFIG_FILE})\n"
                text += OmegaConf.to_yaml(sft_cfg) + "\n"
            return text
        folder = verl_dir(config)
        path = write_verl_config(cfg, folder / CONFIG_FILE)
        lines = [f"slca-exp: verl config checked and written to {path}"]
        lines += [f"slca-exp: and {side}" for side in write_side_files(config, cfg)]
        if sft_cfg is not None:
            path = write_verl_config(sft_cfg, folder / SFT_CONFIG_FILE)
            lines.append(f"slca-exp: verl SFT config checked and written to {path}")
        return "\n".join(lines) + "\n"

    def ray_node(self, config: RunConfig) -> NodeResources:
        """What each Ray node of a submitit job of this run declares (``slca_exp.launch``).

        The cpu backend: logical CPU slots (verl's actors each ask for one and mostly wait) and
        ``engine.verl.n_gpus_per_node`` logical GPU slots (verl's resource pools ask Ray for
        GPUs only). The cuda backend: the task's own CPUs and GPUs.
        """
        if backend_of(config) != "cpu":
            return NodeResources()
        from slca_exp.engines.verl import cpu

        return NodeResources(
            num_cpus=cpu.RAY_LOGICAL_CPUS, num_gpus=config.engine.verl.n_gpus_per_node
        )

    def resume_ids(self, config: RunConfig) -> dict[str, str] | None:
        """Tracker run ids of an unfinished earlier run of this exact config (to continue it)."""
        return saved_run_ids(verl_dir(config))

    def remember_run_ids(self, config: RunConfig, run_ids: dict[str, str]) -> None:
        """Note the tracker runs this config logs to, as soon as they are open.

        A job stopped before verl started (a time limit announced early) then continues the
        same runs when it is requeued. A ``finished`` marker of an earlier run of the same config
        is removed: this run is not finished.
        """
        if not run_ids:
            return
        folder = verl_dir(config)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / FINISHED_FILE).unlink(missing_ok=True)
        write_run_ids(folder, run_ids)

    def checkpoint(self, config: RunConfig) -> Path | None:
        """The latest verl checkpoint of the run (``global_step_<N>``); None before the first."""
        folder = verl_dir(config) / CHECKPOINTS_DIR
        try:
            step = int((folder / "latest_checkpointed_iteration.txt").read_text().strip())
        except (OSError, ValueError):
            return None
        return folder / f"global_step_{step}"

    def run(self, config: RunConfig, recipe: Any, tracker: Any) -> VerlRunResult:  # noqa: ANN401
        """Prepare the verl run, then SFT and RL through verl on the job's Ray cluster."""
        clock = _Clock()
        launch = prepare(config, recipe, tracker)
        cpu = backend_of(config) == "cpu"
        if not cpu:
            require_gpus(launch.cfg)
        with ray_session(launch.cfg) if cpu else contextlib.nullcontext():
            weights = finished_sft(config, recipe)  # a requeued job does not repeat its SFT
            if config.engine.sft.enabled and weights is None:
                env, child = sft_env(config, launch.env)
                try:
                    with clock("SFT"):
                        weights = run_sft(config, recipe, env=env)
                except (RunKilled, KeyboardInterrupt):
                    # SFT's process is gone (subprocess.run waits for it): this write is last
                    end_run(config, child, "KILLED")
                    raise
                except BaseException:
                    end_run(config, child, "FAILED")
                    raise
                end_run(config, child, "FINISHED")
            if weights is not None:  # the RL stage starts from the SFT weights
                with open_dict(launch.cfg):
                    OmegaConf.update(launch.cfg, MODEL_KEY, str(weights))
                write_verl_config(launch.cfg, launch.config_path)
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
        final = final_hf_checkpoint(launch.folder / CHECKPOINTS_DIR)
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
    command's jobs run on this host (``slca_exp.core.checking.runs_here``), the GPUs it asks for.
    """
    problems: list[Problem] = []
    if backend_of(config) == "cpu":
        from slca_exp.engines.verl import cpu

        v = config.engine.verl
        problems += cpu.problems(
            v.strategy, v.tensor_model_parallel_size, v.cpu_rollout, head_dim(config)
        )
    try:
        cfg = verl_config(config, recipe)
        problems += check_verl_config(cfg)
    except ConfigError as err:
        problems += err.problems
    else:
        from slca_exp.core.checking import runs_here

        # A command whose jobs run here: the GPUs verl would wait for must be here too.
        if runs_here() and not problems and backend_of(config) != "cpu":
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


def head_dim(config: RunConfig) -> int | None:
    """The backbone's attention head size: its arch's, or its checkpoint's ``config.json``'s.

    ``None`` when it cannot be known here (a hub backbone, a path on the cluster).
    """
    b = config.backbone
    if b.source == "builtin" and b.arch is not None:
        return b.arch.hidden_size // b.arch.num_heads
    found = Path(b.path or "") / "config.json"
    if not b.path or not found.is_file():
        return None
    try:
        hf = json.loads(found.read_text())
        return int(hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"])
    except (ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def prepare(config: RunConfig, recipe: Any, tracker: Any) -> Launch:  # noqa: ANN401
    """Translate, write and verify everything verl needs; nothing is launched.

    verl's checks of the translated configs ran before (:func:`check`, from
    ``slca_exp.train.prepare``); the trackers' run ids added here change no checked value.

    Raises:
        ConfigError: the config cannot be translated, or a split is not readable here.
        RegistrationError: verl would not find our estimators or trainer (names the module).

    """
    from slca_exp.engines.verl.plugin import check_registered

    cfg = verl_config(config, recipe)
    ids_of = getattr(tracker, "run_ids", None)
    run_ids = dict(ids_of()) if callable(ids_of) else {}
    env = tracker_env(run_ids, dict(OmegaConf.select(cfg, ENV_VARS_KEY) or {}))
    folder = verl_dir(config)
    with open_dict(cfg):
        OmegaConf.update(cfg, ENV_VARS_KEY, env, merge=False, force_add=True)
        # the same path in every job of the run: verl logs its config as the run's parameters,
        # which a resumed run must not change
        OmegaConf.update(
            cfg, stopping.STOP_KEY, str(folder / stopping.STOP_REQUEST_FILE), force_add=True
        )
    files = write_side_files(config, cfg, require_data=True)
    config_path = write_verl_config(cfg, folder / CONFIG_FILE)
    write_run_ids(folder, run_ids)
    stopping.clear(folder)  # an earlier job's stop request is not this job's
    check_registered(
        [str(cfg.algorithm.adv_estimator)],
        env,
        trainer_mode=str(OmegaConf.select(cfg, "trainer.v1.trainer_mode")),
    )
    return Launch(cfg, folder, config_path, env, [*files, config_path])


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
