"""The paper's ready studies: ``--dry-run`` validates and prints every job.

On the paper's recipe (verl's own checks of each translated config included) and at smoke scale.
"""

import pytest

from tests.paper_splits import toucan_named_folder
from tests.skip_policy import require

require("verl", reason="needs the verl extra")

from omegaconf import OmegaConf  # noqa: E402

from slca_exp.commands import main  # noqa: E402
from slca_exp.launch.command import study_notes, study_overrides  # noqa: E402
from slca_exp.preflight.compose import CONFIG_DIR  # noqa: E402

STUDIES = {
    # study -> (jobs, the swept values each job has, what its comment says it mirrors)
    "paper_main": (9, ["algorithm=grpo", "algorithm=toolpo_grpo", "algorithm=slca_grpo"], "main"),
    "paper_ablations": (
        12,
        [f"ablation={a}" for a in ("full", "no_slca", "no_sgls", "no_hierr")],
        "ablation",
    ),
    "paper_hierr_sensitivity": (
        12,
        [f"hierr_weights={w}" for w in ("default", "uniform", "name_heavy", "value_heavy")],
        "sensitivity",
    ),
    "paper_grad_cosine": (2, ["algorithm=grpo", "algorithm=slca_grpo"], "gradient-conflict"),
    "exec_control": (12, ["reward=hierr_paper", "reward=exec_outcome"], "execution-reward"),
}
SUBMITTED = ["launcher=slurm_gpu_4node", "launcher.partition=null", "--offline"]
"""Submitted to the paper's cluster profile (no GPU wanted here), servers started with the job."""


@pytest.fixture(scope="module")
def toucan(tmp_path_factory):
    """A folder holding tiny splits under the paper's Toucan file names."""
    return toucan_named_folder(tmp_path_factory, 32)


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_the_dry_run_validates_and_prints_every_job_on_the_papers_recipe(
    study, toucan, here, capsys
):
    jobs, values, _ = STUDIES[study]
    given = ["train", "--dry-run", "-m", f"sweep={study}", f"data.dir={toucan}", *SUBMITTED]
    assert main(given) == 0
    out = capsys.readouterr().out
    printed = [line.strip() for line in out.splitlines() if line.strip().startswith("#")]
    printed = [line for line in printed if line.split(":", 1)[0][1:].isdigit()]
    assert len(printed) == jobs
    assert all("experiment=paper_7b" in line for line in printed)
    for value in values:
        assert sum(value in line.split() for line in printed) == jobs // len(values)
    assert out.count("verl config checked and written to") == jobs  # verl's own checks, each job
    assert f"--array=0-{jobs - 1}%" in out
    written = sorted(here.rglob("ppo_trainer.yaml"))
    assert len(written) == jobs
    sections = [OmegaConf.load(p).slca_exp for p in written]
    if study == "exec_control":  # the reward workers get the outcome reward and its judge
        tool_rewards = sorted(s.reward.tool_reward for s in sections)
        assert tool_rewards == ["hierr"] * 6 + ["outcome"] * 6
    if study == "paper_ablations":  # the ablations score with v8.2, the full method as published
        assert sorted(s.reward.name for s in sections) == ["hierr_paper"] * 3 + ["hierr_v82"] * 9
        guided = sorted(s.simulator.schema_guidance for s in sections)
        assert guided == [False] * 3 + [True] * 9
    if study == "paper_grad_cosine":  # the diagnostic reaches verl's workers
        assert all(s.grad_cos for s in sections)


@pytest.mark.parametrize("study", ["paper_main", "paper_ablations", "paper_grad_cosine"])
def test_the_dry_run_at_smoke_scale_validates_every_job(study, here, capsys):
    jobs = STUDIES[study][0]
    tiny = ["backbone=tiny"] if study == "paper_grad_cosine" else []
    assert main(["train", "--dry-run", "-m", f"sweep={study}", "experiment=smoke", *tiny]) == 0
    out = capsys.readouterr().out
    printed = [x for x in out.splitlines() if x.strip()[:1] == "#" and "experiment=smoke" in x]
    assert len(printed) == jobs


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_each_study_says_what_it_mirrors_and_what_it_expects(study):
    head = (CONFIG_DIR / "sweep" / f"{study}.yaml").read_text().split("\n", 1)[0]
    assert "the paper's" in head.lower() and STUDIES[study][2] in head
    assert set(study_notes(study)) == {"question", "design", "expected"}
    assert "experiment=paper_7b" in study_overrides(study)


def test_the_cross_scale_study_is_the_ablation_table_on_each_paper_backbone(here, capsys):
    """tab:full_ablation: paper_ablations' rows and seeds on the three backbones the paper trains.

    Each of its 36 jobs is the ablation study's job with one more override; their verl configs are
    checked by the ablation study's dry run above, so here the grid is read and one backbone's
    jobs are dry-run at smoke scale on the tiny backbone (the paper's weights are not here).
    """
    ablations = study_overrides("paper_ablations")
    cross = study_overrides("paper_cross_scale")
    backbones = [o for o in cross if o.startswith("backbone=")]
    assert [o for o in cross if o not in backbones] == ablations
    assert backbones == ["backbone=qwen2.5-3b-instruct,qwen2.5-7b-instruct,qwen3-8b-base"]
    for name in backbones[0].removeprefix("backbone=").split(","):
        assert (CONFIG_DIR / "backbone" / f"{name}.yaml").is_file()
    given = ["train", "--dry-run", "-m", "sweep=paper_cross_scale", "experiment=smoke"]
    assert main([*given, "backbone=tiny"]) == 0
    out = capsys.readouterr().out
    assert sum(x.strip()[:1] == "#" and "backbone=tiny" in x for x in out.splitlines()) == 12
