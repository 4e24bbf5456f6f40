"""``slca-exp ui``: MLflow's UI on the runs' store, each experiment opened in its own view.

    slca-exp ui [--tracking-uri URI] [--host HOST] [--port PORT]

Starts ``mlflow server --app-name slca-exp`` (:mod:`slca_exp.tracking.mlflow_app`: MLflow's
server whose UI opens an experiment tagged for model training in the Model training view) on the
store ``slca-exp train`` logs to, or on ``--tracking-uri``; bound to 127.0.0.1 unless ``--host``
says otherwise. Prints the UI's address and each experiment's page, then serves until Ctrl-C::

    slca-exp ui: MLflow UI on sqlite:///outputs/mlflow.db at http://127.0.0.1:5000
    slca-exp ui:   slca-exp: http://127.0.0.1:5000/#/experiments/1

A sqlite store under the current folder is named relative to it (as ``--tracking-uri`` takes
it from there). A store that does not exist, a tracking server (it has its own UI) or a port in
use exit with status 2 and say what to pass instead.
"""

from __future__ import annotations

import argparse
import errno
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from slca_exp.core.problems import EXIT_BAD_CONFIG

APP_NAME = "slca-exp"
"""The MLflow app (entry point group ``mlflow.app``) this command serves."""
DEFAULT_PORT = 5000
PREFIX = "slca-exp ui: "


class UiError(Exception):
    """Why the UI cannot start on what was asked (the message says what to pass instead)."""


def main(argv: Sequence[str]) -> int:
    """Run ``slca-exp ui``; returns the exit status (0 after Ctrl-C, 2 when refused)."""
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exit_:  # argparse has printed the usage and the reason
        return int(exit_.code or 0)
    from slca_exp.core.shown import shown_uri
    from slca_exp.tracking.readback import ReadbackError
    from slca_exp.tracking.uris import absolute_uri, default_tracking_uri

    # Absolute, as compare resolves it: the server's artifact folder is derived from it.
    uri = absolute_uri(args.tracking_uri) if args.tracking_uri else default_tracking_uri()
    try:
        command = server_command(uri, args.host, args.port, explicit=bool(args.tracking_uri))
        _check_port(args.host, args.port)
    except (UiError, ReadbackError) as err:
        print(f"{PREFIX}{err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    url = f"http://{args.host}:{args.port}"
    print(f"{PREFIX}MLflow UI on {shown_uri(uri)} at {url}", flush=True)
    for name, link in experiment_links(uri, url):
        print(f"{PREFIX}  {name}: {link}", flush=True)
    return _serve(command)


def server_command(uri: str, host: str, port: int, *, explicit: bool = True) -> list[str]:
    """The ``mlflow server`` command line that serves the UI on the store ``uri``.

    New experiments' artifacts go beside a sqlite database, as ``slca-exp train`` puts them.

    >>> server_command("sqlite:////nowhere/mlflow.db", "127.0.0.1", 5000)
    Traceback (most recent call last):
    ...
    slca_exp.tracking.readback.ReadbackError: no MLflow store at /nowhere/mlflow.db
    >>> server_command("http://10.0.0.5:5000", "127.0.0.1", 5000)
    Traceback (most recent call last):
    ...
    slca_exp.commands.ui.UiError: http://10.0.0.5:5000 is an MLflow tracking server: open its own UI at http://10.0.0.5:5000, or pass --tracking-uri with the database it serves
    """  # noqa: E501 - doctest lines
    from slca_exp.tracking.readback import check_store
    from slca_exp.tracking.uris import local_store_path

    if uri.startswith(("http://", "https://")):
        raise UiError(
            f"{uri} is an MLflow tracking server: open its own UI at {uri}, or pass "
            "--tracking-uri with the database it serves"
        )
    check_store(uri, explicit=explicit)
    store = local_store_path(uri)
    mlflow = Path(sys.executable).with_name("mlflow")
    command = [str(mlflow) if mlflow.exists() else "mlflow", "server", "--app-name", APP_NAME]
    command += ["--backend-store-uri", uri, "--host", host, "--port", str(port), "--workers", "1"]
    if uri.startswith("sqlite:///") and store is not None:
        command += ["--artifacts-destination", str(store.parent / "mlartifacts")]
    return command


def experiment_links(uri: str, url: str) -> list[tuple[str, str]]:
    """(name, UI page) of each active experiment in the store, oldest first."""
    from mlflow import MlflowClient

    experiments = MlflowClient(tracking_uri=uri).search_experiments(order_by=["creation_time ASC"])
    return [(e.name, f"{url}/#/experiments/{e.experiment_id}") for e in experiments]


def _check_port(host: str, port: int) -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise UiError(f"port {port} on {host} is in use: pass --port") from None
            raise UiError(f"cannot listen on {host}:{port} ({err.strerror}): pass --host") from None


def _serve(command: list[str]) -> int:
    """Run the server until it exits, or until Ctrl-C / SIGTERM stops it."""
    server = subprocess.Popen(command)

    def stop(signum: int, frame: FrameType | None) -> None:
        server.terminate()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        return server.wait()
    except KeyboardInterrupt:
        server.terminate()
        server.wait()
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def _parser() -> argparse.ArgumentParser:
    # Plain text: the module docstring's markup would reach the terminal as it is.
    parser = argparse.ArgumentParser(
        prog="slca-exp ui",
        description="MLflow's UI on the runs' store, each experiment opened in its own view "
        "(training runs: Model training); prints the address, then serves until Ctrl-C.",
    )
    parser.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="MLflow tracking URI of the store; default: the store slca-exp train logs to",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})"
    )
    return parser
