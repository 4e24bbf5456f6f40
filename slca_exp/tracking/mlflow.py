"""The MLflow tracker: recipe tags, the flattened config as params, metrics batched per step.

The store is ``tracking.mlflow_uri`` or, by default, ``sqlite:///<tracking.root>/mlflow.db``
with artifacts in ``<tracking.root>/mlartifacts`` (both absolute, so every job of a sweep and
``mlflow ui`` find the same store). A run whose parent id is in ``$SLCA_EXP_PARENT_RUN_ID`` (the
sweep callback sets it) is created as that run's child.

Resilience: if the server stops answering mid-run, steps are spooled to
``<tracking.root>/spool/<run_id>.jsonl`` and replayed, in order and each exactly once, when it
answers again or at finish (``slca_exp.tracking.spool``).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slca_exp.config.paths import output_root
from slca_exp.core.process import signals_deferred
from slca_exp.core.tags import (
    GIT_COMMIT,
    PARENT_RUN,
    RESUMED,
    RUN_NAME,
    SOURCE_NAME,
    SOURCE_TYPE,
)
from slca_exp.recipe import SWEEP_ID_ENV
from slca_exp.tracking.adopt import adopt
from slca_exp.tracking.base import Status
from slca_exp.tracking.redact import Redactor
from slca_exp.tracking.rollout_traces import TraceSources
from slca_exp.tracking.spool import Spool, StepRecord
from slca_exp.tracking.store import open_client, retry_locked, store_lock

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from slca_exp.config.schema import TrackingConfig
    from slca_exp.recipe import Recipe
    from slca_exp.rollouts.record import RolloutRecord
    from slca_exp.tracking.rollout_log import RolloutLog

PARENT_RUN_ENV = "SLCA_EXP_PARENT_RUN_ID"
"""The MLflow run id a job's run is created under (tag ``mlflow.parentRunId``)."""
RUN_ID_ENV = "SLCA_EXP_MLFLOW_RUN_ID"
"""Set by the tracker in its own process to the run it writes to (the sweep callback reads it)."""

MAX_PARAMS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
MAX_PARAM_VALUE = 6000
_TRUNCATED = "...[truncated {n} chars]"
_INVALID_KEY_CHARS = re.compile(r"[^\w/.\- :]")


class TrackingError(RuntimeError):
    """A tracker could not start (``str(err)`` names the config key and the fix)."""


def store_uri(tracking: TrackingConfig) -> str:
    """The tracking URI a run logs to: ``tracking.mlflow_uri`` or the sqlite store under root."""
    if tracking.mlflow_uri:
        return tracking.mlflow_uri
    return f"sqlite:///{output_root(tracking) / 'mlflow.db'}"


def mlflow_key(name: str) -> str:
    """A metric name as MLflow stores it (MLflow refuses ``@`` in names).

    ``@`` becomes ``_at_``, as verl's MLflow adapter does; other refused characters become ``_``.

    Example:
        >>> mlflow_key("val/success@0.9"), mlflow_key("adv/tool/mean")
        ('val/success_at_0.9', 'adv/tool/mean')

    """
    return _INVALID_KEY_CHARS.sub("_", name.replace("@", "_at_"))


def get_or_create_experiment(client: MlflowClient, name: str, root: Path | None) -> str:
    """The id of experiment ``name``, created if needed (artifacts under ``root/mlartifacts``).

    Local stores (sqlite, file) get an explicit artifact location, otherwise MLflow would put
    artifacts in ``./mlruns`` of whatever folder the job runs in. Concurrent jobs may race to
    create it: on a sqlite store one process at a time gets or creates it (the store's lock,
    ``slca_exp.tracking.store``); through a server, the loser of the race reads the winner's.
    """
    from mlflow.exceptions import MlflowException

    location = (root / "mlartifacts").as_uri() if root is not None else None
    with store_lock(client.tracking_uri):
        found = retry_locked(lambda: client.get_experiment_by_name(name))
        if found is not None:
            return found.experiment_id
        try:
            return retry_locked(lambda: client.create_experiment(name, artifact_location=location))
        except MlflowException:
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id


def flatten_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Dotted key -> string value; lists, None and booleans as JSON; long values truncated.

    Example:
        >>> flatten_params({"a": {"b": [1, 2], "c": None, "d": True}, "e": "x"})
        {'a.b': '[1, 2]', 'a.c': 'null', 'a.d': 'true', 'e': 'x'}

    """
    out: dict[str, str] = {}
    for key, value in config.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_params(value, f"{full}."))
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        if len(text) > MAX_PARAM_VALUE:
            note = _TRUNCATED.format(n=len(text))
            text = text[: MAX_PARAM_VALUE - len(note)] + note
        out[full] = text
    return out


class MlflowTracker:
    """Logs one run to MLflow.

    Args:
        tracking: the ``tracking`` config.
        run_name: the run's name.
        redactor: applied to params, tags and artifacts.
        parent_run_id: create the run as this run's child (default ``$SLCA_EXP_PARENT_RUN_ID``).
        resume_run_id: continue this existing run instead of creating one (a resumed job: its
            params and artifacts are already there; metrics continue at the next step).

    """

    backend = "mlflow"

    def __init__(
        self,
        tracking: TrackingConfig,
        run_name: str,
        redactor: Redactor,
        parent_run_id: str | None = None,
        resume_run_id: str | None = None,
    ) -> None:
        self.resume_run_id = resume_run_id
        self.cfg = tracking
        self.run_name = run_name
        self.redactor = redactor
        self.parent_run_id = parent_run_id or os.environ.get(PARENT_RUN_ENV) or None
        self.uri = store_uri(tracking)
        self.root = output_root(tracking)
        self.client: MlflowClient | None = None
        self.run_id: str | None = None
        self.spool: Spool | None = None
        self._next_try = 0.0
        self._pending_artifacts: list[tuple[Path, str | None]] = []
        self._finished = False
        self._fingerprint = ""
        self._sources = TraceSources()
        self._rollouts: RolloutLog | None = None

    def start(self, recipe: Recipe, params: Mapping[str, Any]) -> None:
        """Create the run with its tags, params, ``recipe.json`` and redacted ``config.yaml``.

        Also its splits as dataset inputs, its prompts linked from the prompt registry and the
        experiment's training kind (``slca_exp.tracking.lineage``).
        """
        from mlflow.entities import Param

        self._fingerprint = recipe.short_fingerprint
        tags = {k: self.redactor.text(v) for k, v in recipe.tags().items()}
        self._sources = TraceSources.from_tags(tags)
        self._bound_http_waits()
        local = not self.cfg.mlflow_uri
        if local:
            self.root.mkdir(parents=True, exist_ok=True)
        self.client = open_client(self.uri)  # creates a new sqlite store once, under its lock
        if self.resume_run_id and self._resume(self.resume_run_id):
            return
        try:
            experiment_id = get_or_create_experiment(
                self.client, recipe.experiment_name, self.root if local else None
            )
            run = retry_locked(
                lambda: self.client.create_run(
                    experiment_id, run_name=self.run_name, tags=self._tags(recipe)
                )
            )
        except Exception as err:
            raise TrackingError(
                f"cannot open an MLflow run at {self.uri}: {self.redactor.text(str(err))[:300]}\n"
                "    fix: start the server, or set tracking.mlflow_uri (null = the local sqlite "
                "store under tracking.root), or choose another tracker: tracking=none"
            ) from err
        self.run_id = run.info.run_id
        os.environ[RUN_ID_ENV] = self.run_id
        self.spool = Spool(self.root / "spool" / f"{self.run_id}.jsonl")
        flat = flatten_params(self.redactor.mapping(params))
        items = [Param(k, v) for k, v in flat.items()]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            batch = items[i : i + MAX_PARAMS_PER_BATCH]
            retry_locked(lambda batch=batch: self.client.log_batch(self.run_id, params=batch))
        recipe = self._record_lineage(recipe, experiment_id)
        self._log_text(json.dumps(self.redactor.mapping(recipe.to_dict()), indent=2), "recipe.json")
        self._log_text(_to_yaml(self.redactor.mapping(params)), "config.yaml")

    def _resume(self, run_id: str) -> bool:
        """Reopen ``run_id`` (set it RUNNING again); ``False`` when the store does not have it."""
        from mlflow.exceptions import MlflowException

        assert self.client is not None
        try:
            self.client.get_run(run_id)
            self.client.update_run(run_id, status="RUNNING")
            self.client.set_tag(run_id, RESUMED, "true")
            sweep = os.environ.get(SWEEP_ID_ENV)
            moved = adopt(self.client, run_id, self.parent_run_id, sweep)
        except MlflowException:
            print(f"slca-exp: MLflow run {run_id} to resume is gone; starting a new run")
            return False
        self.run_id = run_id
        os.environ[RUN_ID_ENV] = run_id
        if moved:
            print(f"slca-exp: MLflow run {run_id} moved from parent run {moved} to sweep {sweep}")
        self.spool = Spool(self.root / "spool" / f"{self.run_id}.jsonl")
        print(f"slca-exp: resuming MLflow run {run_id}")
        return True

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Send one step as one batch; spool it if the server does not answer."""
        record = StepRecord(
            step, int(time.time() * 1000), {mlflow_key(k): float(v) for k, v in metrics.items()}
        )
        assert self.spool is not None, "start() first"
        if len(self.spool) and time.monotonic() < self._next_try:
            self.spool.append(record)  # still in an outage: do not block the step on it
            return
        try:
            with signals_deferred():
                if len(self.spool):
                    self.spool.replay(self._send)
                    print(f"slca-exp: MLflow at {self.uri} is back; spooled steps replayed")
                self._send(record)
        except Exception as err:  # noqa: BLE001 - any transport or server error: spool
            if not len(self.spool):
                print(
                    f"slca-exp: MLflow at {self.uri} did not answer ({type(err).__name__}); "
                    f"spooling metrics to {self.spool.path}"
                )
            self.spool.append(record)
            self._next_try = time.monotonic() + self.cfg.retry_every_s

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Attach a file; kept for a retry at finish if the server does not answer."""
        assert self.client is not None and self.run_id is not None, "start() first"
        try:
            self.client.log_artifact(self.run_id, str(path), artifact_path)
        except Exception:  # noqa: BLE001 - retried at finish
            keep = self.root / "spool" / f"{self.run_id}-artifacts" / (artifact_path or "")
            keep.mkdir(parents=True, exist_ok=True)
            copy = keep / Path(path).name
            copy.write_bytes(Path(path).read_bytes())
            self._pending_artifacts.append((copy, artifact_path))

    def log_rollouts(self, records: Sequence[RolloutRecord], step: int, split: str) -> None:
        """One logged step's rollouts: traces linked to the run, a table, a credit view.

        Secrets are redacted from every text first, as from params and artifacts. Nothing here
        fails the run (``slca_exp.tracking.rollout_log``).
        """
        from slca_exp.rollouts.record import RolloutRecord as Record

        assert self.client is not None and self.run_id is not None, "start() first"
        if self.spool is not None and len(self.spool):
            # the server is away (metrics are being spooled): do not hold the step on it
            if self._rollouts is not None:
                self._rollouts.report("records", "MLflow is not answering; steps skipped")
            return
        if self._rollouts is None:
            from slca_exp.tracking.rollout_log import RolloutLog

            try:
                experiment_id = self.client.get_run(self.run_id).info.experiment_id
            except Exception as err:  # noqa: BLE001 - the store is away: no rollouts this step
                print(f"slca-exp: rollouts of step {step} not logged ({type(err).__name__})")
                return
            self._rollouts = RolloutLog(
                self.uri,
                self.run_id,
                experiment_id,
                sources=self._sources,
                html=self.cfg.rollouts.html,
            )
        clean = [Record.from_dict(json.loads(self.redactor.text(r.to_json()))) for r in records]
        self._rollouts.log(clean, step, split)

    def log_model(self, path: str | Path, *, name: str, step: int) -> None:
        """Record the trained policy as a logged model of the run (``tracking.log_model``).

        ``tracking.log_model=true`` copies the files into the model's artifacts; ``false``
        records where they are. A store that refuses leaves the files where they are, said so.
        """
        from slca_exp.tracking.lineage import log_policy

        assert self.client is not None and self.run_id is not None, "start() first"
        try:
            log_policy(
                self.client,
                self.run_id,
                Path(path),
                name=name,
                fingerprint=self._fingerprint,
                step=step,
                copy=self.cfg.log_model,
            )
        except Exception as err:  # noqa: BLE001 - the weights are safe on disk either way
            print(
                f"slca-exp: {path} not recorded as a logged model of MLflow run {self.run_id} "
                f"({type(err).__name__}: {self.redactor.text(str(err))[:200]}); the files stay "
                "there"
            )

    def finish(self, status: Status) -> None:
        """Replay what is spooled, then close the run with ``status``.

        Retries for ``tracking.flush_timeout_s``; if the server is still away, the spool is
        kept and the way to replay it is printed.
        """
        if self._finished or self.client is None or self.run_id is None:
            return
        self._finished = True
        if self._rollouts is not None:
            self._rollouts.flush()  # traces are exported in the background
        deadline = time.monotonic() + self.cfg.flush_timeout_s
        while True:
            try:
                self._flush()
                self.client.set_terminated(self.run_id, status)
                return
            except Exception as err:  # noqa: BLE001
                if time.monotonic() >= deadline:
                    self._give_up(status, err)
                    return
                time.sleep(min(self.cfg.retry_every_s, max(deadline - time.monotonic(), 0.1)))

    # --- internals ---------------------------------------------------------------------------

    def _send(self, record: StepRecord) -> None:
        from mlflow.entities import Metric

        assert self.client is not None and self.run_id is not None
        rows = [Metric(k, v, record.timestamp_ms, record.step) for k, v in record.metrics.items()]
        for i in range(0, len(rows), MAX_METRICS_PER_BATCH):
            batch = rows[i : i + MAX_METRICS_PER_BATCH]
            # A locked sqlite store is retried for a while; after that the step is spooled.
            retry_locked(lambda batch=batch: self.client.log_batch(self.run_id, metrics=batch))

    def _flush(self) -> None:
        assert self.spool is not None and self.client is not None
        if len(self.spool):
            self.spool.replay(self._send)
        while self._pending_artifacts:
            path, artifact_path = self._pending_artifacts[0]
            self.client.log_artifact(self.run_id, str(path), artifact_path)
            self._pending_artifacts.pop(0)

    def _give_up(self, status: Status, err: Exception) -> None:
        assert self.spool is not None
        marker = self.spool.path.with_suffix(".status")
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(status)
        print(
            f"slca-exp: MLflow at {self.uri} still does not answer ({type(err).__name__}); run "
            f"{self.run_id} could not be closed {status}. Its {len(self.spool)} spooled steps "
            f"are in {self.spool.path}; replay them with:\n"
            f"    python -m slca_exp.tracking.replay {self.spool.path} --uri {self.uri}"
        )

    def _record_lineage(self, recipe: Recipe, experiment_id: str) -> Recipe:
        """Datasets, prompts and experiment kind; the recipe with its prompts' versions."""
        from slca_exp.tracking.lineage import record_run_lineage

        assert self.client is not None and self.run_id is not None
        try:
            # Registering prompts is a get-or-create too: one run at a time on a sqlite store.
            with store_lock(self.uri):
                versions = record_run_lineage(self.client, self.run_id, experiment_id, recipe)
        except Exception as err:  # noqa: BLE001 - metrics and the recipe matter more
            print(
                f"slca-exp: MLflow run {self.run_id}: datasets and prompts not recorded "
                f"({type(err).__name__}: {self.redactor.text(str(err))[:200]})"
            )
            return recipe
        return recipe.with_prompt_versions(versions)

    def _tags(self, recipe: Recipe) -> dict[str, str]:
        tags = {
            **recipe.tags(),
            RUN_NAME: self.run_name,
            SOURCE_NAME: "slca-exp train",
            SOURCE_TYPE: "JOB",
        }
        if recipe.code.get("git_sha"):
            tags[GIT_COMMIT] = recipe.code["git_sha"]
        if self.parent_run_id:
            tags[PARENT_RUN] = self.parent_run_id
        return {k: self.redactor.text(v) for k, v in tags.items()}

    def _log_text(self, text: str, name: str) -> None:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="slca-exp-") as tmp:
            path = Path(tmp) / name
            path.write_text(self.redactor.text(text))
            self.log_artifact(path)

    def _bound_http_waits(self) -> None:
        # MLflow's defaults (7 retries, exponential backoff, 120 s timeout) would stall a training
        # step for minutes while a server is down; a step is spooled instead. Variables the user
        # exported win.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(self.cfg.http_retries))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(self.cfg.http_timeout_s))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")


def _to_yaml(data: Mapping[str, Any]) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(dict(data)))
