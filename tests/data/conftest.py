"""One small synthetic split per test session (generation is deterministic, so sharing is safe)."""

import pyarrow.parquet as pq
import pytest

from slca_exp.data.synthetic import generate

ROWS, SEED = 64, 5


@pytest.fixture(scope="session")
def split_dir(tmp_path_factory):
    """A folder holding sft/train/val.parquet for ROWS rows and SEED."""
    out = tmp_path_factory.mktemp("synthetic")
    generate(out, ROWS, SEED)
    return out


@pytest.fixture(scope="session")
def split_rows(split_dir):
    """split name -> its rows as read back from parquet."""
    return {
        n: pq.read_table(split_dir / f"{n}.parquet").to_pylist() for n in ("sft", "train", "val")
    }
