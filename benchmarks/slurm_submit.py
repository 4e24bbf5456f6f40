"""From command to queued: a 16-job sweep on SLURM, ours against a hand-written sbatch array.

Competitors, both submitting 16 jobs to the SLURM this machine reaches (``sudo .ci/slurm-up``
starts a one-node cluster here):

  ours    ``slca-exp train -m launcher=slurm_cpu <4x4 tool-weight grid>``: the CLI starts,
          validates all 16 jobs (config, recipe, data hashes), creates the sweep's MLflow parent
          run and hands the sweep to hydra-submitit-launcher, which submits one array job
  sbatch  a hand-written ``sbatch --array=0-15`` of a script that would run the same command,
          the way clusters are driven without a launcher (no validation, no tracking)

The clock stops when ``squeue`` lists all 16 array elements (pending or running). Every job is
then cancelled. Ours must stay within 10 s; the ratio ours / sbatch shows what the checks and
the launcher cost on top of SLURM itself. Usage:

    python benchmarks/slurm_submit.py [--jobs 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXE = str(Path(sys.executable).parent / "slca-exp")
TARGET_S = 10.0


def queued(array_id: str) -> int:
    """How many elements of array job ``array_id`` squeue lists."""
    res = subprocess.run(
        ["squeue", "-h", "-r", "-j", array_id, "-o", "%i"], capture_output=True, text=True
    )
    return len(res.stdout.split()) if res.returncode == 0 else 0


def wait_queued(find_id, jobs: int, t0: float, timeout: float = 120.0) -> float:
    """Seconds from ``t0`` until ``jobs`` elements of the array job ``find_id()`` are queued."""
    while time.perf_counter() - t0 < timeout:
        array_id = find_id()
        if array_id and queued(array_id) >= jobs:
            return time.perf_counter() - t0
        time.sleep(0.05)
    raise TimeoutError(f"{jobs} jobs not queued after {timeout:.0f} s")


def grid(jobs: int) -> list[str]:
    """Overrides of a sweep of ``jobs`` jobs: a 4x4 grid of tool weights times seeds."""
    seeds = max(1, jobs // 16)
    return [
        "reward.normalize=true",
        "reward.tool_weights.name=0.15,0.2,0.25,0.3",
        "reward.tool_weights.parallel=0.15,0.2,0.25,0.3",
        f"seed={','.join(str(s) for s in range(seeds))}",
    ]


def ours(folder: Path, jobs: int) -> float:
    sweep_dir = folder / "multirun"
    args = [
        EXE,
        "train",
        "-m",
        *grid(jobs),
        "launcher=slurm_cpu",
        "launcher.cpus_per_task=1",
        "launcher.mem_gb=1",
        f"tracking.root={folder / 'out'}",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}

    def find_id() -> str | None:
        sub = sweep_dir / ".submitit"
        found = [p.name for p in sub.iterdir() if p.is_dir()] if sub.is_dir() else []
        return min(found, key=len).split("_")[0] if found else None

    log = folder / "cli.log"
    t0 = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(args, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        took = wait_queued(find_id, jobs, t0)
    except TimeoutError:
        proc.kill()
        raise RuntimeError(log.read_text()[-3000:]) from None
    finally:
        array_id = find_id()
        if array_id:
            subprocess.run(["scancel", array_id], check=False)
    proc.kill()
    proc.wait()
    return took


def plain_sbatch(folder: Path, jobs: int) -> float:
    script = folder / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --array=0-{jobs - 1}\n#SBATCH --cpus-per-task=1\n#SBATCH --mem=1G\n"
        f"#SBATCH --output={folder}/%A_%a.out\n"
        f"srun {EXE} train seed=$SLURM_ARRAY_TASK_ID tracking.root={folder / 'out'}\n"
    )
    t0 = time.perf_counter()
    res = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(res.stderr)
    array_id = res.stdout.strip().split(";")[0]
    try:
        return wait_queued(lambda: array_id, jobs, t0)
    finally:
        subprocess.run(["scancel", array_id], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=16, help="a multiple of 16")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("sbatch") is None:
        print("no SLURM here: start one with `sudo .ci/slurm-up`", file=sys.stderr)
        return 2
    times: dict[str, list[float]] = {"ours": [], "sbatch": []}
    with tempfile.TemporaryDirectory(prefix="slca-bench-slurm-") as tmp:
        for r in range(args.repeats):
            for name, fn in (("ours", ours), ("sbatch", plain_sbatch)):
                folder = Path(tmp) / f"{name}{r}"
                folder.mkdir()
                times[name].append(fn(folder, args.jobs))
                time.sleep(1.0)  # let slurmctld settle the cancellations
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.jobs}-job sweep, command to all queued ({args.repeats} repeats, median):")
    for name, values in times.items():
        print(f"  {name:7s} {med[name]:6.2f} s   (min {min(values):.2f} s)")
    print(f"  ratio ours / sbatch: {med['ours'] / med['sbatch']:.1f}x")
    verdict = "within" if med["ours"] <= TARGET_S else "OVER"
    print(f"  target: ours <= {TARGET_S:.0f} s: {verdict}")
    return 0 if med["ours"] <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
