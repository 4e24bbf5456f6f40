"""What a run read and made, in MLflow's own terms: datasets, registered prompts, logged models.

    recipe.data.files -> one MLflow dataset per split (name, digest, source, schema, row count),
                         logged as run inputs with their context (training | validation)
    recipe.prompts    -> the judge's and simulator's templates in the prompt registry, one
                         version per sha256, linked to the run ("Registered prompts")
    final policy      -> a logged model of the run ("Logged models"), tagged with the recipe
                         fingerprint: its files copied, or only referenced
    the experiment    -> tagged as a model-training experiment, unless it has a kind already

The MLflow UI reads each of these: the runs table's Dataset and Models columns and its Datasets
filter, the run page's Datasets, Registered prompts and Logged models. (MLflow 3.17's UI takes
the view from its GenAI / Model training switch, ``?workflowType=machine_learning``, not from
the kind tag; the UI ``slca-exp ui`` serves, :mod:`slca_exp.tracking.mlflow_app`, routes each
experiment by its tag.)
"""

from __future__ import annotations

import json
import random
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from slca_exp.core.tags import EXPERIMENT_KIND, FINGERPRINT, MODEL_PATH, PROMPT_SHA256

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import LoggedModel, Run
    from mlflow.entities.model_registry import PromptVersion

    from slca_exp.recipe import Recipe

TRAINING_KIND = "custom_model_development"
"""The value of the experiment tag :data:`EXPERIMENT_KIND` for the model-training view."""
SPLIT_CONTEXTS = {"sft": "training", "train": "training", "val": "validation"}
"""Split -> the dataset context MLflow records with the run input."""
DIGEST_CHARS = 12
"""Hex digits of a split's sha256 used as the MLflow dataset digest (MLflow allows 36 at most;
the full sha256 is in the dataset's profile)."""
MODEL_TYPE = "policy"
"""The ``model_type`` of the trained policy's logged model."""
CONFLICT_ATTEMPTS = 8
"""Attempts of a get-or-create that keeps meeting another writer's record being created."""
_CONFLICTS = (
    "UNIQUE constraint failed",
    "IntegrityError",
    "duplicate key value",
    "Duplicate entry",
    "is registered as a model, not a prompt",
)
"""How sqlite, PostgreSQL and MySQL stores word a uniqueness conflict (a server passes the
message on in its ``BAD_REQUEST``), and how MLflow's client sees a prompt another writer is
creating: its registered model exists a moment before the tag that makes it a prompt. (A name
that really is a model's fails again on every attempt and is reported.)"""


def is_conflict(err: BaseException) -> bool:
    """Whether ``err`` is a uniqueness conflict: another writer made the same record meanwhile."""
    if getattr(err, "error_code", None) == "RESOURCE_ALREADY_EXISTS":
        return True
    text = str(err)
    return any(marker in text for marker in _CONFLICTS)


T = TypeVar("T")


def on_conflict(
    call: Callable[[], T],
    *,
    attempts: int = CONFLICT_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()`` (a get-or-create), again while it fails with a uniqueness conflict.

    A conflict means the record exists now: the next attempt finds it and uses it. Runs of one
    sweep started at once against one server meet such conflicts creating the same dataset,
    prompt or prompt version.

    Raises:
        Exception: any other error at once; a conflict after ``attempts`` attempts.

    """
    for attempt in range(attempts):
        try:
            return call()
        except Exception as err:
            if not is_conflict(err) or attempt == attempts - 1:
                raise
        sleep(random.uniform(0.02, 0.1) * (attempt + 1))  # jitter: do not collide in step again
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class SplitDataset:
    """One split of the recipe as an MLflow dataset.

    Attributes:
        split: ``sft``, ``train`` or ``val``.
        name: ``<data.name>-<split>``, e.g. ``synthetic-train``.
        path: the parquet file.
        sha256: its sha256 (hex), as the recipe records it.
        rows: its row count.

    """

    split: str
    name: str
    path: Path
    sha256: str
    rows: int

    @property
    def digest(self) -> str:
        """The MLflow digest: the first :data:`DIGEST_CHARS` hex digits of the sha256."""
        return self.sha256[:DIGEST_CHARS]

    @property
    def context(self) -> str:
        """``training`` (sft, train) or ``validation`` (val)."""
        return SPLIT_CONTEXTS.get(self.split, "training")

    def source(self) -> dict[str, str]:
        """MLflow's local dataset source: the file's URI."""
        return {"uri": self.path.as_uri()}

    def schema(self) -> dict[str, list[dict[str, Any]]]:
        """The parquet columns in MLflow's column-spec layout (``{}`` if the file is gone)."""
        import pyarrow.parquet as pq

        try:
            arrow = pq.read_schema(self.path)
        except OSError:
            return {}
        columns = [
            {"name": f.name, "type": _COLUMN_TYPES.get(str(f.type), str(f.type))} for f in arrow
        ]
        return {"mlflow_colspec": columns}

    def profile(self) -> dict[str, Any]:
        """Row count and the full sha256."""
        return {"num_rows": self.rows, "sha256": self.sha256}


_COLUMN_TYPES = {
    "string": "string",
    "large_string": "string",
    "int32": "integer",
    "int64": "long",
    "float": "float",
    "double": "double",
    "bool": "boolean",
    "binary": "binary",
}


def split_datasets(recipe: Recipe) -> list[SplitDataset]:
    """The recipe's splits (``data.files``), in the order sft, train, val."""
    from slca_exp.data.splits import SPLITS

    files = recipe.data.get("files") or {}
    name = recipe.data.get("name") or "data"
    return [
        SplitDataset(
            split,
            f"{name}-{split}",
            Path(files[split]["path"]),
            files[split]["sha256"],
            int(files[split]["rows"]),
        )
        for split in SPLITS
        if split in files
    ]


def record_run_lineage(
    client: MlflowClient, run_id: str, experiment_id: str, recipe: Recipe
) -> dict[str, str]:
    """Everything a new run records in MLflow's terms: kind, datasets, prompts.

    Returns:
        component (``judge`` / ``simulator``) -> the registry version of its template.

    """
    mark_training_experiment(client, experiment_id)
    log_datasets(client, run_id, split_datasets(recipe))
    versions = {}
    for group, entry in recipe.prompts.items():
        version = register_prompt(
            client, entry["name"], recipe.prompt_texts[group], entry["sha256"]
        )
        versions[group] = str(version.version)
        on_conflict(partial(list_in_experiment, client, entry["name"], experiment_id))
    link_prompts(client, run_id, [(recipe.prompts[g]["name"], v) for g, v in versions.items()])
    return versions


def mark_training_experiment(client: MlflowClient, experiment_id: str) -> None:
    """Tag the experiment for MLflow's model-training view unless it has a kind already."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment(experiment_id)
    if EXPERIMENT_KIND in experiment.tags:
        return
    try:
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND, TRAINING_KIND)
    except MlflowException:
        # another run of the same experiment set it at the same moment (a unique-key clash)
        if EXPERIMENT_KIND not in client.get_experiment(experiment_id).tags:
            raise


def log_datasets(client: MlflowClient, run_id: str, datasets: Sequence[SplitDataset]) -> None:
    """Log each split as an input of the run, with its context (one call)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    inputs = [
        DatasetInput(
            Dataset(
                name=d.name,
                digest=d.digest,
                source_type="local",
                source=json.dumps(d.source()),
                schema=json.dumps(d.schema()),
                profile=json.dumps(d.profile()),
            ),
            tags=[InputTag(MLFLOW_DATASET_CONTEXT, d.context)],
        )
        for d in datasets
    ]
    if inputs:  # the store reuses a dataset of the same name and digest: a retry links to it
        on_conflict(lambda: client.log_inputs(run_id, datasets=inputs))


def run_datasets(run: Run) -> dict[str, str]:
    """Dataset name -> digest of a run's dataset inputs (``{}`` when it has none)."""
    inputs = getattr(run, "inputs", None)
    found = getattr(inputs, "dataset_inputs", None) or []
    return {i.dataset.name: i.dataset.digest for i in found}


def register_prompt(client: MlflowClient, name: str, text: str, sha256: str) -> PromptVersion:
    """The registry version of ``name`` holding ``text``: the existing one, else a new one.

    Versions are found by their tag :data:`PROMPT_SHA256`, so registering the same text twice gives
    the same version. Jobs that register a new text at once may each create a version; each job
    then uses the earliest and deletes the one it made, so one version is left.

    Args:
        client: a client of the store (sqlite or server).
        name: the stable registry name (``slca_exp.recipe.components.prompt_registry_name``).
        text: the template (or rule) text.
        sha256: sha256 (hex) of ``text``.

    """
    message = f"slca-exp: template sha256 {sha256[:12]}"
    made: list[PromptVersion] = []

    def get_or_create() -> PromptVersion:
        found = _version_with(client, name, sha256)
        if found is not None:
            return found
        made.append(client.register_prompt(name, text, message, tags={PROMPT_SHA256: sha256}))
        return _version_with(client, name, sha256) or made[-1]  # the earliest: ours or theirs

    # A conflict: another job is creating the prompt, or the same version number, right now.
    chosen = on_conflict(get_or_create)
    for version in made:
        if int(version.version) != int(chosen.version):
            client.delete_prompt_version(name, str(version.version))
    return chosen


def list_in_experiment(client: MlflowClient, name: str, experiment_id: str) -> None:
    """List prompt ``name`` in the experiment's Prompts tab (MLflow's experiment-ids tag).

    MLflow lists a newly registered version under the process's default experiment, from a
    thread; that thread is waited for first, so that both writes of the tag keep their id.
    """
    from mlflow.prompt.constants import PROMPT_EXPERIMENT_IDS_TAG_KEY

    for thread in threading.enumerate():
        if thread.name.startswith("link_prompt_to_experiment_thread"):
            thread.join(timeout=30)
    # Read, add, write, read again: a job of another experiment writing the tag at the same
    # moment may have replaced this one's value with its own.
    for _ in range(CONFLICT_ATTEMPTS):
        prompt = client.get_prompt(name)
        tag = prompt.tags.get(PROMPT_EXPERIMENT_IDS_TAG_KEY) or ""
        listed = [i for i in tag.split(",") if i]
        if experiment_id in listed:
            return
        value = f",{','.join([*listed, experiment_id])},"
        client.set_prompt_tag(name, PROMPT_EXPERIMENT_IDS_TAG_KEY, value)


def prompt_versions(client: MlflowClient, name: str) -> list[PromptVersion]:
    """Every version of prompt ``name``, oldest first (``[]`` when there is no such prompt)."""
    from mlflow.exceptions import MlflowException

    out: list[PromptVersion] = []
    token = None
    try:
        while True:
            page = client.search_prompt_versions(name, max_results=100, page_token=token)
            out += list(page)
            token = page.token
            if not token:
                break
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return []
    return sorted(out, key=lambda v: int(v.version))


def _version_with(client: MlflowClient, name: str, sha256: str) -> PromptVersion | None:
    matching = [v for v in prompt_versions(client, name) if v.tags.get(PROMPT_SHA256) == sha256]
    return matching[0] if matching else None


def link_prompts(client: MlflowClient, run_id: str, prompts: Sequence[tuple[str, str]]) -> None:
    """Link prompt versions ``(name, version)`` to the run (the run page's Registered prompts).

    Written as MLflow's ``mlflow.linkedPrompts`` run tag through this client:
    ``MlflowClient.link_prompt_version_to_run`` writes it through the process-wide tracking
    store, which is not this client's store when several stores are in use.
    """
    from mlflow.tracing.constant import TraceTagKey

    if not prompts:
        return
    current = client.get_run(run_id).data.tags.get(TraceTagKey.LINKED_PROMPTS)
    linked = json.loads(current) if current else []
    for name, version in prompts:
        entry = {"name": name, "version": str(version)}
        if entry not in linked:
            linked.append(entry)
    client.set_tag(run_id, TraceTagKey.LINKED_PROMPTS, json.dumps(linked))


def linked_prompts(run: Run) -> list[dict[str, str]]:
    """The ``{"name", "version"}`` prompt versions linked to a run."""
    from mlflow.tracing.constant import TraceTagKey

    value = run.data.tags.get(TraceTagKey.LINKED_PROMPTS)
    return json.loads(value) if value else []


def log_policy(
    client: MlflowClient,
    run_id: str,
    path: Path,
    *,
    name: str,
    fingerprint: str,
    step: int,
    copy: bool,
) -> LoggedModel:
    """Record the trained policy at ``path`` (a folder or a file) as a logged model of the run.

    Args:
        client: a client of the run's store.
        run_id: the run that trained it (the model's source run; the run lists it as output).
        path: the weights.
        name: the model's name.
        fingerprint: the short recipe fingerprint (tag :data:`FINGERPRINT`).
        step: the training step the weights are from.
        copy: upload the files into the model's artifacts; ``False``: record only where they
            are (tags :data:`MODEL_PATH` and MLflow's external-model tag), for weights too large
            to copy (``tracking.log_model=false``).

    """
    from mlflow.entities import LoggedModelOutput
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_IS_EXTERNAL

    path = Path(path).resolve()
    experiment_id = client.get_run(run_id).info.experiment_id
    tags = {FINGERPRINT: fingerprint, MODEL_PATH: path.as_uri()}
    if not copy:
        tags[MLFLOW_MODEL_IS_EXTERNAL] = "true"
    model = client.create_logged_model(
        experiment_id, name=name, source_run_id=run_id, tags=tags, model_type=MODEL_TYPE
    )
    if copy and path.is_dir():
        client.log_model_artifacts(model.model_id, str(path))
    elif copy:
        with tempfile.TemporaryDirectory(prefix="slca-exp-model-") as tmp:
            (Path(tmp) / path.name).symlink_to(path)
            client.log_model_artifacts(model.model_id, tmp)
    model = client.finalize_logged_model(model.model_id, "READY")
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step)])
    return model
