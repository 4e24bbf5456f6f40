"""The W&B tracker: offline runs under ``<tracking.root>/wandb``, one new run per job.

project = ``tracking.wandb_project`` or the experiment name, group = the sweep id
(``$SLCA_EXP_SWEEP_ID``), config = the redacted recipe (plus the redacted resolved config under
``config``), tags = the ``slca.*`` tag values. Offline by default (``tracking.wandb_mode``):
nothing talks to the network and ``wandb sync <run dir>`` uploads later; ``online`` streams to
W&B with the credentials of the environment (``WANDB_API_KEY``).

W&B writes the config into ``debug.log`` and, unless told not to, the command line into its
metadata and the console into ``output.log``; metadata and console capture are switched off so
that only redacted values reach its files.

Like the MLflow tracker, each run records its splits (``dataset`` artifacts that refer to the
files), its judge and simulator templates (``prompt`` artifacts) and, at the end, the trained
policy (a ``model`` artifact), each with the sha256 the recipe holds in its metadata.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slca_exp.config.paths import output_root
from slca_exp.core.tags import short
from slca_exp.tracking.base import Status
from slca_exp.tracking.redact import Redactor

if TYPE_CHECKING:
    from slca_exp.config.schema import TrackingConfig
    from slca_exp.recipe import Recipe

_EXIT_CODES = {"FINISHED": 0, "FAILED": 1, "KILLED": 143}


class WandbTracker:
    """Logs one run to W&B (offline).

    Args:
        tracking: the ``tracking`` config.
        run_name: the run's name.
        redactor: applied to the config and tags.

    """

    def __init__(self, tracking: TrackingConfig, run_name: str, redactor: Redactor) -> None:
        self.cfg = tracking
        self.run_name = run_name
        self.redactor = redactor
        self.run: Any = None
        self.run_dir: Path | None = None
        """The offline run folder (``<root>/wandb/offline-run-<time>-<id>``), once started."""
        self._fingerprint = ""

    def start(self, recipe: Recipe, params: Mapping[str, Any]) -> None:
        """Open a new offline run whose config is the recipe."""
        import wandb

        folder = output_root(self.cfg)
        folder.mkdir(parents=True, exist_ok=True)
        config = self.redactor.mapping({**recipe.to_dict(), "config": dict(params)})
        # W&B tags are limited to 64 characters each.
        tags = [f"{short(k)}={v}" for k, v in recipe.tags().items()]
        self.run = wandb.init(
            project=self.cfg.wandb_project or recipe.experiment_name,
            entity=self.cfg.wandb_entity,
            name=self.run_name,
            group=recipe.sweep_id,
            job_type=self.cfg.job_type,
            tags=[self.redactor.text(tag)[:64] for tag in tags],
            config=config,
            dir=str(folder),
            mode=self.cfg.wandb_mode,
            reinit="finish_previous",
            settings=wandb.Settings(
                console="off",
                x_disable_meta=True,
                disable_git=True,
                save_code=False,
                x_disable_stats=True,
                x_save_requirements=False,
                silent=True,
            ),
        )
        self.run_dir = Path(self.run.dir).parent
        self._fingerprint = recipe.short_fingerprint
        self._log_inputs(recipe)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Record one step."""
        self.run.log(dict(metrics), step=step)

    def log_rollouts(self, records: Sequence[Any], step: int, split: str) -> None:
        """One logged step's rollouts as a W&B Table (``rollouts/<split>``), MLflow's columns."""
        import wandb

        from slca_exp.tracking.rollout_log import table_columns

        if not records:
            return
        try:
            columns = table_columns(records)
            rows = [
                [self.redactor.text(v) if isinstance(v, str) else v for v in row]
                for row in zip(*columns.values(), strict=True)
            ]
            table = wandb.Table(columns=list(columns), data=rows)
            self.run.log({f"rollouts/{split}": table}, step=step)
        except Exception as err:  # noqa: BLE001 - a view on the run must not fail it
            if not getattr(self, "_rollouts_warned", False):
                self._rollouts_warned = True
                print(f"slca-exp: rollouts not logged to W&B ({type(err).__name__}: {err})")

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Copy a file into the run's files (``artifact_path`` kept as a sub-folder)."""
        source = Path(path)
        target = Path(self.run.dir) / (artifact_path or "") / source.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        self.run.save(str(target), base_path=self.run.dir, policy="now")

    def log_model(self, path: str | Path, *, name: str, step: int) -> None:
        """The trained policy as a ``model`` artifact.

        Its files, or with ``tracking.log_model=false`` a reference to them.
        """
        import wandb

        path = Path(path).resolve()
        metadata = {"fingerprint": self._fingerprint, "step": step, "path": str(path)}
        artifact = wandb.Artifact(name, type="model", metadata=metadata)
        if not self.cfg.log_model:
            artifact.add_reference(path.as_uri(), checksum=False)
        elif path.is_dir():
            artifact.add_dir(str(path))
        else:
            artifact.add_file(str(path))
        self.run.log_artifact(artifact)

    def finish(self, status: Status) -> None:
        """Close the run; W&B records FAILED/KILLED as a non-zero exit code."""
        if self.run is None:
            return
        run, self.run = self.run, None
        run.summary["slca_status"] = status
        run.finish(exit_code=_EXIT_CODES[status])

    def _log_inputs(self, recipe: Recipe) -> None:
        """The splits and prompt templates as artifacts, their sha256 in the metadata."""
        import wandb

        from slca_exp.tracking.lineage import split_datasets

        for split in split_datasets(recipe):
            metadata = {
                "sha256": split.sha256,
                "digest": split.digest,
                "rows": split.rows,
                "context": split.context,
            }
            artifact = wandb.Artifact(split.name, type="dataset", metadata=metadata)
            # A reference: a split can be large, and its sha256 is already known.
            artifact.add_reference(split.path.as_uri(), name=split.path.name, checksum=False)
            self._use(artifact)
        for group, entry in recipe.prompts.items():
            metadata = {"sha256": entry["sha256"], "component": group}
            artifact = wandb.Artifact(entry["name"], type="prompt", metadata=metadata)
            with artifact.new_file("template.txt", encoding="utf-8") as f:
                f.write(recipe.prompt_texts[group])
            self._use(artifact)

    def _use(self, artifact: Any) -> None:  # noqa: ANN401 - a wandb.Artifact
        """Link an artifact to the run.

        Online as an input; offline W&B cannot use artifacts, so the run logs it (``wandb sync``
        uploads it with the run).
        """
        if self.cfg.wandb_mode == "online":
            self.run.use_artifact(artifact)
        else:
            self.run.log_artifact(artifact)
