"""Where to look: the closing block of a run and of a sweep, the job log that keeps the
``slca-exp:`` lines, and ``sacct``'s complaints (its stderr, submitit's warnings) said once."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.launch.submission import (
    SubmissionWatch,
    job_line,
    quiet_sacct,
    submitted_jobs,
)
from slca_exp.tracking.closing import compare_command, run_block, sweep_block
from slca_exp.tracking.console import JOB_LOGGER, mirrored_to_job_log
from slca_exp.tracking.uris import default_tracking_uri


def test_a_single_run_says_its_run_how_to_compare_its_folder_checkpoint_and_slurm_job():
    lines = run_block(
        status="FINISHED",
        run_id="r1",
        experiment="slca-exp",
        store="sqlite:////x/mlflow.db",
        output_dir="/x/outputs/2026-12-01/10-00-00",
        checkpoint="/x/runs/k/checkpoint.pt",
        slurm={"job": "12_3", "log": "/s/.submitit/12_3/12_3_0_log.out"},
        failures=["judge: 4 of 8 requests failed"],
    )
    assert lines == [
        "---- where to look ----",
        "run FINISHED: MLflow run r1 (experiment slca-exp) in sqlite:////x/mlflow.db",
        "open it with: slca-exp ui --tracking-uri sqlite:////x/mlflow.db",
        "compare: slca-exp compare slca-exp --tracking-uri sqlite:////x/mlflow.db",
        "output folder: /x/outputs/2026-12-01/10-00-00",
        "checkpoint: /x/runs/k/checkpoint.pt",
        "SLURM job 12_3, log: /s/.submitit/12_3/12_3_0_log.out",
        "judge: 4 of 8 requests failed",
    ]


def test_a_job_of_a_sweep_names_its_parent_and_compares_the_sweep_and_a_console_run_says_so():
    job = run_block(
        status="FAILED",
        run_id="c1",
        experiment="e",
        store="http://mlflow:5000",
        parent_run_id="p1",
        sweep_id="e-20261201-1",
    )
    assert "sweep e-20261201-1: parent MLflow run p1" in job
    assert "compare: slca-exp compare e-20261201-1 --tracking-uri http://mlflow:5000" in job
    assert not any(line.startswith("open it with") for line in job)  # a server: open its UI
    console = run_block(status="FINISHED", run_id=None, experiment="e", store=None)
    assert console == [
        "---- where to look ----",
        "run FINISHED (not recorded in MLflow: tracking.backends has no mlflow)",
    ]


def test_the_default_store_needs_no_tracking_uri():
    assert compare_command("s1", default_tracking_uri()) == "slca-exp compare s1"


def test_a_sweep_lists_every_job_with_its_run_and_slurm_job_and_log():
    lines = sweep_block(
        sweep_id="s1",
        parent_run_id="p1",
        status="FINISHED",
        store="sqlite:////x/mlflow.db",
        sweep_dir="/x/multirun/1",
        jobs={
            1: {"status": "COMPLETED", "run_id": "c1", "slurm_job": "12_1", "log": "/l/1.out"},
            0: {"status": "COMPLETED", "run_id": "c0", "slurm_job": "12_0", "log": "/l/0.out"},
        },
    )
    assert lines[1:3] == [
        "sweep s1 FINISHED: parent MLflow run p1 in sqlite:////x/mlflow.db",
        "compare: slca-exp compare s1 --tracking-uri sqlite:////x/mlflow.db",
    ]
    assert lines[-3:] == [
        "sweep folder: /x/multirun/1",
        "job 0: COMPLETED, MLflow run c0, SLURM job 12_0, log: /l/0.out",
        "job 1: COMPLETED, MLflow run c1, SLURM job 12_1, log: /l/1.out",
    ]


def test_paths_under_the_launch_folder_are_named_from_it_and_open_from_there(tmp_path, monkeypatch):
    from slca_exp.tracking.uris import absolute_uri

    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}"  # as runs record it: absolute
    lines = run_block(
        status="FINISHED",
        run_id="r1",
        experiment="e",
        store=store,
        output_dir=str(tmp_path / "outputs" / "2026-12-01" / "10-00-00"),
        checkpoint=str(tmp_path / "outputs" / "runs" / "k" / "checkpoint.pt"),
        slurm={"job": "12_3", "log": "/s/.submitit/12_3/12_3_0_log.out"},  # elsewhere: absolute
    )
    assert lines[1:] == [
        "run FINISHED: MLflow run r1 (experiment e) in sqlite:///outputs/mlflow.db",
        "open it with: slca-exp ui --tracking-uri sqlite:///outputs/mlflow.db",
        "compare: slca-exp compare e --tracking-uri sqlite:///outputs/mlflow.db",
        "output folder: outputs/2026-12-01/10-00-00",
        "checkpoint: outputs/runs/k/checkpoint.pt",
        "SLURM job 12_3, log: /s/.submitit/12_3/12_3_0_log.out",
    ]
    # the relative URI a user copies opens the store the run logged to, from where they stand
    assert absolute_uri("sqlite:///outputs/mlflow.db") == store
    log = str(tmp_path / "multirun" / "1" / ".submitit" / "12_0" / "0.out")
    sweep = sweep_block(
        sweep_id="s1",
        parent_run_id="p1",
        status="FINISHED",
        store=store,
        sweep_dir=str(tmp_path / "multirun" / "1"),
        jobs={0: {"status": "COMPLETED", "run_id": "c0", "slurm_job": "12_0", "log": log}},
    )
    assert sweep[1] == "sweep s1 FINISHED: parent MLflow run p1 in sqlite:///outputs/mlflow.db"
    assert sweep[-2:] == [
        "sweep folder: multirun/1",
        "job 0: COMPLETED, MLflow run c0, SLURM job 12_0, log: multirun/1/.submitit/12_0/0.out",
    ]
    submitted = job_line("12_0", tmp_path / "multirun" / ".submitit", "SLURM job")
    assert submitted.endswith(", log: multirun/.submitit/12_0/12_0_0_log.out")


SEGMENT = st.text(st.characters(whitelist_categories=("L", "N")), min_size=1, max_size=6)


@given(st.lists(SEGMENT, max_size=3), st.lists(SEGMENT, max_size=3), st.booleans())
def test_a_shown_path_joined_to_the_folder_it_is_shown_from_is_the_path(here, rest, inside):
    from pathlib import Path

    from slca_exp.core.shown import shown_path, shown_uri

    folder = Path("/", "base", *here)
    path = folder.joinpath(*rest) if inside else Path("/", "other", *rest)
    shown = shown_path(path, here=folder)
    assert folder / shown == path or (shown == "." and path == folder)
    assert Path(shown).is_absolute() != inside  # relative exactly when it lies under the folder
    uri = shown_uri(f"sqlite:///{path}", here=folder)
    assert uri == f"sqlite:///{shown}"


@pytest.fixture
def job_log(tmp_path):
    """A root FileHandler, as Hydra's job logging installs one for train.log."""
    handler = logging.FileHandler(tmp_path / "train.log")
    handler.setFormatter(logging.Formatter("[%(name)s] - %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    yield tmp_path / "train.log"
    root.removeHandler(handler)
    handler.close()


LINE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans(), LINE), max_size=8))
def test_the_console_is_unchanged_and_the_job_log_gets_exactly_the_slca_exp_lines(lines):
    # (ours, to stderr, text): each line printed whole or in two writes
    import io
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        handler = logging.FileHandler(Path(tmp) / "train.log")
        handler.setFormatter(logging.Formatter("%(message)s"))
        logging.getLogger().addHandler(handler)
        out, err = io.StringIO(), io.StringIO()
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        try:
            with mirrored_to_job_log(tmp):
                for ours, to_err, text in lines:
                    line = f"slca-exp: {text}" if ours else text
                    stream = sys.stderr if to_err else sys.stdout
                    stream.write(line[:3])
                    stream.write(line[3:] + "\n")
        finally:
            sys.stdout, sys.stderr = saved
            logging.getLogger().removeHandler(handler)
            handler.close()
        logged = (Path(tmp) / "train.log").read_text().split("\n")[:-1]
    expected_out = "".join((f"slca-exp: {t}" if o else t) + "\n" for o, e, t in lines if not e)
    expected_err = "".join((f"slca-exp: {t}" if o else t) + "\n" for o, e, t in lines if e)
    assert out.getvalue() == expected_out and err.getvalue() == expected_err
    kept = [f"slca-exp: {t}" for o, _, t in lines if o]
    kept += [t for o, _, t in lines if not o and t.startswith("slca-exp:")]
    assert sorted(logged) == sorted(kept)


def test_the_mirror_keeps_a_progress_bars_last_redraw_and_leaves_no_trace(job_log, capsys):
    before = sys.stdout, sys.stderr
    with mirrored_to_job_log(job_log.parent):
        print("bar 10%\rbar 90%\rslca-exp: validation done")
        print("slca-exp: unfinished", end="", file=sys.stderr)
    assert capsys.readouterr().out == "bar 10%\rbar 90%\rslca-exp: validation done\n"
    assert job_log.read_text().splitlines() == [
        f"[{JOB_LOGGER}] - slca-exp: validation done",
        f"[{JOB_LOGGER}] - slca-exp: unfinished",
    ]
    assert (sys.stdout, sys.stderr) == before
    assert not any(
        isinstance(h, logging.FileHandler) for h in logging.getLogger(JOB_LOGGER).handlers
    )


def test_without_a_job_log_nothing_is_wrapped():
    before = sys.stdout
    with mirrored_to_job_log():
        assert sys.stdout is before


def test_submitits_sacct_warning_is_said_once_and_other_warnings_pass(capsys, caplog):
    logger = logging.getLogger("submitit")
    installed = quiet_sacct()
    assert quiet_sacct() is installed  # one filter per process
    logger.removeFilter(installed)
    fresh = type(installed)()  # this test's own, as a new process would have it
    logger.addFilter(fresh)
    try:
        with caplog.at_level(logging.WARNING, logger="submitit"):
            for call in range(1, 9):  # a 1-minute job on a cluster without accounting
                logger.warning(
                    f"Call #{call} - Bypassing sacct error Command '['sacct', '-o', 'JobID']' "
                    "returned non-zero exit status 1., status may be inaccurate."
                )
            logger.warning("Bypassing state error: something else")
    finally:
        logger.removeFilter(fresh)
        logger.addFilter(installed)
    assert [r.getMessage() for r in caplog.records] == ["Bypassing state error: something else"]
    err = capsys.readouterr().err
    assert err.count("slca-exp: submitit cannot ask SLURM's accounting") == 1
    assert "(said once)" in err and "Bypassing sacct error" not in err
    assert fresh.seen == 8


SACCT_SAYS = "Slurm accounting storage is disabled"  # what sacct writes, on a cluster without


def test_sacct_stderr_stays_off_the_console_and_is_said_once_in_our_words(
    tmp_path, monkeypatch, capfd
):
    import submitit.core.core as core
    from submitit.slurm.slurm import SlurmInfoWatcher

    from slca_exp.launch import submission

    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "sacct").write_text(f"#!/bin/sh\necho '{SACCT_SAYS}' >&2\nexit 1\n")
    (tools / "squeue").write_text("#!/bin/sh\necho 'squeue: error: no controller' >&2\nexit 1\n")
    for tool in ("sacct", "squeue"):
        (tools / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    # this test's own process state, as a fresh process has it; put back afterwards
    monkeypatch.setattr(core, "subprocess", subprocess)
    logger = logging.getLogger("submitit")
    fresh = [f for f in logger.filters if not isinstance(f, submission._SacctOnce)]
    monkeypatch.setattr(logger, "filters", fresh)

    watcher = SlurmInfoWatcher(delay_s=0)
    watcher.register_job("1234_0")
    watcher.update()  # as submitit does it: sacct's own line reaches the terminal
    assert f"{SACCT_SAYS}\n" in capfd.readouterr().err

    quiet_sacct()
    for _ in range(3):  # every poll while a sweep waits
        watcher.update()
    assert watcher.num_calls == 4
    err = capfd.readouterr().err
    about = [line for line in err.splitlines() if "sacct" in line or "accounting" in line]
    assert about == [
        f"slca-exp: submitit cannot ask SLURM's accounting (its sacct call failed: {SACCT_SAYS}); "
        "job states are read from submitit's own files instead (said once)"
    ]
    # every other command of submitit's runs as before
    assert core.subprocess.run is subprocess.run
    assert core.subprocess.check_output(["echo", "ok"]) == b"ok\n"


def test_without_accounting_job_states_come_from_squeue_a_cancelled_waiting_one_included(
    tmp_path, monkeypatch, capfd
):
    import submitit.core.core as core
    from submitit.slurm.slurm import SlurmInfoWatcher

    from slca_exp.launch import submission

    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "sacct").write_text(f"#!/bin/sh\necho '{SACCT_SAYS}' >&2\nexit 1\n")
    # squeue -h -r -t all -o '%i|%T|%N': an array of 4, whose element 1 was cancelled while it
    # waited (SLURM forgets such an element at once), and an unrelated job
    listed = "12_0|COMPLETED|vm\n12_2|RUNNING|vm\n12_3|PENDING|\n99|RUNNING|vm"
    (tools / "squeue").write_text(f"#!/bin/sh\nprintf '{listed}\\n'\n")
    for tool in ("sacct", "squeue"):
        (tools / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(core, "subprocess", subprocess)
    quiet_sacct()
    watcher = SlurmInfoWatcher(delay_s=0)
    jobs = ("12_0", "12_1", "12_2", "12_3")
    for element in jobs:
        watcher.register_job(element)
    watcher.update()
    # an ended job is held back a while (time to write its result): reported COMPLETING
    assert watcher.get_state("12_0", mode="cache") == "COMPLETING"
    assert not watcher.is_done("12_0", mode="cache")
    monkeypatch.setattr(submission, "ENDED_GRACE_S", 0.0)
    watcher.update()
    states = {e: watcher.get_state(e, mode="cache") for e in (*jobs, "99")}
    assert states == {
        "12_0": "COMPLETED",
        "12_1": "GONE",
        "12_2": "RUNNING",
        "12_3": "PENDING",
        "99": "UNKNOWN",  # not asked about
    }
    assert watcher.is_done("12_1", mode="cache")  # so submitit stops waiting for its result
    assert not watcher.is_done("12_3", mode="cache")
    about = [x for x in capfd.readouterr().err.splitlines() if "accounting" in x]
    assert about == [
        f"slca-exp: submitit cannot ask SLURM's accounting (its sacct call failed: {SACCT_SAYS}); "
        "job states are read from squeue instead (said once)"
    ]


def test_each_submitted_job_is_said_once_with_its_log_as_its_folder_appears(tmp_path, capsys):
    folder = tmp_path / ".submitit"

    def submit(job_id):
        (folder / job_id).mkdir(parents=True)
        (folder / job_id / f"{job_id}_submitted.pkl").write_bytes(b"")

    (folder / "12").mkdir(parents=True)  # the array's own folder: not a job
    watch = SubmissionWatch(folder, "SLURM job")
    for job_id in ("12_1", "12_0"):
        submit(job_id)
    watch.say_new()
    submit("12_10")
    watch.say_new()
    watch.say_new()
    watch.stop()
    assert capsys.readouterr().err.splitlines() == [
        job_line("12_0", folder, "SLURM job"),
        job_line("12_1", folder, "SLURM job"),
        job_line("12_10", folder, "SLURM job"),
    ]
    assert submitted_jobs(tmp_path / "nothing") == []
