"""File locks, and the first use of every cache that jobs share, by six processes at once.

Each cache is used for the first time by six forked processes released together (as jobs of a
sweep start): every one of them must get one complete artifact, built once.
"""

import hashlib
import os
import time
from pathlib import Path

import pytest

# Imported here once, so that the forks share them instead of each importing them again.
import transformers.models.qwen2.modeling_qwen2  # noqa: F401
from filelock import FileLock, Timeout

from slca_exp.backbones import hf as _hf  # noqa: F401
from slca_exp.backbones import load_backbone
from slca_exp.backbones import tiny as tiny_module
from slca_exp.backbones.tiny import MANIFEST as BACKBONE_MANIFEST
from slca_exp.config.schema import (
    BackboneConfig,
    DataConfig,
    RunConfig,
    TinyArchConfig,
    TrackingConfig,
)
from slca_exp.data.splits import split_files
from slca_exp.data.synthetic import MANIFEST, SPLIT_FILES
from slca_exp.services.cache import ServiceCache
from tests.concurrency import run_together

PROCESSES = 6


def hold_and_log(lock: Path, log: Path, i: int) -> int:
    """Write ``enter i`` and ``leave i`` under the lock, with a pause between them."""
    with FileLock(lock):
        with log.open("a") as f:
            f.write(f"enter {i}\n")
        time.sleep(0.02)
        with log.open("a") as f:
            f.write(f"leave {i}\n")
    return os.getpid()


def test_one_process_at_a_time_holds_the_lock(tmp_path):
    lock, log = tmp_path / "sub" / "x.lock", tmp_path / "log"
    pids = run_together(hold_and_log, [(lock, log, i) for i in range(PROCESSES)])
    assert len(set(pids)) == PROCESSES
    lines = log.read_text().split()
    pairs = list(zip(lines[0::4], lines[1::4], lines[2::4], lines[3::4], strict=True))
    # enter i, leave i, enter j, leave j, ...: no one entered while another was inside.
    assert [(a, c) for a, _, c, _ in pairs] == [("enter", "leave")] * PROCESSES
    assert all(b == d for _, b, _, d in pairs)
    assert sorted(int(b) for _, b, _, _ in pairs) == list(range(PROCESSES))


def test_a_lock_held_elsewhere_times_out_naming_the_file(tmp_path):
    lock = tmp_path / "mlflow.db.lock"
    # A second open file description conflicts with the first, even in one process.
    with (
        FileLock(lock),
        pytest.raises(Timeout, match=r"mlflow\.db\.lock"),
        FileLock(lock, timeout=0.1),
    ):
        pass
    with FileLock(lock, timeout=0.1):  # released
        pass
    assert lock.is_file()  # left in place: waiters share one inode


def hold_and_die(lock: Path) -> None:
    FileLock(lock).acquire()
    os._exit(0)  # no release: the kernel drops the lock with the process


def test_a_lock_file_left_by_a_killed_holder_blocks_no_one(tmp_path):
    lock = tmp_path / "x.lock"
    pid = os.fork()
    if pid == 0:
        hold_and_die(lock)
    os.waitpid(pid, 0)
    assert lock.is_file()  # the stale lock file is still there
    with FileLock(lock, timeout=0.1):
        pass


# --- six processes, one new cache each ---------------------------------------------------------


def synthetic_split(root: Path) -> dict[str, str]:
    config = RunConfig(data=DataConfig(rows=8, seed=7), tracking=TrackingConfig(root=str(root)))
    return {
        name: hashlib.sha256(path.read_bytes()).hexdigest()
        for name, path in split_files(config).items()
    }


def test_six_first_uses_of_the_synthetic_split(tmp_path):
    digests = run_together(synthetic_split, [(tmp_path,)] * PROCESSES)
    assert all(d == digests[0] for d in digests) and set(digests[0]) == set(SPLIT_FILES)
    (folder,) = [p for p in (tmp_path / "data" / "synthetic").iterdir() if p.is_dir()]
    assert {p.name for p in folder.iterdir()} == {MANIFEST, *SPLIT_FILES.values()}


def service_cache(path: Path, i: int) -> int:
    with ServiceCache(path) as cache:
        cache.put_many({f"key{i}": {"answer": i}})
        return cache.get(f"key{i}")["answer"]


def test_six_first_uses_of_the_service_cache(tmp_path):
    path = tmp_path / "services.sqlite"
    assert run_together(service_cache, [(path, i) for i in range(PROCESSES)]) == list(
        range(PROCESSES)
    )
    with ServiceCache(path) as cache:
        assert len(cache) == PROCESSES


ARCH = TinyArchConfig(
    num_layers=1,
    hidden_size=16,
    num_heads=2,
    intermediate_size=32,
    vocab_size=320,
    max_position_embeddings=128,
)
CORPUS = [f"<|im_start|>user\nWeather in city {i}?<|im_end|>" for i in range(40)]


def tiny_backbone(root: Path, builds: Path) -> str:
    """Load the tiny backbone, writing this process's pid to ``builds`` if it builds it."""
    real = tiny_module._build_into

    def counted(folder, *args, **kwargs):
        with builds.open("a") as f:
            f.write(f"{os.getpid()}\n")
        return real(folder, *args, **kwargs)

    tiny_module._build_into = counted  # in this child process only
    backbone = load_backbone(
        BackboneConfig(name="tiny", source="builtin", arch=ARCH),
        corpus=lambda: CORPUS,
        cache_root=root,
        seed=3,
    )
    return str(backbone.path)


def test_six_first_uses_of_the_tiny_backbone_build_it_once(tmp_path):
    builds = tmp_path / "builds"
    paths = run_together(tiny_backbone, [(tmp_path / "cache", builds)] * PROCESSES)
    assert len(set(paths)) == 1 and (Path(paths[0]) / BACKBONE_MANIFEST).is_file()
    assert len(builds.read_text().split()) == 1
    (folder,) = [p for p in (tmp_path / "cache" / "backbones").iterdir() if p.is_dir()]
    assert str(folder) == paths[0]
