"""Every MLflow tag slca-exp writes or reads, defined once, each with its one-line meaning.

    Recipe.tags()             -> BACKBONE, REWARD, JUDGE, SIMULATOR, DATA, ESTIMATOR, FINGERPRINT,
                                 SWEEP on every run (short labels; recipe.json holds the rest)
    the sweep callback        -> parent: SWEEP, ROLE, SWEPT, OVERRIDES, SWEEP_DIR, STUDY,
                                 EXPECTED_JOBS, job_record(n), JOBS_FAILED, JOBS_REPORTED,
                                 SWEEP_ERROR, SERVICE_TAGS, SWEEP_KEY, SWEEP_COMMAND, ATTEMPTS,
                                 attempt_tag(n), moved_tag(run);
                                 children: SWEEP, ROLE, JOB, JOB_STATUS, OVERRIDES, swept_tag(key),
                                 SUPERSEDED_BY
    the engines and trackers  -> STAGE, RESUMED, outage_tag(service), MLflow's own tags below
    lineage                   -> PROMPT_SHA256 on prompt versions; FINGERPRINT and MODEL_PATH
                                 on logged models; EXPERIMENT_KIND on experiments
    slca-exp eval             -> eval_tag(benchmark, field) on the run that trained the checkpoint
    study files (compare)     -> COPY_OF on each run a study file is loaded into
    compare, comparability    <- read them back

Code never spells a tag key as a literal: it uses the constants and helpers below, and a test
fails on a tag key spelled anywhere else in ``slca_exp``. Keys with a dot-separated tail
(``slca.swept.<key>``, ``slca.outage.<service>``, ``slca.jobs.<num>``) are built by the helpers.
"""

from __future__ import annotations

from typing import Final

PREFIX: Final = "slca."
"""Every tag slca-exp defines starts with this (the console and W&B show keys without it)."""

BACKBONE: Final = "slca.backbone"
REWARD: Final = "slca.reward"
JUDGE: Final = "slca.judge"
SIMULATOR: Final = "slca.simulator"
DATA: Final = "slca.data"
ESTIMATOR: Final = "slca.estimator"
FINGERPRINT: Final = "slca.fingerprint"
SWEEP: Final = "slca.sweep"

ROLE: Final = "slca.role"
PARENT_ROLE: Final = "parent"
"""The :data:`ROLE` of a sweep's parent run."""
CHILD_ROLE: Final = "child"
"""The :data:`ROLE` of a sweep job's run."""
SWEPT: Final = "slca.swept"
SWEPT_PREFIX: Final = "slca.swept."
"""Child tags ``slca.swept.<key>`` (:func:`swept_tag`)."""
OVERRIDES: Final = "slca.overrides"
JOB: Final = "slca.job"
JOB_STATUS: Final = "slca.job_status"
SWEEP_DIR: Final = "slca.sweep_dir"
STUDY: Final = "slca.study"
EXPECTED_JOBS: Final = "slca.expected_jobs"
JOB_RECORD_PREFIX: Final = "slca.jobs."
"""Parent tags ``slca.jobs.<num>`` (:func:`job_record`): each job's record (JSON)."""
JOBS_FAILED: Final = "slca.jobs.failed"
JOBS_REPORTED: Final = "slca.jobs.reported"
SWEEP_ERROR: Final = "slca.sweep_error"
SWEEP_KEY: Final = "slca.sweep_key"
SWEEP_COMMAND: Final = "slca.command"
ATTEMPTS: Final = "slca.attempts"
ATTEMPT_PREFIX: Final = "slca.attempt."
"""Parent tags ``slca.attempt.<n>`` (:func:`attempt_tag`): each attempt's record (JSON)."""
MOVED_PREFIX: Final = "slca.moved."
"""Parent tags ``slca.moved.<run id>`` (:func:`moved_tag`): a run another sweep resumed."""
SUPERSEDED_BY: Final = "slca.superseded_by"
COPY_OF: Final = "slca.copy_of"
JUDGE_SERVICE: Final = "slca.service.judge"
SIMULATOR_SERVICE: Final = "slca.service.simulator"
SERVICE_TAGS: Final[dict[str, str]] = {"judge": JUDGE_SERVICE, "simulator": SIMULATOR_SERVICE}
"""Parent tags: the service (``slca-exp serve``) every job of the sweep resolves its judge or
simulator to, as ``<name>@<fingerprint, 12 hex digits>`` (the name alone before it answers)."""

STAGE: Final = "slca.stage"
SFT_STAGE: Final = "sft"
"""The :data:`STAGE` of the verl engine's SFT run (a child of the recipe's run)."""
RESUMED: Final = "slca.resumed"
OUTAGE_PREFIX: Final = "slca.outage."
"""Run tags ``slca.outage.<service>`` (:func:`outage_tag`)."""

EVAL_PREFIX: Final = "slca.eval."
"""Run tags ``slca.eval.<benchmark>.<field>`` (:func:`eval_tag`): what a benchmark scored."""

PROMPT_SHA256: Final = "slca.sha256"
MODEL_PATH: Final = "slca.path"

PARENT_RUN: Final = "mlflow.parentRunId"
RUN_NAME: Final = "mlflow.runName"
SOURCE_NAME: Final = "mlflow.source.name"
SOURCE_TYPE: Final = "mlflow.source.type"
GIT_COMMIT: Final = "mlflow.source.git.commit"
RUN_NOTE: Final = "mlflow.note.content"
EXPERIMENT_KIND: Final = "mlflow.experimentKind"

COMPONENT_TAGS: Final[dict[str, str]] = {
    "backbone": BACKBONE,
    "reward": REWARD,
    "judge": JUDGE,
    "simulator": SIMULATOR,
    "data": DATA,
}
"""Recipe component -> the run tag holding its short label."""


def swept_tag(key: str) -> str:
    """``slca.swept.{key}``: a sweep job's value of a swept config key."""
    return SWEPT_PREFIX + key


def job_record(num: int) -> str:
    """``slca.jobs.{num:04d}``: the parent's record of sweep job ``num``."""
    return f"{JOB_RECORD_PREFIX}{num:04d}"


def is_job_record(key: str) -> bool:
    """Whether ``key`` is a :func:`job_record` tag (not :data:`JOBS_FAILED` or the like).

    >>> is_job_record(job_record(3)), is_job_record(JOBS_FAILED)
    (True, False)
    """
    return key.startswith(JOB_RECORD_PREFIX) and key[len(JOB_RECORD_PREFIX) :].isdigit()


def attempt_tag(num: int) -> str:
    """``slca.attempt.{num}``: the parent's record of the sweep's attempt ``num`` (1 first)."""
    return f"{ATTEMPT_PREFIX}{num}"


def moved_tag(run_id: str) -> str:
    """``slca.moved.{run_id}``: on the parent a run left when another sweep resumed it."""
    return f"{MOVED_PREFIX}{run_id}"


def outage_tag(service: str) -> str:
    """``slca.outage.{service}``: the RL steps in which every request to the service failed."""
    return f"{OUTAGE_PREFIX}{service}"


def eval_tag(benchmark: str, field: str) -> str:
    """``slca.eval.{benchmark}.{field}``: what ``slca-exp eval`` scored the run's checkpoint on.

    >>> eval_tag("bfcl", "version")
    'slca.eval.bfcl.version'
    """
    return f"{EVAL_PREFIX}{benchmark}.{field}"


def short(key: str) -> str:
    """The key without :data:`PREFIX`, as the console and W&B show it.

    >>> short(BACKBONE)
    'backbone'
    """
    return key.removeprefix(PREFIX)


TAGS: Final[dict[str, str]] = {
    BACKBONE: "the policy: source, name or path, revision",
    REWARD: "the reward: name/variant",
    JUDGE: "the judge: backend, model, prompt version",
    SIMULATOR: "the simulator: backend, model",
    DATA: "the data split: its origin and seed",
    ESTIMATOR: "the advantage estimator (algorithm.name)",
    FINGERPRINT: "the recipe fingerprint (runs and logged models; equal: same five components)",
    SWEEP: "the sweep id, on the parent and on every job's run ('none' outside a sweep)",
    ROLE: f"'{PARENT_ROLE}' (the sweep's parent run) or '{CHILD_ROLE}' (a job's run)",
    SWEPT: "parent: a JSON list of the swept keys",
    f"{SWEPT_PREFIX}<key>": "child: that job's value of a swept key",
    OVERRIDES: "the sweep's command-line overrides (parent) or the job's (child)",
    JOB: "child: the job number",
    JOB_STATUS: "child: how the job ended (COMPLETED, FAILED, ...)",
    SWEEP_DIR: "parent: the sweep's output folder",
    STUDY: "parent: the ready study the sweep ran (sweep=<name>), if any",
    EXPECTED_JOBS: "parent: how many jobs the sweep launches",
    f"{JOB_RECORD_PREFIX}<num>": "parent: each job's record (JSON), written from inside the job",
    JOBS_FAILED: "parent: jobs that failed",
    JOBS_REPORTED: "parent: jobs that reported",
    SWEEP_ERROR: "parent: why the sweep ended FAILED",
    SWEEP_KEY: "parent: digest of every job's run key (the same command line: the same key)",
    SWEEP_COMMAND: "parent: the train command line that ran the sweep (what --resume runs)",
    ATTEMPTS: "parent: how many times the sweep was run (a resumed sweep adds one)",
    f"{ATTEMPT_PREFIX}<n>": "parent: attempt n's record (JSON): when, the jobs it ran and skipped",
    f"{MOVED_PREFIX}<run id>": "parent: the sweep whose parent run now holds that run (resumed)",
    SUPERSEDED_BY: "child: the run of a later attempt that re-ran this run's job",
    COPY_OF: "a run loaded from a study file: the id the run had (compare shows it)",
    JUDGE_SERVICE: "parent: the judge service every job resolves (name@fingerprint)",
    SIMULATOR_SERVICE: "parent: the simulator service every job resolves (name@fingerprint)",
    STAGE: f"'{SFT_STAGE}' on the verl engine's SFT run",
    RESUMED: "'true' on a run a requeued job resumed",
    f"{OUTAGE_PREFIX}<service>": "the RL steps in which every judge or simulator request failed",
    f"{EVAL_PREFIX}<benchmark>.<field>": "slca-exp eval: the benchmark's version, the scored "
    "checkpoint, categories and sample, and the key a re-run reuses the scores by",
    PROMPT_SHA256: "prompt versions: the sha256 of the text (one version per sha256)",
    MODEL_PATH: "logged models: where the files are on the machine that trained them",
    PARENT_RUN: "MLflow's parent run (the sweep's, or the recipe's run for the SFT stage)",
    RUN_NAME: "MLflow's run name (run_name)",
    SOURCE_NAME: "MLflow's source name of a training run",
    SOURCE_TYPE: "MLflow's source type of a training run",
    GIT_COMMIT: "MLflow's git commit of the code that ran",
    RUN_NOTE: "MLflow's run description (the sweep parent's)",
    EXPERIMENT_KIND: "MLflow's experiment tag for what it holds (GenAI apps or model training)",
}
"""Every tag key (``<...>`` marks a helper's variable tail) -> its meaning."""
