"""The Ray bootstrap of multi-task jobs (``slca_exp.launch.cluster``), without SLURM.

A 2-task job is simulated on this host: two Python processes with the variables ``srun`` and
submitit give every task, their output in submitit's log files. Both Ray nodes run here, with
distinct ports and temp dirs.
"""

import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slca_exp.core.task import (
    PORT_BLOCK,
    PORT_RANGE,
    PORT_SLOTS,
    ClusterError,
    Ports,
    TaskInfo,
    gpu_share,
)
from slca_exp.launch.ray_node import RayNode, temp_dir_of
from slca_exp.launch.rendezvous import report_failure
from slca_exp.launch.supervise import node_processes

TASK_SCRIPT = """
import dataclasses, json, os, signal, sys, time
from slca_exp.launch.cluster import serve
from slca_exp.launch.rendezvous import report_failure
from slca_exp.launch.supervise import node_processes
from slca_exp.core.task import NodeResources, TaskInfo

mode, join_timeout_s, temp_root = sys.argv[1], float(sys.argv[2]), sys.argv[3]
task = TaskInfo.from_env(one_task=mode == "slurm_signals")
assert task is not None
if mode == "slurm_signals":
    import ray  # as the verl engine's checks do, before the cluster (and its token) exists

def main(info):
    extra = {}
    if mode == "sigterm":  # like scancel: SIGTERM while the engine runs
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)
    if mode == "slurm_signals":  # SLURM signals every process of the job: the time limit,
        signalled = node_processes(info.nodes[0].temp_dir)  # then scancel
        names = {}
        for pid in signalled:
            try:
                raw = open(f"/proc/{pid}/cmdline", "rb").read()
                names[pid] = raw.replace(bytes(1), b" ").decode()
            except OSError:
                names[pid] = "?"
        for signum in (signal.SIGUSR2, signal.SIGTERM):
            for pid in signalled:
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:  # an idle Ray worker that had already left
                    pass
        time.sleep(3)
        alive = set(node_processes(info.nodes[0].temp_dir))
        extra["signalled"] = len(signalled)
        extra["survivors"] = len(set(signalled) & alive)
        # Ray's idle workers come and go on their own; the node's daemons must not go
        extra["daemons_gone"] = [
            names[pid]
            for pid in signalled
            if pid not in alive
            and any(d in names[pid] for d in ("raylet", "gcs_server", "supervise", " start "))
        ]
    import ray

    ray.init()  # joins through RAY_ADDRESS, like verl; serve closes the connection
    seen = sum(1 for n in ray.nodes() if n["Alive"])
    if mode == "slurm_signals":  # the node still runs work, on the GPU slots it declares
        on_gpu = ray.remote(num_gpus=1)(lambda: "ran on a GPU slot")
        extra["ran"] = ray.get(on_gpu.remote())
        extra["resources"] = ray.cluster_resources()
    return {
        "address": info.address,
        "ray_address": os.environ.get("RAY_ADDRESS"),
        "seen_by_ray_init": seen,
        "auth_mode": os.environ.get("RAY_AUTH_MODE"),
        "nodes": [dataclasses.asdict(n) for n in info.nodes],
        **extra,
    }

if mode == "report" and task.rank == 1:
    try:
        raise ValueError("the config check failed on purpose")
    except ValueError as exc:
        report_failure(task, exc)
        raise
# the verl engine's cpu backend asks for logical slots: 16 CPUs, a GPU per trainer worker
resources = NodeResources(num_cpus=16, num_gpus=2) if mode == "slurm_signals" else None
result = serve(task, main, join_timeout_s=join_timeout_s, temp_root=temp_root, resources=resources)
after = os.environ.get("RAY_ADDRESS")
leftover = [name for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN") if name in os.environ]
print(json.dumps({"rank": task.rank, "result": result, "ray_address": after, "auth": leftover}))
"""


class Job:
    """One simulated submitit job: its id, its folder and where its Ray nodes keep their files."""

    def __init__(self, tmp_path: Path, world_size: int = 2) -> None:
        self.job_id = _job_id_with_free_ports(world_size)
        self.folder = tmp_path / "submitit"
        self.folder.mkdir()
        self.world_size = world_size
        # short: Ray's unix sockets live under it
        self.temp_root = Path("/tmp") / f"slca-t{self.job_id}"

    def env(self, rank: int) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "SUBMITIT_")) and k != "RAY_ADDRESS"
        }
        env.update(
            SUBMITIT_EXECUTOR="slurm",
            SUBMITIT_FOLDER=str(self.folder),
            SLURM_JOB_ID=self.job_id,
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_NTASKS=str(self.world_size),
            SLURM_JOB_NUM_NODES="1",
            SLURM_JOB_NODELIST=socket.gethostname(),
            SLURM_CPUS_PER_TASK="1",
            SLURM_MEM_PER_NODE="4096",
        )
        return env

    def task(self, rank: int) -> TaskInfo:
        task = TaskInfo.from_env(self.env(rank), one_task=self.world_size == 1)
        assert task is not None
        return task

    def log(self, rank: int, ext: str = "err") -> Path:
        return self.folder / f"{self.job_id}_{rank}_log.{ext}"

    def temp_dirs(self) -> list[Path]:
        return [temp_dir_of(self.task(k), self.temp_root) for k in range(self.world_size)]

    def run(
        self,
        mode: str,
        ranks: tuple[int, ...] = (0, 1),
        join_timeout_s: float = 60.0,
        extra_env: dict[int, dict[str, str]] | None = None,
    ):
        """Start the tasks like srun (output in submitit's log files); wait for every one."""
        procs = {}
        for rank in ranks:
            env = {**self.env(rank), **(extra_env or {}).get(rank, {})}
            with self.log(rank, "out").open("w") as out, self.log(rank).open("w") as err:
                procs[rank] = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        TASK_SCRIPT,
                        mode,
                        str(join_timeout_s),
                        str(self.temp_root),
                    ],
                    env=env,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
        codes = {}
        for rank, proc in procs.items():
            try:
                codes[rank] = proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                for p in procs.values():
                    os.killpg(p.pid, 9)
                pytest.fail(f"rank {rank} did not end; its log:\n{self.log(rank).read_text()}")
        return codes

    def output(self, rank: int) -> dict:
        lines = self.log(rank, "out").read_text().strip().splitlines()
        assert lines, self.log(rank).read_text()
        return json.loads(lines[-1])

    def leftovers(self) -> list[int]:
        """Processes of this job's Ray nodes still alive (by environment or command line)."""
        pids = set()
        for temp_dir in self.temp_dirs():
            pids.update(node_processes(temp_dir))
        found = subprocess.run(
            ["pgrep", "-f", str(self.temp_root)], capture_output=True, text=True
        ).stdout.split()
        return sorted(pids | {int(p) for p in found})


@pytest.fixture
def job(tmp_path):
    job = Job(tmp_path)
    yield job
    for temp_dir in job.temp_dirs():  # only the processes of this test's nodes
        _kill(node_processes(temp_dir))
    shutil.rmtree(job.temp_root, ignore_errors=True)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def _job_id_with_free_ports(world_size: int) -> str:
    """A random job id whose port blocks nobody on this host uses (another run of these tests)."""
    while True:
        job_id = str(random.randint(10**8, 10**9 - 1))
        blocks = [Ports.for_node(job_id, k).fixed(head=True) for k in range(world_size)]
        if all(_port_free(p) for block in blocks for p in block.values()):
            return job_id


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
        return True


def _gcs_answers(job: Job) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", Ports.head_gcs_port(job.job_id)), 1):
            return True
    except OSError:
        return False


# -- TaskInfo ---------------------------------------------------------------------------------


def test_from_env_is_none_outside_a_submitit_job_and_for_a_single_task(tmp_path):
    assert TaskInfo.from_env({}) is None
    slurm_only = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_PROCID": "1"}
    assert TaskInfo.from_env(slurm_only) is None
    assert TaskInfo.from_env(slurm_only, one_task=True) is None  # still no submitit job
    one_task = {**slurm_only, "SUBMITIT_EXECUTOR": "slurm", "SUBMITIT_FOLDER": str(tmp_path)}
    assert TaskInfo.from_env({**one_task, "SLURM_NTASKS": "1"}) is None
    assert TaskInfo.from_env(one_task) is not None
    # an engine that runs on Ray asks for the task of a one-task job too
    alone = TaskInfo.from_env({**one_task, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}, one_task=True)
    assert (alone.rank, alone.world_size, alone.rendezvous) == (0, 1, tmp_path / "ray-7")
    with pytest.raises(ClusterError, match="SUBMITIT_FOLDER"):
        TaskInfo.from_env({**slurm_only, "SUBMITIT_EXECUTOR": "slurm"})


def test_from_env_reads_a_slurm_array_task(tmp_path):
    env = {
        "SUBMITIT_EXECUTOR": "slurm",
        "SUBMITIT_FOLDER": str(tmp_path / "%j"),
        "SLURM_JOB_ID": "1005",
        "SLURM_ARRAY_JOB_ID": "1000",
        "SLURM_ARRAY_TASK_ID": "5",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "4",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURMD_NODENAME": "gpu08",
        "SLURM_CPUS_PER_TASK": "16",
        "SLURM_MEM_PER_NODE": "200000",
        "SLURM_RESTART_COUNT": "2",
    }
    task = TaskInfo.from_env(env)
    folder = tmp_path / "1000_5"
    assert task == TaskInfo(
        job_id="1000_5",
        rank=3,
        local_rank=1,
        world_size=4,
        num_nodes=2,
        tasks_per_node=2,
        head_host="gpu07",
        host="gpu08",
        folder=folder,
        rendezvous=folder / "ray-1000_5.r2",
        log=str(folder / "1000_5_3_log.err"),
        cpus=16,
        mem_mb=100000,
    )
    assert task.log_of(0) == str(folder / "1000_5_0_log.err")
    folder.mkdir()
    (folder / "1000_5_0_log.out").touch()  # stderr_to_stdout: only the .out file exists
    assert task.log_of(0) == str(folder / "1000_5_0_log.out")


def test_from_env_reads_a_local_executor_task(tmp_path):
    env = {
        "SUBMITIT_EXECUTOR": "local",
        "SUBMITIT_FOLDER": str(tmp_path),
        "SUBMITIT_LOCAL_JOB_ID": "4242",
        "SUBMITIT_LOCAL_NTASKS": "2",
        "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
        "SUBMITIT_LOCAL_GLOBALID": "1",
        "SUBMITIT_LOCAL_LOCALID": "1",
    }
    task = TaskInfo.from_env(env)
    assert (task.job_id, task.rank, task.local_rank, task.world_size) == ("4242", 1, 1, 2)
    assert task.head_host == task.host == socket.gethostname()
    assert task.rendezvous == tmp_path / "ray-4242"
    assert (task.cpus, task.mem_mb, task.tasks_per_node) == (None, None, 2)


def test_report_failure_leaves_the_rank_its_host_its_log_and_the_error(tmp_path):
    job = Job(tmp_path)
    report_failure(job.task(1), ValueError("bad config"))
    report = json.loads((job.task(0).rendezvous / "rank1.failed").read_text())
    assert report == {
        "rank": 1,
        "host": job.task(1).host,
        "log": str(job.log(1)),
        "error": "ValueError: bad config",
    }


# -- ports and GPUs ---------------------------------------------------------------------------


def test_ports_are_distinct_in_range_and_the_head_gcs_port_follows_from_the_job_id():
    for job_id in ("1", "123456789", "1000_5", "99999999_123"):
        blocks = [Ports.for_node(job_id, r) for r in range(8)]
        ports = [p for b in blocks for p in (*b.fixed(head=True).values(), b.min_worker)]
        ports += [b.max_worker for b in blocks]
        assert len(set(ports)) == len(ports)
        assert all(PORT_RANGE[0] <= p < PORT_RANGE[1] for p in ports)
        for b in blocks:
            assert b.max_worker - b.min_worker > 400
            assert max(b.fixed(head=True).values()) < b.min_worker
            assert b.max_worker - b.gcs < PORT_BLOCK
        assert Ports.head_gcs_port(job_id) == blocks[0].gcs == Ports.for_node(job_id).gcs
    assert len({Ports.head_gcs_port(str(j)) for j in range(100)}) > PORT_SLOTS // 2
    assert "--port" not in " ".join(Ports.for_node("1", 1).ray_start_args(head=False))
    with pytest.raises(ValueError):
        Ports.for_node("1", PORT_SLOTS)


def test_each_task_of_a_host_gets_its_share_of_the_gpus():
    assert gpu_share({}, 2, 1) == (None, None)
    assert gpu_share({"CUDA_VISIBLE_DEVICES": ""}, 1, 0) == (0, None)
    shared = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_GPUS_ON_NODE": "4"}
    assert gpu_share(shared, 2, 1) == (2, "2,3")
    assert gpu_share(shared, 1, 0) == (4, None)
    bound = {"CUDA_VISIBLE_DEVICES": "3", "SLURM_GPUS_ON_NODE": "4"}  # --gpus-per-task=1
    assert gpu_share(bound, 4, 3) == (1, None)
    assert gpu_share({"SLURM_GPUS_ON_NODE": "8"}, 4, 2) == (2, "4,5")


# -- a 2-task job on this host -----------------------------------------------------------------


def test_a_two_task_job_boots_one_cluster_runs_main_on_rank_0_and_stops(job):
    start = time.monotonic()
    codes = job.run("ok")
    elapsed = time.monotonic() - start
    assert codes == {0: 0, 1: 0}, job.log(0).read_text() + job.log(1).read_text()
    head, worker = job.output(0), job.output(1)
    assert worker == {"rank": 1, "result": None, "ray_address": None, "auth": []}
    assert head["auth"] == []  # the cluster's token is not left in the task's environment
    result = head["result"]
    gcs = Ports.head_gcs_port(job.job_id)
    assert result["address"].endswith(f":{gcs}") and result["ray_address"] == result["address"]
    assert head["ray_address"] is None  # restored after main
    assert result["seen_by_ray_init"] == 2 and result["auth_mode"] == "token"
    nodes = result["nodes"]
    assert [n["rank"] for n in nodes] == [0, 1]
    assert [n["node_manager_port"] for n in nodes] == [
        Ports.for_node(job.job_id, k).node_manager for k in (0, 1)
    ]
    assert [n["temp_dir"] for n in nodes] == [str(d) for d in job.temp_dirs()]
    assert all(n["resources"]["CPU"] == 1 for n in nodes)
    assert len({n["probe_pid"] for n in nodes}) == 2
    assert f"Ray cluster up: 2/2 nodes (head {result['address']})" in job.log(0).read_text()
    rendezvous = job.task(0).rendezvous
    assert {p.name for p in rendezvous.iterdir()} == {
        "head.json",
        "head.done",
        "rank1.joined",
        "rank1.left",
    }
    assert job.leftovers() == []
    assert not _gcs_answers(job)
    assert not any(d.exists() for d in job.temp_dirs())  # removed after a clean stop
    print(f"2-task job: {elapsed:.1f} s")


@pytest.mark.parametrize("failure", ["report", "ray_start"])
def test_a_failure_on_rank_1_fails_rank_0_with_rank_1s_log_path(job, tmp_path, failure):
    extra_env = {}
    if failure == "ray_start":  # rank 1's `ray start` dies at once: it imports a broken ray
        broken = tmp_path / "broken" / "ray"
        broken.mkdir(parents=True)
        (broken / "__init__.py").write_text("raise ImportError('a broken ray, on purpose')\n")
        extra_env[1] = {"PYTHONPATH": str(broken.parent)}
    start = time.monotonic()
    codes = job.run(failure, extra_env=extra_env)
    elapsed = time.monotonic() - start
    assert codes[0] != 0 and codes[1] != 0
    head_log = job.log(0).read_text()
    assert "ClusterError: rank 1 on " in head_log
    assert f"its log: {job.log(1)}" in head_log
    if failure == "report":
        assert "ValueError: the config check failed on purpose" in head_log
    else:
        assert "rank 1's `ray start` exited with status 1" in head_log
        assert "a broken ray, on purpose" in job.log(1).read_text()  # ray start's own output
    assert (job.task(0).rendezvous / "head.failed").exists()
    assert elapsed < 60
    assert job.leftovers() == []
    assert not _gcs_answers(job)


def test_a_token_another_ray_left_in_home_does_not_get_in_the_way(job, tmp_path):
    """A local ``ray.init()`` (verl's, on a workstation) leaves ``~/.ray/auth_token`` behind."""
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("0" * 64)
    codes = job.run("ok", extra_env={0: {"HOME": str(home)}, 1: {"HOME": str(home)}})
    assert codes == {0: 0, 1: 0}, job.log(0).read_text()[-3000:] + job.log(1).read_text()[-3000:]
    assert job.output(0)["result"]["seen_by_ray_init"] == 2


def test_sigterm_on_rank_0_while_main_runs_stops_every_node(job):
    codes = job.run("sigterm")
    head_log = job.log(0).read_text()
    assert codes[0] != 0 and "RunKilled: received signal 15" in head_log
    assert codes[1] == 0, job.log(1).read_text()
    assert "rank 1 stops: the head failed: RunKilled" in job.log(1).read_text()
    assert {"head.failed", "rank1.left"} <= {p.name for p in job.task(0).rendezvous.iterdir()}
    assert job.leftovers() == []
    assert not _gcs_answers(job)


def test_a_one_task_job_gets_the_engines_slots_and_its_node_outlives_slurms_signals(tmp_path):
    # The task closes its runs before its node goes: a Ray driver whose raylet dies exits on
    # the spot, and SLURM sends SIGTERM (and the time-limit signal) to every process of the job.
    job = Job(tmp_path, world_size=1)
    try:
        start = time.monotonic()
        codes = job.run("slurm_signals", ranks=(0,))
        elapsed = time.monotonic() - start
        assert codes == {0: 0}, job.log(0).read_text()[-3000:]
        result = job.output(0)["result"]
        assert "Ray cluster up: 1/1 nodes" in job.log(0).read_text()
        assert result["seen_by_ray_init"] == 1
        # SLURM_CPUS_PER_TASK=1, but the engine's 16 logical CPU slots; 2 logical GPU slots
        assert result["resources"]["CPU"] == 16 and result["resources"]["GPU"] == 2
        assert result["signalled"] >= 3  # raylet, GCS, the supervisor, `ray start`, workers
        assert result["daemons_gone"] == []  # the node's daemons outlived the signals
        assert result["survivors"] >= 3
        assert result["ran"] == "ran on a GPU slot"
        assert job.leftovers() == []  # the task stopped its node, signals or not
        print(f"1-task job, SLURM's signals to every Ray process: {elapsed:.1f} s")
    finally:
        for temp_dir in job.temp_dirs():
            _kill(node_processes(temp_dir))
        shutil.rmtree(job.temp_root, ignore_errors=True)


def test_a_task_whose_port_block_another_node_holds_takes_its_next_free_one(job):
    own = [Ports.for_node(job.job_id, k) for k in (0, 1)]
    with socket.socket() as gcs, socket.socket() as raylet:  # another Ray node's, as it were
        for sock, port in ((gcs, own[0].gcs), (raylet, own[1].node_manager)):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("", port))
            sock.listen()
        codes = job.run("ok")
    assert codes == {0: 0, 1: 0}, job.log(0).read_text() + job.log(1).read_text()
    result = job.output(0)["result"]
    # each task's next candidates: its own slot shifted by the host's 2 tasks
    candidates = [
        [Ports.for_node(job.job_id, k, shift) for shift in range(2, PORT_SLOTS, 2)] for k in (0, 1)
    ]
    head_port = int(result["address"].rsplit(":", 1)[1])
    assert head_port != own[0].gcs and head_port in {p.gcs for p in candidates[0]}
    ports = [n["node_manager_port"] for n in result["nodes"]]
    assert ports[1] != own[1].node_manager
    assert ports[1] in {p.node_manager for p in candidates[1]}
    assert result["seen_by_ray_init"] == 2  # the worker found the head where it moved
    assert job.leftovers() == []


def test_a_node_whose_ports_are_taken_is_refused_before_ray_starts(job):
    task = job.task(1)
    ports = Ports.for_node(job.job_id, 1)
    with socket.socket() as holder:
        # as _port_free: a connection another test left in TIME_WAIT on it does not count
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("", ports.node_manager))
        holder.listen()
        with pytest.raises(ClusterError, match=f"in use on .*{ports.node_manager} .node_manager"):
            RayNode.start(task, ports, "127.0.0.1", job.temp_dirs()[1], head_address="x:1")
    assert job.leftovers() == []


def test_a_rank_that_never_joins_fails_rank_0_naming_it_and_its_log(job):
    codes = job.run("ok", ranks=(0,), join_timeout_s=1.0)
    assert codes == {0: 1}
    head_log = job.log(0).read_text()
    assert "only 1/2 Ray nodes joined within 1 s" in head_log
    assert f"missing: rank 1 (its log: {job.log(1)})" in head_log
    assert job.leftovers() == []


def test_a_two_task_job_of_submitits_local_executor_boots_one_cluster(tmp_path):
    import submitit

    temp_root = Path("/tmp") / f"slca-l{random.randint(10**6, 10**7 - 1)}"

    def task_main() -> object:  # pickled by value: runs in both tasks
        from slca_exp.core.task import TaskInfo
        from slca_exp.launch.cluster import serve

        task = TaskInfo.from_env()
        assert task is not None
        return serve(task, lambda info: [n.rank for n in info.nodes], temp_root=temp_root)

    executor = submitit.AutoExecutor(folder=tmp_path / "jobs", cluster="local")
    executor.update_parameters(tasks_per_node=2, timeout_min=3)
    submitted = executor.submit(task_main)
    try:
        assert submitted.results() == [[0, 1], None]
    finally:
        submitted.cancel(check=False)
        for rank in (0, 1):
            _kill(node_processes(temp_root / f"{submitted.job_id}-{rank}"))
        shutil.rmtree(temp_root, ignore_errors=True)
    assert "Ray cluster up: 2/2 nodes" in submitted.stderr()
    for rank in (0, 1):
        assert node_processes(temp_root / f"{submitted.job_id}-{rank}") == []
