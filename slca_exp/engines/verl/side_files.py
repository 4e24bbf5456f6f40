"""The files a translated config points verl at, written into ``<run folder>/verl``.

    translated RL config (DictConfig)
      -> write_side_files(config, cfg)
         agent_loops.yaml                 our agent loop by name (``agent_loop.py``)
         tools.yaml                       one simulated tool per schema of the train split
         data/train.parquet, val.parquet  the splits with ``extra_info.tools_kwargs`` added
                                          (``tools.py``); only when the splits are here
      -> write_verl_config(cfg, path)     the config itself as YAML (interpolations kept)

``--dry-run`` writes them to look at; the launch writes them again, where a split that is not
here is an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from slca_exp.config.schema import RunConfig
from slca_exp.core.problems import ConfigError
from slca_exp.engines.verl.keys import OUR_KEY, ROLLOUT, TURNS
from slca_exp.engines.verl.rl_config import problem

SPLIT_KEYS = (("train", "data.train_files"), ("val", "data.val_files"))
"""Each split verl reads -> the verl key of its copy."""


def write_side_files(
    config: RunConfig, cfg: DictConfig, *, require_data: bool = False
) -> list[Path]:
    """Write the agent-loop config and, when the splits are here, the data copies and tool config.

    Everything goes where ``cfg`` points verl (``<run folder>/verl``). The tool config needs the
    train split's tool schemas, and the copies are the splits (``slca_exp.data`` of ``cfg``) with
    ``extra_info.tools_kwargs`` added: for data that lives only on the cluster they are written
    at launch.

    Args:
        config: the run config.
        cfg: its translated verl config.
        require_data: a split that is not here is an error (at launch) instead of skipped.

    Raises:
        ConfigError: ``require_data`` and a split file is missing (the key is named).

    """
    from slca_exp.engines.verl.agent_loop import agent_loop_config
    from slca_exp.engines.verl.tools import schemas_of, write_tool_config, write_verl_split

    written = [agent_loop_config(OmegaConf.select(cfg, ROLLOUT + "agent.agent_loop_config_path"))]
    rows = _readable_splits(cfg, require_data)
    if "train" not in rows:
        return written
    schemas = schemas_of(rows["train"])
    names = [schema["function"]["name"] for schema in schemas]
    tools = OmegaConf.select(cfg, TURNS + "tool_config_path")
    written.append(write_tool_config(tools, rows["train"], config.simulator))
    for split, target in SPLIT_KEYS:
        if split in rows:
            written.append(write_verl_split(rows[split], names, OmegaConf.select(cfg, target)))
    return written


def write_verl_config(cfg: DictConfig, path: str | Path) -> Path:
    """Write ``cfg`` as YAML (interpolations kept), creating its folder; returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(OmegaConf.to_yaml(cfg))
    return path


def _readable_splits(cfg: DictConfig, require_data: bool) -> dict[str, list[dict[str, Any]]]:
    """The rows of each split ``cfg`` has a copy for, when its source file is here."""
    sources = OmegaConf.select(cfg, OUR_KEY + ".data", default=None) or {}
    rows: dict[str, list[dict[str, Any]]] = {}
    for split, target in SPLIT_KEYS:
        source = sources.get(split)
        if not source or not OmegaConf.select(cfg, target):
            continue
        if not Path(source).is_file():
            if require_data:
                raise ConfigError(
                    [problem(f"data.files.{split}", f"{source} is not a file here", "fix the path")]
                )
            continue
        import pyarrow.parquet as pq

        rows[split] = pq.read_table(source).to_pylist()
    return rows
