"""Jobs on other nodes are not given a sqlite store on a network filesystem."""

from pathlib import Path

import pytest

from slca_exp import commands
from slca_exp.config.schema import TrackingConfig
from slca_exp.launch import profiles
from slca_exp.launch.filesystems import filesystem_type, is_network
from slca_exp.launch.profiles import LauncherProfile, network_store_problems

MOUNTS = """\
sysfs /sys sysfs rw,nosuid 0 0
/dev/vda1 / ext4 rw,relatime 0 0
server:/export/home /home nfs4 rw,vers=4.2 0 0
tmpfs /home/me/fast tmpfs rw 0 0
10.0.0.1@tcp:/scratch /scratch lustre rw,flock 0 0
/dev/sdb1 /scratch/local\\040disk xfs rw 0 0
gw:/proj /proj fuse.sshfs rw 0 0
"""

SLURM = LauncherProfile(kind="submitit_slurm")
TWO_NODES = LauncherProfile(kind="submitit_local", nodes=2)
HERE = LauncherProfile(kind="submitit_local")


def nfs(_: Path) -> str:
    return "nfs4"


def tracking(**changes) -> TrackingConfig:
    return TrackingConfig(**{"backends": ["mlflow"], "root": "/home/me/runs", **changes})


@pytest.fixture()
def mounts(tmp_path):
    path = tmp_path / "mounts"
    path.write_text(MOUNTS)
    return path


def test_filesystem_type_is_the_longest_mount_point_holding_the_path(mounts):
    assert filesystem_type("/home/me/runs/mlflow.db", mounts) == "nfs4"  # need not exist
    assert filesystem_type("/home/me/fast/x", mounts) == "tmpfs"
    assert filesystem_type("/home/meadow", mounts) == "nfs4"
    assert filesystem_type("/homework", mounts) == "ext4"  # /home is not a prefix of it
    assert filesystem_type("/scratch/run/mlflow.db", mounts) == "lustre"
    assert filesystem_type("/scratch/local disk/mlflow.db", mounts) == "xfs"
    assert filesystem_type("/proj/a", mounts) == "fuse.sshfs"
    assert filesystem_type("/", mounts) == "ext4"
    assert filesystem_type("/x", mounts.with_name("no-such-table")) is None


def test_filesystem_type_of_this_machine():
    assert filesystem_type(Path.cwd()) is not None


def test_network_filesystems():
    for kind in ("nfs", "nfs4", "lustre", "gpfs", "cifs", "beegfs", "ceph", "fuse.sshfs"):
        assert is_network(kind), kind
    for kind in ("ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "fuse.portal"):
        assert not is_network(kind), kind


def test_slurm_or_multi_node_with_sqlite_on_a_network_filesystem_is_refused():
    for profile in (SLURM, TWO_NODES):
        (problem,) = network_store_problems(profile, tracking(), fs_type=nfs)
        assert problem.key == "tracking.root"
        assert "/home/me/runs/mlflow.db" in problem.what and "nfs4" in problem.what
        assert "tracking.mlflow_uri=http://" in problem.fix and "README" in problem.fix
        assert "tracking.allow_sqlite_on_network_fs=true" in problem.fix
    explicit = tracking(mlflow_uri="sqlite:////proj/store/mlflow.db")
    (problem,) = network_store_problems(SLURM, explicit, fs_type=nfs)
    assert problem.key == "tracking.mlflow_uri" and "/proj/store/mlflow.db" in problem.what


def test_what_passes():
    local = lambda _: "ext4"  # noqa: E731
    assert network_store_problems(SLURM, tracking(), fs_type=local) == []
    assert network_store_problems(HERE, tracking(), fs_type=nfs) == []  # one host
    assert network_store_problems(None, tracking(), fs_type=nfs) == []
    server = tracking(mlflow_uri="http://10.0.0.5:5000")
    assert network_store_problems(SLURM, server, fs_type=nfs) == []
    override = tracking(allow_sqlite_on_network_fs=True)
    assert network_store_problems(SLURM, override, fs_type=nfs) == []
    no_mlflow = tracking(backends=["wandb"])
    assert network_store_problems(SLURM, no_mlflow, fs_type=nfs) == []
    unknown = lambda _: None  # noqa: E731 - no mount table: nothing known, nothing refused
    assert network_store_problems(SLURM, tracking(), fs_type=unknown) == []


def test_the_command_line_refuses_before_submitting(tmp_path, monkeypatch, capsys):
    seen = []

    def on_nfs(path):
        seen.append(path)
        return "nfs4"

    real = profiles.network_store_problems
    monkeypatch.setattr(
        profiles,
        "network_store_problems",
        lambda profile, tracking: real(profile, tracking, fs_type=on_nfs),
    )
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "shared"
    fits = ["launcher.cpus_per_task=1", "launcher.mem_gb=1"]  # any one-node test cluster
    args = ["train", "launcher=slurm_cpu", *fits, "tracking=mlflow", f"tracking.root={root}"]
    assert commands.main(args) == 2
    err = capsys.readouterr().err
    assert "tracking.root" in err and "nfs4" in err and "tracking.mlflow_uri=http://" in err
    assert "tracking.allow_sqlite_on_network_fs=true" in err
    assert seen == [root / "mlflow.db"]
    assert list(tmp_path.iterdir()) == []  # nothing submitted, nothing created
