"""Data splits: the row layout, a synthetic tool domain and its generator, loading and hashing.

- ``rows.py``: the row layout (verl's RL row + the Toucan/SLCA ground truth), documented field
  by field, and ``check_rows(rows, split)``;
- ``domain.py``: six tools with typed arguments, their deterministic responses, question and
  reply templates;
- ``synthetic.py``: ``generate(out_dir, rows, seed)`` writes ``sft.parquet``, ``train.parquet``
  and ``val.parquet``;
- ``sources.py``: the data sources, one registry keyed by ``data.kind`` (``DATA_SOURCES``:
  ``synthetic``, ``files``, and whatever plugins register): where a split's files are, whether
  they are made here, what the recipe records of them;
- ``splits.py``: ``split_files(config)``, ``load_split(path, name)``, ``load_splits(config)``
  (missing files and bad rows raise ``DataError`` naming ``data.files.<split>``).

The submodules are imported on use (``from slca_exp.data.splits import load_splits``): the
generator needs only pyarrow, while ``splits`` pulls in the config schema.
"""
