"""Tiny synthetic splits under the paper's Toucan file names, for recipes that read data=toucan."""

import shutil

from slca_exp.data.synthetic import generate

TOUCAN_FILES = (("sft", "sft_split_42k"), ("train", "rl"), ("val", "eval_4k"))
"""Our split -> the paper's file stem."""


def toucan_named_folder(tmp_path_factory, rows: int):
    """A new folder holding ``rows``-row synthetic splits named as the paper's Toucan files."""
    made = tmp_path_factory.mktemp("made")
    generate(made, rows, 5)
    folder = tmp_path_factory.mktemp("toucan")
    for split, name in TOUCAN_FILES:
        shutil.copy(made / f"{split}.parquet", folder / f"{name}.parquet")
    return folder
