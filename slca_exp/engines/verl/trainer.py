"""slca-exp's verl trainer: verl's synchronous PPO trainer plus our per-segment metrics.

verl 0.9.x picks its trainer class by name from a registry (``trainer.v1.trainer_mode``,
``verl.trainer.ppo.v1.register_trainer``); its own TaskRunner looks the name up in the process
where training runs. :data:`TRAINER_MODE` names :class:`SLCATrainer`, registered when
:mod:`slca_exp.engines.verl.plugin` is imported there (``VERL_USE_EXTERNAL_MODULES``), and the
translated config selects it for every estimator. Nothing of verl is patched: the class
overrides one step of the training loop, ``_compute_advantage``, and calls verl's own:

    TransferQueue --(extra_fields: reward_extra_info per rollout, in the batch's row order)-->
      reported (tool, summary, weighted total),
      no_summary flags (mask_rule=corrected),
      absent summaries (judge failures)       ->  segment_call(...)  ->  verl's advantage step
                                                   (our estimator adapter reads them and
                                                    leaves its per-segment stats)
      verl's own estimator (grpo): its advantages read back -> the same per-segment stats
      reward_extra_info rows  ->  reward/* and judge/* metrics
      the simulator's counts (tools.py) -> simulator/requests, simulator/failures
      -> a step where every judge or simulator request failed: ``services/outage.py`` warns,
         tags the run and, under ``reward.judge_failure=stop``, stops the run
    -> metrics (our names, ``slca_exp.core.names``) logged by verl's tracker at that step,
       next to verl's own
    -> with ``engine.verl.dump_batches``: the step's batch as the actor receives it
       (advantages, masks, scores; :func:`dump_batch`) in ``<run folder>/verl/batches``.

With ``engine.rl.grad_cos`` the actor's worker also measures the gradient conflict at every
update (``grad_cos.py``), and the actor's values are logged under our ``train/*`` names.

It also stops for a requeue and resumes without logging a step twice (``stopping.py``): verl's
step hooks check the driver's stop request (``on_step_end`` saves a verl checkpoint of the
step, ``on_step_begin`` of the next one stops once a checkpoint covers every logged step), a
resumed trainer does not log again the steps its MLflow run holds, and the run verl's logger
attached to is ended with the status the driver gives it (never FINISHED by a killed job).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.v1 import PPOTrainerSync, get_trainer_cls, register_trainer

from slca_exp.core import names
from slca_exp.engines.verl import grad_cos, reward_infos
from slca_exp.engines.verl.estimators import NAMES, advantage_stats, mask_rule, segment_call
from slca_exp.engines.verl.keys import OUR_KEY
from slca_exp.engines.verl.rewards import batch_infos
from slca_exp.engines.verl.rollouts import ActiveRunLog, ValidationCapture, batch_view
from slca_exp.engines.verl.stopping import (
    STOP_KEY,
    SkipLogged,
    StopForRequeue,
    Stopped,
    end_recipe_run,
    logged_through,
)
from slca_exp.engines.verl.tools import simulator_metrics
from slca_exp.rollouts.batch import logged_rollouts
from slca_exp.rollouts.drift import drift_metrics
from slca_exp.rollouts.select import due
from slca_exp.services.outage import ServiceWatch
from slca_exp.tracking.rollout_traces import TraceSources

TRAINER_MODE = "slca_sync"
"""``trainer.v1.trainer_mode`` of :class:`SLCATrainer`."""
DUMP_KEY = f"{OUR_KEY}.dump_dir"
ROLLOUTS_KEY = f"{OUR_KEY}.rollouts"
"""``tracking.rollouts`` and the run's tags for its records (``rl_config.rollout_section``)."""
"""Where each step's batch is written (:func:`dump_batch`); set by ``engine.verl.dump_batches``."""


@register_trainer(TRAINER_MODE)
class SLCATrainer(PPOTrainerSync):
    """verl's synchronous trainer; each step also logs slca-exp's per-segment metrics.

    It also stops for a requeue at a step boundary when the driver asks (``stopping.py``).
    """

    _checkpointed = 0
    """The last step a verl checkpoint covers (saved, or resumed from); 0: none."""
    _history_checked = False

    # -- stopping for a requeue, resuming ---------------------------------------------------

    def fit(self, agent_loop_manager: Any) -> None:  # noqa: ANN401 - verl's AgentLoopManager
        """Train with verl's loop; return early, after a checkpoint, when asked to stop."""
        status = "FAILED"
        try:
            super().fit(agent_loop_manager)
            status = "FINISHED"
        except StopForRequeue:
            status = "KILLED"  # what the driver records too: the job requeues
            self._shutdown_dump_executor()
            step = self.global_steps - 1  # the last step finished and logged
            where = self._checkpoint_dir(self._checkpointed) if self._checkpointed else None
            Stopped(step=step, checkpoint=where).write(Path(self._stop_request()).parent)
            print(f"slca-exp: verl's trainer stopped for a requeue after RL step {step}",
                  flush=True)  # fmt: skip
        except (SystemExit, KeyboardInterrupt):  # SIGTERM in a Ray worker exits the process
            status = "KILLED"
            raise
        finally:
            log = getattr(self, "_rollouts", None)
            if log is not None:
                log.flush()
            end_recipe_run(status)

    def on_step_begin(self) -> None:
        """Stop here, before the step, if asked to and every step done is checkpointed."""
        if self._stop_asked() and self._checkpointed >= self.global_steps - 1:
            raise StopForRequeue
        super().on_step_begin()

    def on_step_end(self) -> None:
        """Push the weights as verl does; then, if asked to stop, checkpoint this step."""
        super().on_step_end()
        last = self.global_steps >= self.total_training_steps  # it ends here anyway
        if self._stop_asked() and self._checkpointed < self.global_steps and not last:
            self._save_checkpoint()  # verl's own, as save_freq would (weights, optimizer, data)

    def _save_checkpoint(self) -> None:
        super()._save_checkpoint()
        self._checkpointed = self.global_steps

    def _load_checkpoint(self) -> None:
        super()._load_checkpoint()
        self._checkpointed = self.global_steps
        if self.global_steps > 0:
            print(
                f"slca-exp: verl resumed from its checkpoint at RL step {self.global_steps} "
                f"({self._checkpoint_dir(self.global_steps)})",
                flush=True,
            )

    def on_train_begin(self) -> None:
        """Drop the steps the run already holds before the first step is logged."""
        self._skip_logged_steps()
        super().on_train_begin()

    def on_validate_begin(self) -> None:
        """The same before the first validation (verl logs it at the resumed step)."""
        self._skip_logged_steps()
        super().on_validate_begin()

    def _skip_logged_steps(self) -> None:
        """Wrap verl's logger once, when its MLflow run already holds steps (``SkipLogged``)."""
        if self._history_checked:
            return
        self._history_checked = True
        mlflow = sys.modules.get("mlflow")
        run = mlflow.active_run() if mlflow is not None else None
        through = logged_through(run.info.run_id) if run is not None else 0
        if through > 0:  # a resumed run: steps 1..through are final
            self.logger = SkipLogged(self.logger, through)
        if run is not None and through < self._checkpointed:
            # verl saves a step before it logs it: a job killed in between left a checkpoint
            # of steps whose metrics no job will log
            print(
                f"slca-exp: RL steps {through + 1}..{self._checkpointed} are in verl's "
                "checkpoint but not in the MLflow run (a job was killed between saving and "
                "logging them); their metrics are lost",
                flush=True,
            )

    def _stop_request(self) -> str:
        return str(OmegaConf.select(self.config, STOP_KEY, default="") or "")

    def _stop_asked(self) -> bool:
        request = self._stop_request()
        return bool(request) and Path(request).exists()

    def _checkpoint_dir(self, step: int) -> str:
        return str(Path(self.config.trainer.default_local_dir) / f"global_step_{step}")

    # -- the actor: verl's, measuring the gradient conflict with engine.rl.grad_cos -----------

    def _init_resource_pool_mgr(self) -> None:
        super()._init_resource_pool_mgr()
        if grad_cos.enabled(self.config):
            grad_cos.use_measuring_worker(self.role_worker_mapping)

    def _update_actor(self, batch: Any, metrics: dict) -> Any:  # noqa: ANN401 - KVBatchMeta
        batch = super()._update_actor(batch, metrics=metrics)
        metrics.update(grad_cos.our_metrics(metrics))
        return batch

    # -- the advantage step -----------------------------------------------------------------

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:  # noqa: ANN401 - KVBatchMeta
        """The advantage step of verl, with the reward side's facts in and our metrics out."""
        import transfer_queue as tq

        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"]
        )
        fields = data.pop("extra_fields").tolist()
        infos = batch_infos(fields)
        corrected = mask_rule(self.config.algorithm) == "corrected"
        no_summary = reward_infos.no_summary_rows(infos) if corrected else None
        facts = (
            no_summary,
            reward_infos.absent_summary_rows(infos),
            reward_infos.reported_scores(infos),
        )
        with segment_call(*facts, absent_tool=reward_infos.absent_tool_rows(infos)) as call:
            batch = super()._compute_advantage(batch, metrics=metrics)
        stats = call.stats
        if self.config.algorithm.adv_estimator not in NAMES:  # verl's own: read its result back
            stats = self._advantage_stats(batch, no_summary)
        ours = {**reward_infos.segment_metrics(infos, stats), **simulator_metrics(fields)}
        metrics.update(ours)
        self._service_watch().observe(ours, self.global_steps)
        folder = OmegaConf.select(self.config, DUMP_KEY, default=None)
        if folder:
            rollout_lp = bool(self.config.actor_rollout_ref.rollout.calculate_log_probs)
            path = Path(folder) / f"step_{self.global_steps}.pt"
            dump_batch(batch, infos, path, rollout_log_probs=rollout_lp)
        settings = self._rollout_settings()
        if settings and due(self.global_steps, int(settings["every"])):
            started = time.perf_counter()
            drift = self._log_rollouts("train", [batch], no_summary, int(settings["per_step"]))
            metrics[names.PERF_ROLLOUT_LOG_S] = time.perf_counter() - started
            metrics.update(drift)
        return batch

    # -- logged rollouts (tracking.rollouts) --------------------------------------------------

    def _validate(self) -> dict[str, float]:
        """Verl's validation, plus our ``val/*`` metrics; its rollouts are logged after it.

        Each validation batch is read on its way out of the replay buffer: its rewards (for
        :func:`validation_metrics`) and, when ``tracking.rollouts`` asks, its rollouts.
        """
        settings = self._rollout_settings()
        logged = bool(settings and int(settings["every"]) and int(settings["val"]))
        corrected = mask_rule(self.config.algorithm) == "corrected"
        infos: list[Mapping[str, Any]] = []

        def read(batch: Any) -> Any:  # noqa: ANN401 - a KVBatchMeta
            found = self._infos(batch)  # one read of the batch's reward info serves both
            infos.extend(found)
            if not logged:
                return None
            no_summary = reward_infos.no_summary_rows(found) if corrected else None
            return batch_view(
                batch, self.tokenizer, split="val", no_summary=no_summary, advantages=False
            )

        buffer = self.replay_buffer
        capture = ValidationCapture(buffer, read)
        self.replay_buffer = capture
        try:
            result = super()._validate()
        finally:
            self.replay_buffer = buffer
        if capture.failed is not None:
            self._rollout_log().warn_once(capture.failed)
        reward = (OmegaConf.select(self.config, OUR_KEY, default=None) or {}).get("reward") or {}
        ours = reward_infos.validation_metrics(
            infos,
            process_weight=float(reward.get("process_weight", 1.0)),
            summary_weight=float(reward.get("summary_weight", 1.0)),
        )
        if logged:
            ours |= self._log_views(
                "val", [v for v in capture.views if v is not None], int(settings["val"])
            )
        return {**result, **ours}

    def _infos(self, batch: Any) -> list[Mapping[str, Any]]:  # noqa: ANN401 - a KVBatchMeta
        import transfer_queue as tq

        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"]
        )
        return batch_infos(data.pop("extra_fields").tolist())

    def _log_rollouts(
        self,
        split: str,
        batches: list,
        no_summary: Any,  # noqa: ANN401
        per_step: int,
    ) -> dict[str, float]:
        """Log a training step's picked rollouts (the batch the actor receives).

        Returns their token drift metric (``rollouts.drift.drift_metrics``; {}: none checked).
        """
        try:
            views = [
                batch_view(b, self.tokenizer, split=split, no_summary=no_summary, advantages=True)
                for b in batches
            ]
        except Exception as err:  # noqa: BLE001 - a view on the run must not fail it
            self._rollout_log().warn_once(err)
            return {}
        return self._log_views(split, views, per_step)

    def _log_views(self, split: str, views: list, per_step: int) -> dict[str, float]:
        settings = self._rollout_settings()
        log = self._rollout_log()
        records = []
        try:
            for view in views:
                left = per_step - len(records)
                if left <= 0:
                    break
                records += logged_rollouts(
                    view,
                    per_step=left,
                    decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False),
                    run=dict(settings["run"]),
                    step=self.global_steps,
                    split=split,
                    tokenizer=self.tokenizer,
                )
        except Exception as err:  # noqa: BLE001
            log.warn_once(err)
            return {}
        log.log(records, self.global_steps, split)
        return drift_metrics(records, split)

    def _rollout_settings(self) -> Any:  # noqa: ANN401
        return OmegaConf.select(self.config, ROLLOUTS_KEY, default=None)

    def _rollout_log(self) -> ActiveRunLog:
        log = getattr(self, "_rollouts", None)
        if log is None:
            settings = self._rollout_settings()
            sources = TraceSources(**dict(settings["sources"])) if settings else TraceSources()
            log = self._rollouts = ActiveRunLog(sources, bool(settings and settings["html"]))
        return log

    def _service_watch(self) -> ServiceWatch:
        """The run's outage watch; outages tag the MLflow run verl's logger attached to."""
        watch = getattr(self, "_watch", None)
        if watch is None:
            policy = OmegaConf.select(self.config, f"{OUR_KEY}.reward.judge_failure")
            watch = self._watch = ServiceWatch(str(policy or "absent"), tag=_tag_active_run)
        return watch

    def _advantage_stats(self, batch: Any, no_summary: Any) -> dict[str, float]:  # noqa: ANN401
        """Our per-segment metrics of the advantages verl's own estimator wrote."""
        import transfer_queue as tq

        fields = ["advantages", "response_mask", "uid"]
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=fields
        )
        padded = data.to_padded_tensor()
        uid = np.array(padded.pop("uid").tolist(), dtype=object)
        return advantage_stats(padded["advantages"], padded["response_mask"], uid, no_summary)


def _tag_active_run(key: str, value: str) -> None:
    """Tag the MLflow run verl's logger writes to in this process (nothing without one)."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None and mlflow.active_run() is not None:
        mlflow.set_tag(key, value)


def dump_batch(
    batch: Any,  # noqa: ANN401
    infos: Sequence[Mapping[str, Any]],
    path: Path,
    *,
    rollout_log_probs: bool = False,
) -> Path:
    """Write what the actor will train on at this step, as the trainer holds it.

    ``torch.save`` of a dict: ``advantages``, ``response_mask``, ``rm_scores`` and
    ``old_log_probs`` ((B, T), padded; the last are the actor's log-probs of the response tokens
    before this step's update), with ``rollout_log_probs`` the rollout server's log-probs of the
    same tokens (when the rollout returns them), ``prompts`` and ``responses`` (each row's token
    ids, unpadded), ``uid`` (B group ids), and the reward side's ``reward_extra_info`` rows
    (``infos``), in the batch's row order. Written to a temporary name first, then renamed.
    """
    import transfer_queue as tq

    fields = ["advantages", "response_mask", "rm_scores", "old_log_probs", "uid"]
    fields += ["rollout_log_probs"] if rollout_log_probs else []
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    padded = data.to_padded_tensor()
    uid = padded.pop("uid").tolist()  # a non-tensor stack (indexing gives a list-like view)
    tokens = tq.kv_batch_get(
        keys=batch.keys, partition_id=batch.partition_id, select_fields=["prompts", "responses"]
    )
    record = {
        "advantages": padded["advantages"].detach().cpu(),
        "response_mask": padded["response_mask"].detach().cpu(),
        "rm_scores": padded["rm_scores"].detach().cpu(),
        "old_log_probs": padded["old_log_probs"].detach().cpu(),
        **(
            {"rollout_log_probs": padded["rollout_log_probs"].detach().cpu()}
            if rollout_log_probs
            else {}
        ),
        "prompts": [row.tolist() for row in tokens["prompts"].unbind()],
        "responses": [row.tolist() for row in tokens["responses"].unbind()],
        "uid": [str(u) for u in uid],
        "infos": [dict(info) for info in infos],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(record, tmp)
    tmp.replace(path)
    return path


def registered() -> bool:
    """Whether verl's registry maps :data:`TRAINER_MODE` to :class:`SLCATrainer`."""
    try:
        return get_trainer_cls(TRAINER_MODE) is SLCATrainer
    except ValueError:
        return False
