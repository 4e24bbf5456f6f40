"""BFCL's environment, built once for the suite by the product's own builder, by two at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slca_exp.evaluation.benchmark import BFCL_VERSIONS
from tests.conftest import built_once
from tests.launch.conftest import slurm  # noqa: F401 - the fixture, for the eval's SLURM job

VERSION = BFCL_VERSIONS[0]
BUILD = (
    "import sys; from pathlib import Path; "
    "from slca_exp.evaluation.environment import bfcl_env; "
    "env = bfcl_env(sys.argv[1], Path(sys.argv[2])); print('folder', env.folder)"
)


def build_twice_at_once(root: Path) -> dict:
    """Two processes ask for the environment at once: one builds it, the other waits for it."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD, VERSION, str(root)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=1200)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    return {"root": root, "outputs": outputs}


@pytest.fixture(scope="session")
def bfcl_env(tmp_path_factory) -> dict:
    """``{"root": the folder environments are built in, "outputs": the two builders' output}``."""
    return built_once(tmp_path_factory, "bfcl-envs", build_twice_at_once)


def cli_env(envs_root: Path) -> dict[str, str]:
    """The environment of a ``slca-exp`` subprocess: BFCL's environment found under the root."""
    drop = ("MLFLOW_TRACKING_URI", "SLCA_EXP_ROOT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["SLCA_EXP_ENVS"] = str(envs_root)
    return env


def cli(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 600):
    """A command run as a user runs it, its output captured."""
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
