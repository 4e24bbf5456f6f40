"""A tiny backbone that has learnt to call tools (a short SFT), and helpers around its rollouts."""

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from slca_exp.backbones import load_backbone
from slca_exp.backbones.chat import render_prompt, render_text, tool_turn_text
from slca_exp.config.schema import BackboneConfig, SFTConfig, TinyArchConfig
from slca_exp.config.services import SimulatorConfig
from slca_exp.core.rows import Row
from slca_exp.data.splits import load_split
from slca_exp.data.synthetic import generate
from slca_exp.engines.local import data_io
from slca_exp.engines.local.rollout import Roller
from slca_exp.engines.local.sft import train_sft
from slca_exp.simulators import build_simulator


def quick_runs(folder: Path) -> list[str]:
    """Overrides of a few quick RL steps from the checkpoint in ``folder`` (the tests' sweeps).

    The split it was fine-tuned on, a short SFT (the first job of a seed trains it, the others
    load its cached weights), 4 validation prompts, 2 groups of 4 per step.
    """
    return [
        "data.rows=16",
        "data.seed=0",
        "backbone.source=local",
        "backbone.name=tool-caller",
        f"backbone.path={folder}",
        "engine.sft.steps=4",
        "engine.sft.batch_size=4",
        "engine.sft.lr=1e-4",
        "engine.val_rows=4",
        "algorithm.group_size=4",
        "engine.rollout.prompts_per_step=2",
        "engine.rollout.max_turn_tokens=48",
        "engine.rollout.max_response_tokens=128",
        "engine.progress=false",
    ]


@dataclass(frozen=True)
class QuickSweep:
    """What a sweep of :func:`quick_sweep` left: where, its store and runs."""

    folder: Path
    env: dict[str, str]
    uri: str
    client: object
    parent: object
    children: list


def quick_sweep(folder: Path, checkpoint: Path, *overrides: str) -> QuickSweep:
    """``slca-exp train -m`` of :func:`quick_runs` and ``overrides`` in ``folder``, 4 jobs."""
    from mlflow.tracking import MlflowClient

    from tests.tracking.sweeps import SLCA_EXE

    args = [SLCA_EXE, "train", "-m", *quick_runs(checkpoint), *overrides]
    args.append(f"tracking.root={folder / 'out'}")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    res = subprocess.run(args, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    uri = f"sqlite:///{folder / 'out' / 'mlflow.db'}"
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("slca-exp").experiment_id])
    children = [r for r in runs if r.data.tags.get("slca.role") == "child"]
    assert len(children) == 4
    parent = next(r for r in runs if r.data.tags.get("slca.role") == "parent")
    return QuickSweep(folder, env, uri, client, parent, children)


@dataclass(frozen=True)
class ToolCaller:
    """A saved checkpoint folder of a tiny model fine-tuned on gold tool-calling trajectories.

    Attributes:
        folder: the HF checkpoint (weights, tokenizer, chat template, generation config).
        rows: the synthetic rows it was fine-tuned on (RL layout plus gold ``messages``).

    """

    folder: Path
    rows: list[dict]


def build_tool_caller(root: Path) -> ToolCaller:
    """80 SFT steps: enough for a policy that writes tool calls, gets answers, sometimes sums up."""
    files = generate(root / "data", rows=16, seed=0)
    rows = load_split(files["sft"], "sft").rows
    texts = [render_text(json.loads(r["messages"]), Row(r).tools()) for r in rows]
    arch = TinyArchConfig(vocab_size=512, max_position_embeddings=1024)
    backbone = load_backbone(
        BackboneConfig(source="builtin", arch=arch),
        corpus=lambda: texts,
        cache_root=root / "cache",
        seed=0,
    )
    examples = data_io.sft_examples(backbone.tokenizer, rows, 512)
    sft = SFTConfig(steps=80, batch_size=8, lr=5e-3)
    train_sft(backbone.model, examples, sft, seed=0, pad_id=backbone.tokenizer.pad_token_id)
    folder = root / "sft"
    backbone.model.save_pretrained(folder)
    backbone.tokenizer.save_pretrained(folder)
    return ToolCaller(folder, rows)


def roller_for(backbone):
    """The local engine's roller over a loaded backbone (its stop tokens, the replay simulator)."""
    return Roller(
        backbone.model,
        backbone.tokenizer,
        build_simulator(SimulatorConfig()),
        render_prompt,
        tool_turn_text,
        stop_token_ids=backbone.stop_token_ids,
    )


def with_generation_config(source: Path, target: Path, **settings) -> Path:
    """A copy of checkpoint ``source`` whose ``generation_config.json`` also sets ``settings``."""
    shutil.copytree(source, target)
    path = target / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**config, **settings}))
    return target


def sampler_logprobs(rolls, width):
    """(B, width) float32 of ``Rollouts.logprobs``, NaN past each response."""
    out = torch.full((len(rolls), width), float("nan"))
    for i, logps in enumerate(rolls.logprobs):
        out[i, : len(logps)] = torch.tensor(logps)
    return out
