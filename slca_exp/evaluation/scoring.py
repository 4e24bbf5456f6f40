"""A run's checkpoint, served by vLLM and scored by the benchmark's own checker, into its run.

    run        -> its checkpoint: the run's logged model (``policy``), the folder it records
                  (tag ``slca.path``) or, where that is not on this machine, its copied files
    key        -> sha256 of the benchmark's identity, the checkpoint and how it was served:
                  a run whose tag ``slca.eval.<name>.key`` holds it already has these scores
                  (reused unless ``eval.rescore=true``)
    serve      -> ``vllm serve <checkpoint> --enable-auto-tool-choice --tool-call-parser hermes``
                  on a free port of 127.0.0.1 (vLLM's CUDA or CPU build: ``eval.device``)
    score      -> the benchmark's driver in the benchmark's environment against that server
    log        -> into the same MLflow run: metrics ``eval/<name>/<category>`` and
                  ``eval/<name>/overall`` at the checkpoint's step, the item table
                  ``eval/<name>/items.json``, ``eval/<name>/eval.json`` (benchmark, serving,
                  checkpoint, server command, environment record) and the tags
                  ``slca.eval.<name>.{version,key,checkpoint,categories,per_category,seed}``

``overall`` is the unweighted mean of the scored categories' accuracies (BFCL averages its
categories so within a section); with a sample (``per_category``) each category's accuracy is
over its sampled items.
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from slca_exp.core.names import EVAL_OVERALL, eval_metric
from slca_exp.core.tags import MODEL_PATH, RUN_NAME, eval_tag
from slca_exp.evaluation import bfcl_driver
from slca_exp.evaluation.benchmark import TAU2_UNAVAILABLE, Benchmark
from slca_exp.evaluation.environment import BenchmarkEnv
from slca_exp.evaluation.settings import EvalSettings, served_checkpoint

POLICY = "policy"
"""The name of a run's logged model that holds its final policy."""
DRIVER_TIMEOUT_S = 6 * 3600


class EvalError(RuntimeError):
    """A run that cannot be scored: no checkpoint, a server that never answered, a failed driver."""


@dataclass(frozen=True)
class Checkpoint:
    """A run's final policy: where its files are and what identifies it."""

    run_id: str
    run_name: str
    model_id: str
    step: int
    folder: str

    @property
    def served_name(self) -> str:
        """The model id the server answers to: the run's name, else its id."""
        return self.run_name or self.run_id


@dataclass(frozen=True)
class Scores:
    """What one eval found: per-category accuracy, the overall score, the items."""

    categories: dict[str, dict[str, float]]
    items: list[dict[str, Any]]

    @property
    def overall(self) -> float:
        """The unweighted mean of the categories' accuracies."""
        values = [c["accuracy"] for c in self.categories.values()]
        return sum(values) / len(values) if values else math.nan


def checkpoint_of(client: Any, run: Any, scratch: Path) -> Checkpoint:  # noqa: ANN401
    """The run's final policy: the folder its logged model records, else its copied files.

    Raises:
        EvalError: the run logged no policy (it did not finish, or ``tracking`` logged no
            model), or its files are neither where it trained nor in MLflow.

    """
    run_id = run.info.run_id
    outputs = list(getattr(run.outputs, "model_outputs", None) or [])
    models = [(o.step, client.get_logged_model(o.model_id)) for o in outputs]
    models = [(step, m) for step, m in models if m.name == POLICY]
    if not models:
        raise EvalError(
            f"run {run_id} has no logged model named {POLICY!r}: only a run that trained to "
            "the end with MLflow on (tracking.backends has mlflow) has a checkpoint to score"
        )
    step, model = max(models, key=lambda pair: pair[0])
    recorded = urlparse(model.tags.get(MODEL_PATH, ""))
    folder = Path(url2pathname(recorded.path)) if recorded.scheme == "file" else None
    if folder is None or not (folder / "config.json").is_file():
        folder = _download(model, scratch / model.model_id)
    return Checkpoint(run_id, run.data.tags.get(RUN_NAME, ""), model.model_id, step, str(folder))


def _download(model: Any, into: Path) -> Path:  # noqa: ANN401
    import mlflow

    try:
        into.mkdir(parents=True, exist_ok=True)
        found = Path(mlflow.artifacts.download_artifacts(model.artifact_location, dst_path=into))
    except Exception as err:  # noqa: BLE001 - MLflow's errors name the store and the cause
        raise EvalError(
            f"the checkpoint of logged model {model.model_id} is neither where it was trained "
            f"({model.tags.get(MODEL_PATH)}) nor in MLflow ({err})"
        ) from None
    configs = sorted(found.rglob("config.json"))
    if not configs:
        raise EvalError(
            f"logged model {model.model_id} holds no HF checkpoint (no config.json): it was "
            "logged by reference (tracking.log_model=false) from another machine"
        )
    return configs[0].parent


def eval_key(benchmark: Benchmark, checkpoint: Checkpoint, settings: EvalSettings) -> str:
    """What decides the scores: the benchmark, the checkpoint and how it is served."""
    serving = asdict(settings)
    for volatile in ("launcher", "env_root", "resources", "rescore", "health_timeout_s"):
        serving.pop(volatile)
    canonical = json.dumps(
        {"benchmark": benchmark.identity(), "checkpoint": checkpoint.model_id, "serving": serving},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def scored_already(run: Any, benchmark: Benchmark, key: str) -> bool:  # noqa: ANN401
    """Whether the run holds this benchmark's scores of this checkpoint, served this way."""
    return run.data.tags.get(eval_tag(benchmark.name, "key")) == key


def score(
    checkpoint: Checkpoint,
    benchmark: Benchmark,
    settings: EvalSettings,
    env: BenchmarkEnv,
    work: Path,
    say=print,  # noqa: ANN001
) -> tuple[Scores, dict[str, Any]]:
    """Serve the checkpoint, run the benchmark's driver against it; the scores and what ran.

    Raises:
        EvalError: the server did not come up, or the driver failed (its log is named).

    """
    if benchmark.kind != "bfcl":
        raise EvalError(TAU2_UNAVAILABLE)
    from slca_exp.launch.service_job import ServeError, local_server

    work.mkdir(parents=True, exist_ok=True)
    definition = served_checkpoint(settings, checkpoint.folder, checkpoint.served_name)
    server_log, driver_log = work / "server.log", work / "driver.log"
    say(f"serving {checkpoint.folder} as {checkpoint.served_name} (log: {server_log})")
    start = time.monotonic()
    try:
        with local_server(definition, log=server_log) as (base_url, served, command):
            up_s = time.monotonic() - start
            say(f"served at {base_url} by {served.version or 'a server'} in {up_s:.0f} s; scoring")
            spec = {
                "work": str(work / "bfcl"),
                "base_url": base_url,
                "model": checkpoint.served_name,
                "categories": list(benchmark.categories),
                "per_category": benchmark.per_category,
                "seed": benchmark.seed,
                "temperature": benchmark.temperature,
                "max_tokens": benchmark.max_tokens,
                "threads": benchmark.threads,
            }
            Path(spec["work"]).mkdir(parents=True, exist_ok=True)
            spec_file = work / "spec.json"
            spec_file.write_text(json.dumps(spec, indent=1))
            driver = [str(env.python), bfcl_driver.__file__, str(spec_file)]
            with open(driver_log, "wb") as log:
                done = subprocess.run(
                    driver,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=DRIVER_TIMEOUT_S,
                    check=False,
                )
    except ServeError as err:
        raise EvalError(f"{err} (server log: {server_log})") from None
    if done.returncode != 0:
        tail = driver_log.read_text(errors="replace")[-2000:]
        raise EvalError(
            f"BFCL's driver failed (exit status {done.returncode}; log: {driver_log}):\n{tail}"
        )
    found = json.loads((Path(spec["work"]) / "results.json").read_text())
    ran = {
        "server_command": shlex.join(command),
        "server_version": served.version,
        "server_up_s": round(up_s, 1),
        "score_s": round(time.monotonic() - start - up_s, 1),
        "driver": shlex.join(driver),
    }
    return Scores(found["categories"], found["items"]), ran


def log_scores(
    client: Any,  # noqa: ANN401
    checkpoint: Checkpoint,
    benchmark: Benchmark,
    settings: EvalSettings,
    env: BenchmarkEnv,
    key: str,
    scores: Scores,
    ran: dict[str, Any],
) -> None:
    """The scores into the run that trained the checkpoint: metrics, item table, record, tags."""
    from mlflow.entities import Metric, RunTag

    now = int(time.time() * 1000)
    prefix = benchmark.metric_prefix
    values = {eval_metric(benchmark.name, c): v["accuracy"] for c, v in scores.categories.items()}
    values[eval_metric(benchmark.name, EVAL_OVERALL)] = scores.overall
    metrics = [Metric(k, float(v), now, checkpoint.step) for k, v in values.items()]
    name = benchmark.name
    tags = {
        eval_tag(name, "version"): benchmark.version,
        eval_tag(name, "key"): key,
        eval_tag(name, "checkpoint"): f"{checkpoint.model_id}@{checkpoint.step}",
        eval_tag(name, "categories"): ",".join(benchmark.categories),
        eval_tag(name, "per_category"): str(benchmark.per_category or "all"),
        eval_tag(name, "seed"): str(benchmark.seed),
    }
    client.log_batch(
        checkpoint.run_id, metrics=metrics, tags=[RunTag(k, v) for k, v in tags.items()]
    )
    columns = ("category", "id", "valid", "error_type", "error", "answer")
    table = {column: [item[column] for item in scores.items] for column in columns}
    client.log_table(checkpoint.run_id, data=table, artifact_file=f"{prefix}/items.json")
    record = {
        "benchmark": asdict(benchmark),
        "serving": asdict(settings),
        "checkpoint": asdict(checkpoint),
        "key": key,
        "scores": {**scores.categories, EVAL_OVERALL: scores.overall},
        "ran": ran,
        "environment": {"folder": str(env.folder), **env.record},
    }
    with tempfile.TemporaryDirectory(prefix="slca-exp-eval-") as tmp:
        path = Path(tmp) / "eval.json"
        path.write_text(json.dumps(record, indent=1, default=str) + "\n")
        client.log_artifact(checkpoint.run_id, str(path), artifact_path=prefix)
