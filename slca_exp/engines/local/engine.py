"""The local engine: SFT then GRPO-family RL of a Hugging Face causal LM, on CPU or one GPU.

    load splits -> backbone (tokenizer + model) -> SFT (cached per recipe) -> validate
    -> RL steps: rollouts -> HierR rewards -> penalty routing -> segments (engine.rl.mask_rule)
       -> estimator -> clipped PG update -> service outage check (``services/outage.py``)
    -> validate -> checkpoint -> the final policy as an HF folder, the run's logged model

It runs the same code paths a cluster run does (verl's row layout, multi-turn rollouts with
environment-injected tool responses under mask 0, the rewards, judges, simulators, estimators
and trackers of this package), at a size a laptop can afford.
"""

from __future__ import annotations

import copy
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock

from slca_exp.config.paths import output_root, run_dir
from slca_exp.config.schema import RunConfig
from slca_exp.core import names
from slca_exp.core.process import RunKilled, signals_deferred
from slca_exp.core.rows import Row
from slca_exp.engines.base import Engine
from slca_exp.engines.local import data_io, reporting
from slca_exp.engines.local.policy import response_logprobs
from slca_exp.engines.local.records import batch_view
from slca_exp.engines.local.rollout import Roller, Rollouts, RolloutSettings
from slca_exp.engines.local.schema import LocalEngineConfig
from slca_exp.engines.local.sft import save_weights, sft_key, train_sft
from slca_exp.engines.local.state import (
    CHECKPOINT,
    RunState,
    load_checkpoint,
    resumable,
    save_checkpoint,
)
from slca_exp.engines.local.update import rl_update, segments
from slca_exp.estimators import EstimatorParams, get_estimator
from slca_exp.rewards import HierRReward
from slca_exp.rewards.routing import success_stats
from slca_exp.rollouts.batch import BatchView, logged_rollouts
from slca_exp.rollouts.drift import drift_metrics
from slca_exp.rollouts.select import due
from slca_exp.services.outage import ServiceWatch


@dataclass
class RunResult:
    """What a local run returns (and Hydra records as the job's return value).

    Attributes:
        steps: RL steps completed.
        val: validation metrics by stage label (``sft``: before RL, ``rl``: after it).
        metrics: the metrics of the last RL step.
        run_dir: the run's folder (checkpoint, state).

    """

    steps: int
    val: dict[str, dict[str, float]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    run_dir: str = ""


POLICY = "policy"
"""The final policy's folder in the run folder, and the name of the run's logged model."""


class LocalEngine(Engine):
    """``engine=local``: registered in ``slca_exp.engines.ENGINES``."""

    schema = LocalEngineConfig
    checkpointable = True

    def resume_ids(self, config: RunConfig) -> dict[str, str] | None:
        """Tracker run ids of an unfinished earlier run of this exact config (to continue it)."""
        state = resumable(config)
        return dict(state.run_ids) if state is not None and state.run_ids else None

    def remember_run_ids(self, config: RunConfig, run_ids: dict[str, str]) -> None:
        """Note the tracker runs this config logs to, as soon as they are open.

        A job stopped before its first step (a time limit announced early) then continues the
        same runs when it is requeued, instead of opening new ones.
        """
        if not run_ids:
            return
        state = resumable(config) or RunState()
        state.run_ids = dict(run_ids)
        state.save(run_dir(config))

    def checkpoint(self, config: RunConfig) -> Path | None:
        """The run's checkpoint file (weights, optimizer, RNG states); None before the first."""
        path = run_dir(config) / CHECKPOINT
        return path if path.is_file() else None

    def run(self, config: RunConfig, recipe: Any, tracker: Any) -> RunResult:  # noqa: ANN401
        """Run SFT then RL as configured; resumable after a kill (see ``state.py``)."""
        return _LocalRun(config, tracker).execute()


class _LocalRun:
    def __init__(self, config: RunConfig, tracker: Any) -> None:  # noqa: ANN401
        self.cfg = config
        self.engine = config.engine
        self.tracker = tracker
        self.folder = run_dir(config)
        self.state = resumable(config) or RunState()
        self.device = _device(config.engine.device)
        self._rollouts_warned = False

    def execute(self) -> RunResult:
        from transformers.utils import logging as hf_logging

        from slca_exp.judges import build_judge, build_outcome_judge
        from slca_exp.simulators import build_simulator

        hf_logging.disable_progress_bar()  # our own bar reports progress; theirs is noise here
        cfg = self.cfg
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.state.run_ids = reporting.run_ids(self.tracker) or self.state.run_ids
        self.state.save(self.folder)
        self.splits = data_io.load(cfg)
        self.backbone = data_io.backbone(cfg, self.splits, self.device)
        self.model, self.tok = self.backbone.model, self.backbone.tokenizer
        self.judge = build_judge(cfg.judge, seed=cfg.seed)
        self.outcome = build_outcome_judge(cfg.reward, cfg.judge)
        self.simulator = build_simulator(cfg.simulator)
        self.reward = HierRReward.from_config(cfg.reward)
        self.estimator = get_estimator(cfg.algorithm.name)
        self.watch = ServiceWatch(
            cfg.reward.judge_failure, tag=reporting.run_tagger(cfg, self.tracker)
        )
        self.params = EstimatorParams.from_config(cfg.algorithm)
        self.roller = Roller(
            self.model,
            self.tok,
            self.simulator,
            data_io.render_prompt,
            data_io.tool_turn_text,
            stop_token_ids=self.backbone.stop_token_ids,
        )
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.engine.rl.lr)
        try:
            if self.state.sft_done:
                load_checkpoint(self.folder, self.model, optimizer if self.state.step else None)
            else:
                self._sft()
                self.state.sft_done = True
                save_checkpoint(self.folder, self.model, None, self.state)
            if "sft" not in self.state.val:
                self._validate("sft", step=0)
            last = self._rl(optimizer)
        except (RunKilled, KeyboardInterrupt):
            # Checkpoint what is done; the same command continues from here.
            if self.state.sft_done:
                save_checkpoint(self.folder, self.model, optimizer, self.state)
            print(
                f"slca-exp: checkpointed at RL step {self.state.step} in {self.folder}; "
                "rerun the same command to resume",
                file=sys.stderr,
            )
            raise
        finally:
            self.judge.close()
            if self.outcome is not None:
                self.outcome.close()
            self.simulator.close()
        self._record_policy()
        self.state.status = "finished"
        self.state.save(self.folder)
        return RunResult(self.state.step, dict(self.state.val), last, str(self.folder))

    # --- stages -------------------------------------------------------------------------------

    def _sft(self) -> None:
        sft = self.engine.sft
        split = self.splits.get("sft")
        if not sft.enabled or split is None or sft.steps == 0:
            return
        key = sft_key(self.backbone.path, split.sha256, sft, self.cfg.seed)
        cached = output_root(self.cfg.tracking) / "cache" / "sft" / key
        # Jobs that share an SFT key (a sweep over RL settings) train it once: the others wait on
        # the key's lock, then load the weights it saved.
        with FileLock(f"{cached}.lock"):
            if (cached / "config.json").is_file():
                weights = type(self.model).from_pretrained(cached).state_dict()
                self.model.load_state_dict(weights)
                print(f"slca-exp: SFT weights reused from {cached}", file=sys.stderr)
                return
            examples = data_io.sft_examples(self.tok, split.rows, sft.max_len)
            bar = reporting.Progress(sft.steps, "sft", self.engine.progress)
            skipped: list[int] = []  # the SFT step each label-less batch was drawn for
            losses = train_sft(
                self.model,
                examples,
                sft,
                seed=self.cfg.seed,
                pad_id=self.roller.pad_id,
                on_step=lambda step, loss: bar.update({"loss": loss}),
                on_skip=lambda step, _: skipped.append(step),
            )
            bar.close()
            self.tracker.log_metrics(
                {names.SFT_LOSS: losses[-1], names.SFT_SKIPPED_BATCHES: float(len(skipped))}, 0
            )
            save_weights(self.model, self.tok, cached)

    def _rl(self, optimizer: torch.optim.Optimizer) -> dict[str, float]:
        rl, rollout = self.engine.rl, self.engine.rollout
        reference = None
        if rl.kl_coef > 0:
            reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        settings = RolloutSettings(
            rollout.max_turns,
            rollout.max_turn_tokens,
            rollout.max_response_tokens,
            rollout.temperature,
        )
        bar = reporting.Progress(rl.steps, "rl", self.engine.progress, start=self.state.step)
        last: dict[str, float] = {}
        train = self.splits["train"].rows
        for step in range(self.state.step, rl.steps if rl.enabled else 0):
            t0 = time.perf_counter()
            rng = random.Random(self.cfg.seed * 1_000_003 + step)  # resume-stable prompt choice
            k = rollout.prompts_per_step
            picks = (
                rng.sample(range(len(train)), k)
                if k <= len(train)
                else rng.choices(range(len(train)), k=k)
            )  # a split smaller than a step's prompts is sampled with replacement
            rows = [train[i] for i in picks]
            torch.manual_seed(self.cfg.seed * 1_000_003 + step)
            rolls = self.roller.run(rows, self.cfg.algorithm.group_size, settings)
            t1 = time.perf_counter()
            scored = self._score(rolls)
            t2 = time.perf_counter()
            packed = rolls.batch(self.roller.pad_id, self.device)
            cut_off = rolls.ends_on_tool_call()
            split = segments(packed.response_mask.cpu(), cut_off, rl.mask_rule)
            adv = self.estimator(split, rolls.group, scored.scores, self.params)
            t3 = time.perf_counter()
            # From the update to the checkpoint a step is all or nothing: SIGTERM or SLURM's
            # preemption signal waits until the step is recorded, so a resumed run neither
            # repeats a logged step nor starts from half an update.
            logged = due(step + 1, self.cfg.tracking.rollouts.every)
            with signals_deferred():
                self.model.train()
                old_logp = None
                if logged:  # the update's own old log-probs, kept to show with the rollouts
                    with torch.no_grad():
                        old_logp, _ = response_logprobs(self.model, packed, rollout.temperature)
                train_stats = rl_update(
                    self.model,
                    reference,
                    optimizer,
                    packed,
                    adv,
                    rl,
                    rollout.temperature,
                    old_logp=old_logp,
                )
                self.model.eval()
                t4 = time.perf_counter()
                metrics = {
                    **scored.stats,
                    **adv.stats,
                    **train_stats,
                    **reporting.service_stats(rolls),
                }
                metrics[names.SEGMENT_CUTOFF_FRAC] = reporting.fraction(cut_off)
                metrics[names.PERF_STEP_S] = t4 - t0
                metrics[names.PERF_TOKENS_PER_S] = sum(map(len, rolls.response_ids)) / max(
                    t4 - t0, 1e-9
                )
                metrics.update(reporting.timing(rolls, t2 - t1, t3 - t2, t4 - t3))
                self.tracker.log_metrics(metrics, step + 1)
                reporting.log_advantages(self.tracker, adv, step + 1)
                self.state.step = step + 1
                if self.state.step % self.engine.checkpoint_every == 0:
                    save_checkpoint(self.folder, self.model, optimizer, self.state)
            last = metrics
            if logged:
                view = batch_view(
                    rolls, scored, split, packed.response_mask, data_split="train", adv=adv,
                    logprobs=old_logp,
                )  # fmt: skip
                self._log_rollouts(view, self.state.step, "train")
            self.watch.observe(metrics, self.state.step)  # the step is recorded: stop may raise
            bar.update(
                {
                    "tool": metrics[names.REWARD_TOOL_MEAN],
                    "sum": metrics[names.REWARD_SUMMARY_MEAN],
                    "A_tool": metrics[names.adv("tool", "abs_mean")],
                    "A_sum": metrics[names.adv("summary", "abs_mean")],
                }
            )
            every = self.engine.val_every
            if every and self.state.step % every == 0 and self.state.step < rl.steps:
                self._validate(f"step{self.state.step}", self.state.step)
        bar.close()
        self._validate("rl", self.state.step)
        save_checkpoint(self.folder, self.model, optimizer, self.state)
        return last

    def _score(self, rolls: Rollouts) -> Any:  # noqa: ANN401 - rewards.scorer.RewardBatch
        """The rewards of a batch of rollouts (the outcome judge's too, when it has one)."""
        recorded = None
        if self.outcome is not None:  # only the outcome judge reads the recorded answers
            recorded = [Row(row).recorded() for row in rolls.rows]
        return self.reward.score(
            rolls.texts, _truths(rolls), self.judge, outcome=self.outcome, recorded=recorded
        )

    def _log_rollouts(self, view: BatchView, step: int, split: str) -> None:
        """Hand the step's logged rollouts to the trackers (``tracking.rollouts``)."""
        log = getattr(self.tracker, "log_rollouts", None)
        if log is None:
            return
        started = time.perf_counter()
        cost = names.PERF_ROLLOUT_LOG_S
        settings = self.cfg.tracking.rollouts
        try:
            records = logged_rollouts(
                view,
                per_step=settings.val if split == "val" else settings.per_step,
                decode=self.tok.decode,
                run={
                    "algorithm": self.cfg.algorithm.name,
                    "seed": self.cfg.seed,
                    "engine": self.cfg.engine.name,
                },
                step=step,
                split=split,
                tokenizer=self.tok,
            )
        except Exception as err:  # noqa: BLE001 - a view on the run must not fail it
            if not self._rollouts_warned:
                self._rollouts_warned = True
                print(
                    f"slca-exp: rollouts of {split} step {step} not logged ({type(err).__name__}: "
                    f"{err}); training goes on, and this is reported once",
                    file=sys.stderr,
                )
            return
        log(records, step, split)
        seconds = time.perf_counter() - started
        metrics = {names.val(cost) if split == "val" else cost: seconds}
        self.tracker.log_metrics({**metrics, **drift_metrics(records, split)}, step)

    def _record_policy(self) -> None:
        """Save the trained policy as an HF folder and record it as the run's model.

        ``<run folder>/policy`` (weights, config, tokenizer) loads with ``from_pretrained``; the
        trackers copy it or, with ``tracking.log_model=false``, refer to it.
        """
        folder = self.folder / POLICY
        shutil.rmtree(folder, ignore_errors=True)  # left by an earlier run of this command
        save_weights(self.model, self.tok, folder)
        self.tracker.log_model(folder, name=POLICY, step=self.state.step)

    def _validate(self, label: str, step: int) -> dict[str, float]:
        """Greedy, one sample per validation prompt; logs ``val/...`` and prints the summary."""
        rows = self.splits["val"].rows[: self.engine.val_rows]
        rollout = self.engine.rollout
        settings = RolloutSettings(
            rollout.max_turns, rollout.max_turn_tokens, rollout.max_response_tokens, greedy=True
        )
        rolls = self.roller.run(rows, 1, settings)
        scored = self._score(rolls)
        metrics = {names.val(k): v for k, v in scored.stats.items()}
        metrics.update(
            success_stats(
                scored.success_totals,
                [t.score for t in scored.hierr],
                process_weight=self.reward.process_weight,
                summary_weight=self.reward.summary_weight,
            )
        )
        success = metrics[names.VAL_SUCCESS]
        metrics[names.val(names.SEGMENT_CUTOFF_FRAC)] = reporting.fraction(
            rolls.ends_on_tool_call()
        )
        self.tracker.log_metrics(metrics, step)
        if self.cfg.tracking.rollouts.every and self.cfg.tracking.rollouts.val:
            packed = rolls.batch(self.roller.pad_id)
            cut_off = rolls.ends_on_tool_call()
            split = segments(packed.response_mask, cut_off, self.engine.rl.mask_rule)
            view = batch_view(rolls, scored, split, packed.response_mask, data_split="val")
            self._log_rollouts(view, step, "val")
        self.state.val[label] = metrics
        self.state.save(self.folder)
        print(
            f"slca-exp: validation ({label}, {len(rows)} prompts): tool reward "
            f"{metrics[names.val(names.REWARD_TOOL_MEAN)]:.3f}, summary reward "
            f"{metrics[names.val(names.REWARD_SUMMARY_MEAN)]:.3f}, success@0.9 {success:.3f}, "
            f"ended on a tool call {metrics[names.val(names.SEGMENT_CUTOFF_FRAC)]:.3f}",
            file=sys.stderr,
        )
        return metrics


def _truths(rolls: Rollouts) -> list[Any]:
    """The ground truth of each sample (one shared object per prompt)."""
    return [Row(row).truth() for row in rolls.rows]


def _device(choice: str) -> torch.device:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")
