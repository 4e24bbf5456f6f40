"""The seeded synthetic split: ``sft.parquet``, ``train.parquet`` and ``val.parquet`` in one folder.

Sizes: ``train`` has ``rows`` rows, ``sft`` as many, ``val`` ``max(16, rows // 4)``
(:func:`split_sizes`). Each split mixes, in exact proportions then shuffled:

- one call (50%): a question one tool answers, e.g. "What time is it in Tokyo?";
- two parallel calls in one turn (25%): "What's the weather in Paris and the time in Tokyo?";
- no call (25%): a question no tool fits ("Tell me a joke."); the gold reply politely declines.

Every row allows all six tools of ``domain.py`` (one prompt for every row: the policy has to pick
the tool from the question). Validation questions that ask for tool calls differ from every
training question (a bounded number of redraws; the 12 irrelevant questions necessarily repeat).

The bytes depend only on (rows, seed), the domain version and the pyarrow version: two
generations give the same sha256. A ``manifest.json`` written last records what the folder holds,
so a folder is regenerated when its parameters or the generator's code change, and a
half-written folder is never used.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from slca_exp.core.rows import Row
from slca_exp.data import domain
from slca_exp.data import rows as rows_module
from slca_exp.data.rows import rl_row, sft_row

SPLIT_FILES = {"sft": "sft.parquet", "train": "train.parquet", "val": "val.parquet"}
"""Split name -> file name inside the folder (a contract with the engines)."""
MANIFEST = "manifest.json"
MIX = (("single", 0.50), ("parallel", 0.25), ("irrelevant", 0.25))
"""Row kinds and their shares (irrelevant takes what rounding leaves)."""
MAX_QUESTION_CHARS = 80
_REDRAWS = 50

_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
_GROUND_TRUTH = pa.struct(
    [
        ("allowed_tools", pa.list_(pa.string())),
        ("gold_tool_calls", pa.string()),
        ("question_content", pa.string()),
        ("subset_name", pa.string()),
        ("tool_schemas", pa.string()),
    ]
)
RL_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(_MESSAGE)),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", _GROUND_TRUTH)])),
        (
            "extra_info",
            pa.struct(
                [
                    ("index", pa.int64()),
                    ("split", pa.string()),
                    ("tool_responses", pa.string()),
                    ("reply", pa.string()),
                ]
            ),
        ),
    ]
)
"""The parquet schema of RL rows; SFT rows add a ``messages`` string column."""
SFT_SCHEMA = RL_SCHEMA.append(pa.field("messages", pa.string()))


class SyntheticFolderError(ValueError):
    """The output folder holds split files that this generator did not write."""


def split_sizes(rows: int) -> dict[str, int]:
    """Rows per split for ``rows`` RL training rows."""
    return {"sft": rows, "train": rows, "val": max(16, rows // 4)}


def generate(out_dir: str | Path, rows: int, seed: int) -> dict[str, Path]:
    """Write the three splits into ``out_dir`` unless it already holds them; their paths.

    Args:
        out_dir: the folder (created when missing).
        rows: RL training rows (> 0); see :func:`split_sizes`.
        seed: the data seed.

    Returns:
        split name -> path of its parquet file.

    Raises:
        ValueError: ``rows`` is not positive.
        SyntheticFolderError: ``out_dir`` holds split files without a manifest of ours.

    """
    if rows <= 0:
        raise ValueError(f"rows must be positive, got {rows}")
    out = Path(out_dir)
    paths = {name: out / file for name, file in SPLIT_FILES.items()}
    wanted = _manifest(rows, seed)
    if _read_manifest(out) == wanted and all(p.is_file() for p in paths.values()):
        return paths
    if not (out / MANIFEST).is_file() and any(p.exists() for p in paths.values()):
        raise SyntheticFolderError(
            f"{out} holds split files that were not generated here (no {MANIFEST}); "
            "pick another folder or remove them"
        )
    out.mkdir(parents=True, exist_ok=True)
    tables = build_tables(rows, seed)
    # Write next to the targets, then rename: concurrent jobs of a sweep may generate the same
    # folder at once, and a reader must never see half a file (their bytes are identical).
    with tempfile.TemporaryDirectory(dir=out, prefix=".generating-") as tmp:
        for name, table in tables.items():
            staged = Path(tmp) / SPLIT_FILES[name]
            pq.write_table(table, staged)
            os.replace(staged, paths[name])
        staged = Path(tmp) / MANIFEST
        staged.write_text(json.dumps(wanted, indent=2, sort_keys=True) + "\n")
        os.replace(staged, out / MANIFEST)
    return paths


def build_tables(rows: int, seed: int) -> dict[str, pa.Table]:
    """The three splits as pyarrow tables (no I/O)."""
    sizes = split_sizes(rows)
    train = build_rows(sizes["train"], "train", seed)
    seen = {Row(r).prompt()[-1]["content"] for r in train}
    sft = [sft_row(r) for r in build_rows(sizes["sft"], "sft", seed)]
    val = build_rows(sizes["val"], "val", seed, exclude=seen)
    return {
        "sft": pa.Table.from_pylist(sft, schema=SFT_SCHEMA),
        "train": pa.Table.from_pylist(train, schema=RL_SCHEMA),
        "val": pa.Table.from_pylist(val, schema=RL_SCHEMA),
    }


def build_rows(
    n: int, split: str, seed: int, *, exclude: set[str] | frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    """``n`` rows of one split (RL layout), seeded by ``(seed, split)``.

    Args:
        n: number of rows.
        split: split name recorded in ``extra_info.split`` (and part of the seed).
        seed: the data seed.
        exclude: questions to avoid for tool rows (redrawn up to 50 times each).

    """
    rng = random.Random(_seed(seed, split))
    kinds = []
    for kind, share in MIX[:-1]:
        kinds += [kind] * int(n * share + 0.5)
    kinds = (kinds + [MIX[-1][0]] * n)[:n]
    rng.shuffle(kinds)
    rows = []
    for index, kind in enumerate(kinds):
        for _ in range(_REDRAWS):
            question, steps = _draw(kind, rng)
            if kind == "irrelevant" or question not in exclude:
                break
        rows.append(_row(index, split, question, steps, rng))
    return rows


def _draw(kind: str, rng: random.Random) -> tuple[str, list[list[dict[str, Any]]]]:
    """A question and its gold steps for one row kind."""
    if kind == "irrelevant":
        return rng.choice(domain.IRRELEVANT_QUESTIONS), []
    while True:
        if kind == "single":
            tool = rng.choice(domain.TOOLS)
            args = tool.sample(rng)
            question = rng.choice(tool.questions).format(**domain.words(args))
            calls = [{"name": tool.name, "arguments": args}]
        else:
            pairable = [t for t in domain.TOOLS if t.clause]
            first, second = rng.choice(pairable), rng.choice(pairable)
            a, b = first.sample(rng), second.sample(rng)
            if first is second and a == b:
                continue  # two identical calls are one call
            question = rng.choice(domain.PARALLEL_TEMPLATES).format(
                a=first.clause.format(**domain.words(a)),
                b=second.clause.format(**domain.words(b)),
            )
            calls = [{"name": first.name, "arguments": a}, {"name": second.name, "arguments": b}]
        # Redraw long questions: a tiny model must learn these from a few hundred rows.
        if len(question) <= MAX_QUESTION_CHARS:
            return question, [calls]


def _row(
    index: int,
    split: str,
    question: str,
    steps: list[list[dict[str, Any]]],
    rng: random.Random,
) -> dict[str, Any]:
    responses, sentences = [], []
    for call in (c for step in steps for c in step):
        content = domain.respond(call["name"], call["arguments"])
        responses.append({**call, "content": content})
        sentences.append(domain.reply(call["name"], call["arguments"], content))
    reply = " ".join(sentences) if steps else rng.choice(domain.DECLINES)
    return rl_row(
        index=index,
        split=split,
        system=domain.SYSTEM_PROMPT,
        question=question,
        steps=steps,
        responses=responses,
        reply=reply,
        schemas=domain.TOOL_SCHEMAS,
    )


def _seed(seed: int, split: str) -> int:
    # sha256, not hash(): Python salts str hashes per process.
    key = f"{domain.DOMAIN_VERSION}:{seed}:{split}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


def _code_hash() -> str:
    """sha256 of the generator's source.

    An edited template then regenerates cached folders even when nobody bumped DOMAIN_VERSION.
    """
    digest = hashlib.sha256()
    for module in (domain, rows_module, sys.modules[__name__]):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()


def _manifest(rows: int, seed: int) -> dict[str, Any]:
    return {
        "generator": domain.DOMAIN_VERSION,
        "code_sha256": _code_hash(),
        "rows": rows,
        "seed": seed,
        "sizes": split_sizes(rows),
        "pyarrow": pa.__version__,
    }


def _read_manifest(out: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
