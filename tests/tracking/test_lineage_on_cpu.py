"""The run's splits, prompts and policy in MLflow's own terms, on a real sqlite store."""

import hashlib
import json
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow import MlflowClient

from slca_exp.analysis.comparability import differences
from slca_exp.core.tags import EXPERIMENT_KIND, FINGERPRINT, MODEL_PATH, PROMPT_SHA256
from slca_exp.engines.verl.engine import final_hf_checkpoint
from slca_exp.judges import JUDGES
from slca_exp.preflight.compose import compose_run
from slca_exp.preflight.validate import validate
from slca_exp.recipe import build_recipe
from slca_exp.recipe.components import prompt_registry_name
from slca_exp.simulators import SIMULATORS
from slca_exp.tracking import lineage

TEXTS = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One sqlite store and an experiment for the module; tests use their own names and runs."""
    root = tmp_path_factory.mktemp("lineage")
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.create_experiment("lineage", artifact_location=(root / "art").as_uri())
    return client, experiment, root


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipe")
    return build_recipe(validate(compose_run([f"tracking.root={root}", "data.rows=32"])))


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(texts=st.lists(TEXTS, min_size=1, max_size=4), order=st.randoms(use_true_random=False))
def test_one_prompt_version_per_sha256_whatever_the_order(store, texts, order):
    client, _, _ = store
    name = f"p-{uuid.uuid4().hex[:10]}"
    sequence = texts + texts  # every text registered at least twice
    order.shuffle(sequence)
    versions = {}
    for text in sequence:
        version = lineage.register_prompt(client, name, text, sha(text))
        assert version.template == text
        assert versions.setdefault(text, version.version) == version.version
    registered = lineage.prompt_versions(client, name)
    assert len(registered) == len(set(texts))
    assert {v.tags[PROMPT_SHA256] for v in registered} == {sha(t) for t in texts}


def test_a_racing_duplicate_version_is_deleted_and_the_first_one_used(store):
    client, _, _ = store
    name = f"race-{uuid.uuid4().hex[:10]}"
    first = client.register_prompt(name, "same", tags={PROMPT_SHA256: sha("same")})
    # What a job sees when another registered the same text after its own search.
    assert lineage.register_prompt(client, name, "same", sha("same")).version == first.version
    late = client.register_prompt(name, "same", tags={PROMPT_SHA256: sha("same")})
    assert int(late.version) > int(first.version)
    assert lineage.register_prompt(client, name, "same", sha("same")).version == first.version


def test_every_backend_registers_the_text_its_recipe_hashes(tmp_path):
    for group, registry, choices in (
        ("judge", JUDGES, ("rubric", "openai")),
        ("simulator", SIMULATORS, ("replay", "sgls")),
    ):
        assert set(choices) <= set(registry.names())
        for choice in choices:
            config = validate(compose_run([f"tracking.root={tmp_path}", f"{group}={choice}"]))
            recipe = build_recipe(config)
            svc = getattr(config, group)
            text = registry.get(svc.backend).prompt_text(svc)
            assert sha(text) == getattr(recipe, group)["prompt_sha256"]
            entry = recipe.prompts[group]
            assert entry == {
                "name": prompt_registry_name(group, getattr(recipe, group)),
                "sha256": sha(text),
                "version": None,
            }
            assert recipe.prompt_texts[group] == text
            assert "prompt_texts" not in recipe.to_dict()
            assert recipe.fingerprint == recipe.with_prompt_versions({group: "7"}).fingerprint


def test_a_run_lists_its_splits_prompts_and_the_experiment_kind(store, recipe):
    client, experiment, _ = store
    run = client.create_run(experiment)
    versions = lineage.record_run_lineage(client, run.info.run_id, experiment, recipe)
    again = client.create_run(experiment)
    assert lineage.record_run_lineage(client, again.info.run_id, experiment, recipe) == versions

    assert client.get_experiment(experiment).tags[EXPERIMENT_KIND] == lineage.TRAINING_KIND
    found = client.get_run(run.info.run_id)
    inputs = {i.dataset.name: i for i in found.inputs.dataset_inputs}
    files = recipe.data["files"]
    assert set(inputs) == {f"synthetic-{split}" for split in ("sft", "train", "val")}
    for split, entry in files.items():
        got = inputs[f"synthetic-{split}"]
        assert got.dataset.digest == entry["sha256"][: lineage.DIGEST_CHARS]
        assert json.loads(got.dataset.profile) == {
            "num_rows": entry["rows"],
            "sha256": entry["sha256"],
        }
        assert json.loads(got.dataset.source) == {"uri": Path(entry["path"]).as_uri()}
        assert got.dataset.source_type == "local"
        columns = {c["name"] for c in json.loads(got.dataset.schema)["mlflow_colspec"]}
        assert {"prompt", "reward_model", "extra_info"} <= columns
        context = {t.key: t.value for t in got.tags}["mlflow.data.context"]
        assert context == ("validation" if split == "val" else "training")
    # The Datasets filter of the runs page: a search by dataset name and digest.
    digest = files["train"]["sha256"][: lineage.DIGEST_CHARS]
    hits = client.search_runs(
        [experiment], f"datasets.name = 'synthetic-train' AND datasets.digest = '{digest}'"
    )
    assert {r.info.run_id for r in hits} >= {run.info.run_id, again.info.run_id}
    assert lineage.run_datasets(found) == {
        f"synthetic-{s}": e["sha256"][: lineage.DIGEST_CHARS] for s, e in files.items()
    }
    linked = lineage.linked_prompts(found)
    assert linked == [{"name": recipe.prompts[g]["name"], "version": versions[g]} for g in versions]
    for group, version in versions.items():
        prompt = client.get_prompt_version(recipe.prompts[group]["name"], version)
        assert prompt.template == recipe.prompt_texts[group]
        tags = client.get_prompt(recipe.prompts[group]["name"]).tags
        assert f",{experiment}," in tags["_mlflow_experiment_ids"]


def test_a_kind_the_user_set_is_kept(store):
    client, _, root = store
    mine = client.create_experiment("genai", tags={EXPERIMENT_KIND: "genai_development"})
    lineage.mark_training_experiment(client, mine)
    assert client.get_experiment(mine).tags[EXPERIMENT_KIND] == "genai_development"


@pytest.mark.parametrize("copy", [True, False])
def test_the_policy_is_a_logged_model_of_its_run(store, tmp_path, copy):
    client, experiment, _ = store
    run = client.create_run(experiment)
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "config.json").write_text("{}")
    (policy / "model.safetensors").write_bytes(b"\0" * 64)
    model = lineage.log_policy(
        client, run.info.run_id, policy, name="policy", fingerprint="abc123", step=7, copy=copy
    )
    assert model.source_run_id == run.info.run_id and str(model.status) == "READY"
    assert model.tags[FINGERPRINT] == "abc123"
    assert model.tags[MODEL_PATH] == policy.as_uri()
    outputs = client.get_run(run.info.run_id).outputs.model_outputs
    assert [(o.model_id, o.step) for o in outputs] == [(model.model_id, 7)]
    files = {f.path for f in client.list_logged_model_artifacts(model.model_id)}
    if copy:
        assert files == {"config.json", "model.safetensors"}
        assert "mlflow.model.isExternal" not in model.tags
    else:
        assert files == set()  # a reference: the weights stay where they are
        assert model.tags["mlflow.model.isExternal"] == "true"


def test_the_comparability_guard_reads_the_split_from_dataset_inputs(store, recipe):
    client, experiment, _ = store
    datasets = lineage.split_datasets(recipe)
    other = [
        lineage.SplitDataset(d.split, d.name, d.path, "f" * 64, d.rows) if d.split == "train" else d
        for d in datasets
    ]
    runs = []
    for logged in (datasets, datasets, other):
        run = client.create_run(experiment, tags={"slca.data": "synthetic:same-tag"})
        lineage.log_datasets(client, run.info.run_id, logged)
        runs.append(client.get_run(run.info.run_id))  # no recipe.json: the inputs decide
    assert differences(client, runs[:2], swept=[]) == []
    (diff,) = differences(client, runs, swept=[])
    assert diff.component == "data"
    assert sorted(len(r) for r in diff.values.values()) == [1, 2]
    assert differences(client, runs, swept=["data.seed"]) == []


def test_verl_s_final_hf_checkpoint_is_found_when_verl_wrote_one(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    assert final_hf_checkpoint(checkpoints) is None
    checkpoints.mkdir()
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("12\n")
    hf = checkpoints / "global_step_12" / "actor" / "huggingface"
    hf.mkdir(parents=True)
    assert final_hf_checkpoint(checkpoints) is None  # verl saved no HF weights
    (hf / "config.json").write_text("{}")
    assert final_hf_checkpoint(checkpoints) == (hf, 12)


@pytest.mark.parametrize(
    ("judge", "roles"), [("openai", {"outcome", "outcome_fallback"}), ("rubric", {"outcome"})]
)
def test_the_outcome_judges_prompts_are_registered_and_linked(store, tmp_path, judge, roles):
    client, experiment, _ = store
    config = validate(
        compose_run(
            [f"tracking.root={tmp_path}", "data.rows=32", "reward=exec_outcome", f"judge={judge}"]
        )
    )
    recipe = build_recipe(config)
    outcome = recipe.reward["outcome"]
    assert set(recipe.prompts) == {"judge", "simulator"} | roles
    assert sha(recipe.prompt_texts["outcome"]) == outcome["prompt_sha256"]
    if "outcome_fallback" in roles:
        assert sha(recipe.prompt_texts["outcome_fallback"]) == outcome["fallback_prompt_sha256"]
        assert recipe.prompts["outcome"]["name"] == "slca-exp.outcome.exec_outcome_check_v1"
    run = client.create_run(experiment)
    versions = lineage.record_run_lineage(client, run.info.run_id, experiment, recipe)
    linked = {p["name"] for p in lineage.linked_prompts(client.get_run(run.info.run_id))}
    assert {recipe.prompts[role]["name"] for role in roles} <= linked
    for role in roles:
        prompt = client.get_prompt_version(recipe.prompts[role]["name"], versions[role])
        assert prompt.template == recipe.prompt_texts[role]
    # The HierR recipe of the same run has no outcome judge and keeps its fingerprint.
    plain = build_recipe(validate(compose_run([f"tracking.root={tmp_path}", "data.rows=32"])))
    assert "outcome" not in plain.reward and "tool_reward" not in plain.reward
    assert recipe.fingerprint != plain.fingerprint


class _Refused(Exception):
    """An error as MLflow raises it: a message, sometimes an error code."""

    def __init__(self, message, error_code=None):
        super().__init__(message)
        self.error_code = error_code


CONFLICTS = [  # each store's wording of "another writer made that record a moment ago"
    _Refused("BAD_REQUEST: (sqlite3.IntegrityError) UNIQUE constraint failed: datasets.name"),
    _Refused('duplicate key value violates unique constraint "datasets_pk"'),
    _Refused("(1062, \"Duplicate entry 'x' for key 'PRIMARY'\")"),
    _Refused("Model 'm' already exists", error_code="RESOURCE_ALREADY_EXISTS"),
]


@pytest.mark.parametrize("conflict", CONFLICTS, ids=["sqlite", "postgres", "mysql", "code"])
def test_a_conflict_is_met_again_until_the_record_is_found(conflict):
    calls, waits = [], []

    def get_or_create():
        calls.append(1)
        if len(calls) < 3:
            raise conflict
        return "the record"

    assert lineage.is_conflict(conflict)
    assert lineage.on_conflict(get_or_create, sleep=waits.append) == "the record"
    assert len(calls) == 3 and len(waits) == 2 and all(0 < w <= 0.2 for w in waits)


def test_another_error_is_raised_at_once_and_a_conflict_that_persists_in_the_end():
    calls = []

    def broken():
        calls.append(1)
        raise _Refused("PERMISSION_DENIED: no", error_code="PERMISSION_DENIED")

    with pytest.raises(_Refused, match="PERMISSION_DENIED"):
        lineage.on_conflict(broken, sleep=lambda _: None)
    assert len(calls) == 1
    calls.clear()

    def stuck():
        calls.append(1)
        raise CONFLICTS[0]

    with pytest.raises(_Refused, match="UNIQUE constraint failed"):
        lineage.on_conflict(stuck, attempts=4, sleep=lambda _: None)
    assert len(calls) == 4
