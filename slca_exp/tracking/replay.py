"""Replay an MLflow spool left behind by a run whose server was away at finish.

    python -m slca_exp.tracking.replay <root>/spool/<run_id>.jsonl --uri http://127.0.0.1:5000

Sends the spooled steps (each exactly once: the store deduplicates identical rows), uploads the
artifacts kept beside the spool, and closes the run with the status recorded in
``<run_id>.status``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from slca_exp.tracking.spool import Spool, StepRecord


def replay(spool_path: str | Path, uri: str) -> int:
    """Replay one spool into the store at ``uri``; returns the number of steps sent."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    path = Path(spool_path)
    run_id = path.stem
    client = MlflowClient(tracking_uri=uri)

    def send(record: StepRecord) -> None:
        rows = [Metric(k, v, record.timestamp_ms, record.step) for k, v in record.metrics.items()]
        client.log_batch(run_id, metrics=rows)

    sent = Spool(path).replay(send)
    artifacts = path.with_name(f"{run_id}-artifacts")
    if artifacts.is_dir():
        for file in sorted(p for p in artifacts.rglob("*") if p.is_file()):
            folder = file.parent.relative_to(artifacts).as_posix()
            client.log_artifact(run_id, str(file), None if folder == "." else folder)
    marker = path.with_suffix(".status")
    if marker.exists():
        client.set_terminated(run_id, marker.read_text().strip())
        marker.unlink()
    return sent


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spool", help="the <run_id>.jsonl file")
    parser.add_argument("--uri", required=True, help="the MLflow tracking URI of the run")
    args = parser.parse_args(argv)
    print(f"replayed {replay(args.spool, args.uri)} steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
