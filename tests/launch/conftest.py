"""The ``slurm`` fixture: a reachable SLURM cluster, or a skip (a failure under CI)."""

import os
import shutil
import subprocess

import pytest


def slurm_problem() -> str | None:
    """Why no SLURM job can run here, or ``None`` when a node is up and schedulable."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "sinfo/sbatch are not installed"
    try:
        res = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"sinfo failed: {err}"
    if res.returncode != 0:
        return f"sinfo failed: {res.stderr.strip() or res.returncode}"
    states = {s.strip().rstrip("*~#") for s in res.stdout.split()}
    if not states & {"idle", "mixed", "allocated", "completing"}:
        return f"no usable node (sinfo says: {', '.join(sorted(states)) or 'nothing'})"
    return None


@pytest.fixture(scope="session")
def slurm():
    """Skip (outside CI) or fail (under CI) when no SLURM cluster is reachable."""
    problem = slurm_problem()
    if problem is not None:
        how = "start a one-node cluster on this host with `sudo .ci/slurm-up`"
        if os.environ.get("CI"):
            pytest.fail(f"CI needs a running SLURM, but {problem}; .ci/run starts one ({how})")
        pytest.skip(f"no SLURM reachable: {problem}; {how}")
