"""verl's rollouts as slca-exp's rollout records: the batch the actor trains on, and validation.

    training step (``SLCATrainer._compute_advantage``, after verl's advantage step):
      TransferQueue: token ids, response_mask, advantages, old_log_probs, the row's columns,
                     extra_fields (reward_extra_info; the simulator's answers, ``tools.py``)
      -> BatchView -> slca_exp.rollouts.batch.logged_rollouts (each logged group's best and
         worst) -> the run's MLflow run (traces, table, credit view) and W&B run (table)
    validation (``SLCATrainer._validate``): the same fields of each validation batch, read as
      verl's validation samples it from its replay buffer (:class:`ValidationCapture`),
      without advantages.

This replaces verl's own validation-generation table (``trainer.log_val_generations`` is fixed
to 0): verl's table holds decoded text and a score only; ours holds the rollouts token by token
with their segments, reward parts and the simulator's answers, in MLflow as well as W&B.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slca_exp.rollouts.batch import BatchView, samples_within_groups
from slca_exp.rollouts.record import Answer, Rewards, prompt_id
from slca_exp.tracking.rollout_traces import TraceSources

ANSWERS_KEY = "slca/sim_answers"
"""A rollout's ``extra_fields`` list of the simulator's answers (one dict per call)."""
ROW_FIELDS = ("raw_prompt", "reward_model", "extra_info")
"""The row's columns a record reads (verl keeps the dataset's columns with each rollout)."""
TOKEN_FIELDS = ("prompts", "responses")


def record_answer(
    extra_fields: dict[str, Any] | None,
    name: str,
    arguments: Mapping[str, Any],
    answer: Any,  # noqa: ANN401
) -> None:
    """Keep one simulator answer in a rollout's ``extra_fields`` (:data:`ANSWERS_KEY`)."""
    if extra_fields is None:
        return
    extra_fields.setdefault(ANSWERS_KEY, []).append(
        {
            "name": name,
            "arguments": json.dumps(dict(arguments), sort_keys=True, default=str),
            "content": answer.content,
            "status": answer.status,
            "reason": answer.reason,
            "cached": bool(answer.cached),
        }
    )


def rewards_from_info(info: Mapping[str, Any]) -> Rewards:
    """Reward parts from the reward side's ``reward_extra_info`` row (``rewards._result``)."""
    from slca_exp.engines.verl.rewards import (
        NO_SUMMARY_KEY,
        OUTCOME_KEY,
        SUMMARY_FAILED_KEY,
        SUMMARY_KEY,
        TOOL_FAILED_KEY,
        TOOL_KEY,
        TOTAL_KEY,
        verdict_of,
    )
    from slca_exp.rewards.hierr import COMPONENTS

    failed = bool(info.get(SUMMARY_FAILED_KEY, 0)) and not info.get(NO_SUMMARY_KEY, 0)
    no_tool = bool(info.get(TOOL_FAILED_KEY, 0))
    rating = int(info.get("slca/judge/rating", -1))
    raw_rating = int(info.get("slca/judge/raw_rating", rating))
    outcome = OUTCOME_KEY in info
    tool, hierr = float(info.get("slca/tool/score", math.nan)), info.get("slca/tool/hierr")
    logged_apart = hierr is not None and hierr != tool  # reward.logged_weights weigh it otherwise
    hierr = math.nan if hierr is None else float(hierr)
    return Rewards(
        tool=tool,
        components={part: float(info.get(f"slca/tool/{part}", math.nan)) for part in COMPONENTS},
        summary=float(info.get("slca/judge/score", math.nan)),
        rating=None if rating < 0 else rating,
        judge_status=str(info.get("slca/judge_status", "")),
        judge_reason=str(info.get("slca/judge_reason", "")),
        should_no_call=bool(info.get("slca/tool/should_no_call", 0)),
        routed_tool=math.nan if no_tool else float(info.get(TOOL_KEY, math.nan)),
        routed_summary=math.nan if failed else float(info.get(SUMMARY_KEY, math.nan)),
        total=math.nan if failed or no_tool else float(info.get(TOTAL_KEY, math.nan)),
        raw_rating=None if raw_rating < 0 else raw_rating,
        hierr=hierr if outcome or logged_apart else None,
        outcome=verdict_of(info) if outcome else None,
    )


def ordered_answers(text: str, given: Sequence[Mapping[str, Any]]) -> list[Answer] | None:
    """The simulator's answers in the order the response makes its calls.

    verl runs a turn's calls concurrently, so they are kept in the order they finished; each
    call of the response takes the first unused answer to the same tool with the same
    arguments. None when a call finds none (the record then reads the answers off the text).
    """
    from slca_exp.rewards.toolcalls import parse_tool_calls

    left = list(given)
    ordered = []
    for call in parse_tool_calls(text, skip_tool_responses=True).calls:
        arguments = json.dumps(dict(call.arguments), sort_keys=True, default=str)
        match = next(
            (a for a in left if a.get("name") == call.name and a.get("arguments") == arguments),
            None,
        )
        if match is None:
            match = next((a for a in left if a.get("name") == call.name), None)
        if match is None:  # a call verl answered itself (an unknown function): no pairing holds
            return None
        left.remove(match)
        ordered.append(
            Answer(
                str(match.get("content", "")),
                match.get("status"),
                str(match.get("reason", "")),
                match.get("cached"),
            )
        )
    return ordered


def batch_view(
    batch: Any,  # noqa: ANN401 - verl's KVBatchMeta
    tokenizer: Any,  # noqa: ANN401
    *,
    split: str,
    no_summary: np.ndarray | None,
    advantages: bool,
) -> BatchView:
    """The view of a batch held in verl's TransferQueue (``advantages``: the actor's batch)."""
    import transfer_queue as tq

    from slca_exp.engines.verl.rewards import batch_infos
    from slca_exp.estimators.segments import split_segments

    def get(fields: Sequence[str]) -> Any:  # noqa: ANN401
        return tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=list(fields)
        )

    tensors = ["response_mask", *(["advantages", "old_log_probs"] if advantages else [])]
    padded = get(tensors).to_padded_tensor()
    tokens = get(TOKEN_FIELDS)
    responses = [row.tolist() for row in tokens["responses"].unbind()]
    extra = _as_list(get(["extra_fields"])["extra_fields"])
    infos = batch_infos(extra)
    rows = _rows(get(ROW_FIELDS), len(responses))
    mask = padded["response_mask"].detach().cpu()
    segments = split_segments(mask.bool())
    if no_summary is not None:
        segments = segments.without_summary(torch.as_tensor(no_summary, dtype=torch.bool))
    tool_mask, summary_mask = segments.tool_mask, segments.summary_mask
    adv = padded["advantages"].detach().float().cpu() if advantages else None
    groups = [prompt_id(row, split) for row in rows]
    texts = [tokenizer.decode(r, skip_special_tokens=False) for r in responses]
    answers = [
        ordered_answers(text, fields.get(ANSWERS_KEY, []) if isinstance(fields, Mapping) else [])
        for text, fields in zip(texts, extra, strict=True)
    ]
    return BatchView(
        response_ids=responses,
        response_mask=mask,
        tool_mask=tool_mask,
        summary_mask=summary_mask,
        advantages=adv,
        logprobs=padded["old_log_probs"].detach().float().cpu() if advantages else None,
        tool_adv=None if adv is None else _segment_value(adv, tool_mask),
        summary_adv=None if adv is None else _segment_value(adv, summary_mask),
        rows=rows,
        groups=groups,
        samples=samples_within_groups(_uids(batch, groups)),
        rewards=[rewards_from_info(info) for info in infos],
        answers=answers,
        ends_on_tool_call=[bool(i.get("slca/ends_on_tool", 0)) for i in infos],
    )


def _segment_value(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) each rollout's advantage on a segment (constant over it), NaN without one."""
    first = mask.float().argmax(dim=1)
    values = advantages.gather(1, first[:, None]).squeeze(1)
    return torch.where(mask.any(dim=1), values, torch.full_like(values, math.nan))


def _uids(batch: Any, groups: Sequence[str]) -> list[str]:  # noqa: ANN401
    """Each rollout's GRPO group: its key's uid part (``{uid}_{session}_{index}``)."""
    keys = list(getattr(batch, "keys", []) or [])
    if len(keys) != len(groups):
        return list(groups)
    return [str(k).rsplit("_", 2)[0] for k in keys]


def _rows(data: Any, n: int) -> list[dict[str, Any]]:  # noqa: ANN401
    """Each rollout's row, as ``Row`` reads it (``prompt``, ``reward_model``, ``extra_info``)."""
    columns = {}
    for name in ROW_FIELDS:
        try:
            values = data[name]
        except KeyError:
            continue
        columns[name] = _as_list(values)
    # verl keeps the dataset's prompt as ``raw_prompt``; the row layout calls it ``prompt``
    renamed = {key: _ROW_NAMES.get(key, key) for key in columns}
    return [{renamed[key]: _plain(values[i]) for key, values in columns.items()} for i in range(n)]


_ROW_NAMES = {"raw_prompt": "prompt"}


def _as_list(values: Any) -> list[Any]:  # noqa: ANN401
    """A TransferQueue column as a list (a stack of non-tensors, or already a list)."""
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _plain(value: Any) -> Any:  # noqa: ANN401
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


class ValidationCapture:
    """verl's replay buffer, seen through: each validation batch it hands out is read first.

    Installed on the trainer for the length of one ``_validate`` call; every other attribute
    is the buffer's own.
    """

    def __init__(self, buffer: Any, read: Any) -> None:  # noqa: ANN401
        self._buffer = buffer
        self._read = read
        self.views: list[BatchView] = []
        self.failed: BaseException | None = None

    def sample(self, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        """The buffer's ``sample``; a validation batch is read before verl clears it."""
        result = self._buffer.sample(*args, **kwargs)
        if kwargs.get("partition_id") == "val" and self.failed is None:
            try:
                self.views.append(self._read(result[0]))
            except Exception as err:  # noqa: BLE001 - validation itself must go on
                self.failed = err
        return result

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401
        return getattr(self._buffer, name)


class ActiveRunLog:
    """Logs records to the runs verl's loggers write in this process (MLflow, W&B)."""

    def __init__(self, sources: TraceSources, html: bool) -> None:
        self.sources = sources
        self.html = html
        self._mlflow: Any = None
        self._warned = False

    def log(self, records: Sequence[Any], step: int, split: str) -> None:
        """Send one logged step's records; never raises."""
        if not records:
            return
        mlflow = sys.modules.get("mlflow")
        run = mlflow.active_run() if mlflow is not None else None
        if run is not None:
            if self._mlflow is None or self._mlflow.run_id != run.info.run_id:
                from slca_exp.tracking.rollout_log import RolloutLog

                self._mlflow = RolloutLog(
                    mlflow.get_tracking_uri(),
                    run.info.run_id,
                    run.info.experiment_id,
                    sources=self.sources,
                    html=self.html,
                )
            self._mlflow.log(records, step, split)
        wandb = sys.modules.get("wandb")
        if wandb is not None and getattr(wandb, "run", None) is not None:
            self._wandb(wandb, records, step, split)

    def warn_once(self, err: BaseException) -> None:
        """Report that rollouts could not be read (once per run); training goes on."""
        if not self._warned:
            self._warned = True
            import traceback

            frames = traceback.extract_tb(err.__traceback__)
            where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
            print(
                f"slca-exp: rollouts not logged ({type(err).__name__}{where}: {str(err)[:300]}); "
                "training goes on, metrics are unaffected, and this is reported once",
                file=sys.stderr,
            )

    def flush(self) -> None:
        """Wait for the traces MLflow exports in the background."""
        if self._mlflow is not None:
            self._mlflow.flush()

    def _wandb(self, wandb: Any, records: Sequence[Any], step: int, split: str) -> None:  # noqa: ANN401
        from slca_exp.tracking.rollout_log import table_columns

        try:
            columns = table_columns(records)
            rows = [list(row) for row in zip(*columns.values(), strict=True)]
            wandb.run.log({f"rollouts/{split}": wandb.Table(columns=list(columns), data=rows)},
                          step=step)  # fmt: skip
        except Exception as err:  # noqa: BLE001 - a view on the run must not fail it
            if not self._warned:
                self._warned = True
                print(f"slca-exp: rollouts not logged to W&B ({type(err).__name__}: {err})")
