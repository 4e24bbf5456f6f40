"""Many writers, one MLflow store: per-writer throughput and lost/duplicated steps, vs one writer.

For each store (a sqlite file, and an ``mlflow server`` this script starts on 127.0.0.1 with its
own sqlite backend, stopped by its process group at the end):

  alone     one process logs S steps of M metrics through our tracker (``MlflowTracker``)
  together  N processes, released at one barrier, each log S steps of M metrics to one store

Per-writer throughput (steps/s) together is printed as a ratio to the writer alone (1.0: no
slowdown), with the steps lost (a metric missing at a step) and duplicated (a metric logged
twice at a step) over every run, metric and step; a writer that fails counts all its steps as
lost, and its error is printed (the end of its traceback). Lineage: the runs whose datasets or
linked prompts the store does not hold (a run's recipe promises both). ``--trials T`` repeats
each store's cases T times and ends with the totals. Each sqlite case starts from a new store, so
the writers also race to create and migrate it; on both stores they race to create the case's
experiment and its datasets and prompts.

``--race-rounds R`` then hunts the first-use race alone: R rounds of P processes opening one
fresh sqlite store at the same moment (open, get or create the experiment, one run); a round
fails if any process fails. Twenty rounds catch a race that wins one round in ten with 88%
probability, thirty with 96%.

    python benchmarks/store_concurrency.py [--writers 8] [--steps 150] [--metrics 100]
        [--stores sqlite,server] [--trials 1] [--race-rounds 20] [--race-processes 6]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.tracking import metric_names  # noqa: E402
from slca_exp.config.schema import TrackingConfig  # noqa: E402
from slca_exp.preflight.compose import compose_run  # noqa: E402
from slca_exp.preflight.validate import validate  # noqa: E402
from slca_exp.recipe import Recipe, build_recipe  # noqa: E402
from slca_exp.tracking.mlflow import MlflowTracker, get_or_create_experiment  # noqa: E402
from slca_exp.tracking.redact import Redactor  # noqa: E402
from slca_exp.tracking.store import open_client  # noqa: E402

MLFLOW = shutil.which("mlflow") or str(Path(sys.executable).parent / "mlflow")
FORK = mp.get_context("fork")
CASES = ("alone", "together")


def write(
    tracking: TrackingConfig, recipe: Recipe, keys: list[str], steps: int, go: Any, out: Any
) -> None:  # noqa: ANN401
    """One writer: open a run, wait at the barrier, log ``steps`` steps, close the run."""
    try:
        tracker = MlflowTracker(tracking, f"writer-{os.getpid()}", Redactor())
        go.wait()
        tracker.start(recipe, {"seed": 0})
        t0 = time.perf_counter()
        for step in range(steps):
            tracker.log_metrics({k: step + i / 1000 for i, k in enumerate(keys)}, step)
        seconds = time.perf_counter() - t0
        tracker.finish("FINISHED")
        out.put(("ok", tracker.run_id, seconds))
    except BaseException:  # noqa: BLE001 - reported and counted as a failed writer
        out.put(("failed", traceback.format_exc(), 0.0))


def run_writers(
    tracking: TrackingConfig,
    recipe: Recipe,
    keys: list[str],
    steps: int,
    writers: int,  # noqa: ANN401
) -> tuple[list[str], list[float], list[str]]:
    """``writers`` processes at once; (run ids, seconds per writer, failures)."""
    go, out = FORK.Barrier(writers), FORK.Queue()
    procs = [
        FORK.Process(target=write, args=(tracking, recipe, keys, steps, go, out))
        for _ in range(writers)
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=3600) for _ in procs]
    for proc in procs:
        proc.join()
    runs = [r[1] for r in results if r[0] == "ok"]
    failures = [r[1] for r in results if r[0] != "ok"]
    return runs, [r[2] for r in results if r[0] == "ok"], failures


def without_lineage(uri: str, runs: list[str]) -> list[str]:
    """The runs whose dataset inputs or linked prompts the store does not hold."""
    from mlflow import MlflowClient

    from slca_exp.tracking.lineage import linked_prompts, run_datasets

    client = MlflowClient(uri)
    missing = []
    for run_id in runs:
        run = client.get_run(run_id)
        if not run_datasets(run) or not linked_prompts(run):
            missing.append(run_id)
    return missing


def count_steps(uri: str, runs: list[str], keys: list[str], steps: int) -> tuple[int, int, int]:
    """(expected, lost, duplicated) metric rows over every run, metric and step."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from slca_exp.tracking.mlflow import mlflow_key

    client = MlflowClient(uri)
    lost = duplicated = 0
    for run in runs:
        try:
            status = client.get_run(run).info.status
        except MlflowException:
            lost += len(keys) * steps
            continue
        if status != "FINISHED":
            print(f"  run {run} ended {status}")
        for key in keys:
            seen = Counter(m.step for m in client.get_metric_history(run, mlflow_key(key)))
            lost += sum(1 for s in range(steps) if seen[s] == 0)
            duplicated += sum(n - 1 for n in seen.values() if n > 1)
    return len(runs) * len(keys) * steps, lost, duplicated


class Server:
    """``mlflow server`` on a free port of 127.0.0.1, in its own process group."""

    def __init__(self, folder: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.log = folder / "server.log"
        self.proc = subprocess.Popen(
            [
                MLFLOW,
                "server",
                "--backend-store-uri",
                f"sqlite:///{folder / 'server.db'}",
                "--artifacts-destination",
                str(folder / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"mlflow server did not start:\n{self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        """Stop the server and its workers: the process group this script created."""
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def scenario(
    name: str,
    trackings: dict[str, TrackingConfig],
    recipe: Recipe,
    keys: list[str],
    args: argparse.Namespace,
    totals: Counter,
) -> None:
    """Alone, then together (``trackings``: each case's tracking config); one line per case."""
    line = {}
    for label, writers in (("alone", 1), ("together", args.writers)):
        tracking = trackings[label]
        uri = tracking.mlflow_uri or f"sqlite:///{Path(tracking.root) / 'mlflow.db'}"
        runs, seconds, failures = run_writers(
            tracking, replace(recipe, experiment_name=f"bench-{label}"), keys, args.steps, writers
        )
        expected, lost, dup = count_steps(uri, runs, keys, args.steps)
        lost += len(failures) * len(keys) * args.steps  # a writer that failed logged nothing
        expected += len(failures) * len(keys) * args.steps
        bare = without_lineage(uri, runs)
        per_writer = sorted(args.steps / s for s in seconds) if seconds else [0.0]
        line[label] = per_writer[len(per_writer) // 2]  # the median writer
        print(
            f"{name:7s} {label:9s} writers {writers:2d}  failed {len(failures)}  "
            f"steps/s per writer {line[label]:7.1f} (slowest {per_writer[0]:.1f})  "
            f"rows {expected}  lost {lost} ({lost / max(expected, 1):.1%})  "
            f"duplicated {dup} ({dup / max(expected, 1):.1%})  without lineage {len(bare)}"
        )
        for failure in failures:
            print("  a writer failed:\n    " + "\n    ".join(failure.strip().splitlines()[-12:]))
        for key, value in (
            ("writers", writers),
            ("failed", len(failures)),
            ("rows", expected),
            ("lost", lost),
            ("duplicated", dup),
            ("without lineage", len(bare)),
        ):
            totals[(name, key)] += value
    cpus = os.cpu_count() or 1
    print(
        f"{name:7s} per-writer throughput together / alone: "
        f"{line['together'] / max(line['alone'], 1e-9):.2f} (with {cpus} CPUs for "
        f"{args.writers} writers, CPU time alone caps it at {min(1.0, cpus / args.writers):.2f})\n"
    )


def open_fresh(root: str, go: Any, out: Any) -> None:  # noqa: ANN401
    """One process of a race round: open the store, get or create the experiment, one run."""
    try:
        go.wait()
        client = open_client(f"sqlite:///{root}/mlflow.db")
        experiment = get_or_create_experiment(client, "race", Path(root))
        run = client.create_run(experiment).info.run_id
        client.set_terminated(run, "FINISHED")
        out.put("ok")
    except BaseException:  # noqa: BLE001 - the round failed: say why
        out.put(traceback.format_exc().strip().splitlines()[-1])


def race(rounds: int, processes: int, base: str | None) -> None:
    """``rounds`` fresh stores, each opened by ``processes`` processes at the same moment."""
    failed = []
    t0 = time.perf_counter()
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(dir=base, prefix="slca-race-") as root:
            go, out = FORK.Barrier(processes), FORK.Queue()
            procs = [
                FORK.Process(target=open_fresh, args=(root, go, out)) for _ in range(processes)
            ]
            for proc in procs:
                proc.start()
            answers = [out.get(timeout=600) for _ in procs]
            for proc in procs:
                proc.join()
            errors = [a for a in answers if a != "ok"]
            if errors:
                failed.append(errors[0])
    print(
        f"race: {rounds} rounds x {processes} processes opening a fresh sqlite store: "
        f"{len(failed)} rounds failed ({time.perf_counter() - t0:.0f} s)"
    )
    for error in failed[:3]:
        print(f"  {error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, default=8, help="processes writing together")
    parser.add_argument("--steps", type=int, default=150, help="steps each writer logs")
    parser.add_argument("--metrics", type=int, default=100, help="metrics per step")
    parser.add_argument("--stores", default="sqlite,server", help="sqlite, server or both")
    parser.add_argument("--trials", type=int, default=1, help="times each store's cases run")
    parser.add_argument("--race-rounds", type=int, default=20, help="0: no race hunt")
    parser.add_argument("--race-processes", type=int, default=6)
    parser.add_argument(
        "--dir", default=None, help="where the stores live (default: the system temp folder)"
    )
    args = parser.parse_args()
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401 - once, before the forks

    keys = metric_names(args.metrics)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="slca-bench-") as tmp:
        base = Path(tmp)
        config = validate(compose_run([f"tracking.root={base / 'recipe'}", "data.rows=8"]))
        recipe = build_recipe(config)
        tracking = replace(config.tracking, plots=False)
        print(
            f"{args.writers} writers x {args.steps} steps x {args.metrics} metrics "
            f"(cpus: {os.cpu_count()})\n"
        )
        stores = args.stores.split(",")
        totals: Counter = Counter()
        for trial in range(args.trials):
            if args.trials > 1:
                print(f"trial {trial + 1} of {args.trials}")
            if "sqlite" in stores:  # a new store for each case
                roots = {c: str(base / f"sqlite-{trial}-{c}") for c in CASES}
                cases = {c: replace(tracking, root=root) for c, root in roots.items()}
                scenario("sqlite", cases, recipe, keys, args, totals)
            if "server" in stores:  # one new server; the server creates its store itself
                folder = base / f"server-{trial}"
                folder.mkdir()
                server = Server(folder)
                try:
                    served = replace(tracking, root=str(base / "client"), mlflow_uri=server.url)
                    scenario("server", dict.fromkeys(CASES, served), recipe, keys, args, totals)
                finally:
                    server.stop()
        print(f"totals over {args.trials} trial(s), alone and together:")
        for store in ("sqlite", "server"):
            if (store, "writers") in totals:
                print(
                    f"  {store:7s} writers {totals[store, 'writers']}  failed "
                    f"{totals[store, 'failed']}  rows {totals[store, 'rows']}  lost "
                    f"{totals[store, 'lost']}  duplicated {totals[store, 'duplicated']}  "
                    f"runs without lineage {totals[store, 'without lineage']}"
                )
        if args.race_rounds:
            race(args.race_rounds, args.race_processes, args.dir)


if __name__ == "__main__":
    main()
