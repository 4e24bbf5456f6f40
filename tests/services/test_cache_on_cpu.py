"""The persistent sqlite cache."""

import subprocess
import sys

from slca_exp.services.cache import (
    CACHE_DIR_ENV,
    ServiceCache,
    cache_key,
    default_cache_path,
)


def test_round_trip_and_persistence(tmp_path):
    path = tmp_path / "sub" / "c.sqlite"
    with ServiceCache(path) as cache:
        cache.put_many({"a": {"content": "x"}, "b": [1, 2.5, None], "u": "héllo ✓"})
        assert cache.get_many(["a", "missing", "b"]) == {"a": {"content": "x"}, "b": [1, 2.5, None]}
    with ServiceCache(path) as again:
        assert again.get("u") == "héllo ✓" and again.get("nope") is None and len(again) == 3
    assert (path.parent / "c.sqlite").read_bytes()[:15] == b"SQLite format 3"


def test_many_keys_are_chunked(tmp_path):
    with ServiceCache(tmp_path / "c.sqlite") as cache:
        items = {f"k{i}": i for i in range(2500)}
        cache.put_many(items)
        assert cache.get_many(list(items) + ["zz"]) == items


def test_key_is_canonical_and_sensitive():
    a = {"kind": "judge", "model": "m", "temperature": 0.0, "messages": [{"role": "user"}]}
    assert cache_key(a) == cache_key(dict(reversed(list(a.items()))))
    assert cache_key(a) != cache_key(a | {"temperature": 0.5})
    assert len(cache_key({"x": float("nan")})) == 64


def test_default_location_follows_the_env_var(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    assert default_cache_path() == tmp_path / "services.sqlite"
    monkeypatch.delenv(CACHE_DIR_ENV)
    assert default_cache_path().parts[-3:] == (".cache", "slca-exp", "services.sqlite")


def test_several_processes_write_one_file(tmp_path):
    path = tmp_path / "shared.sqlite"
    code = (
        "import sys\nfrom slca_exp.services.cache import ServiceCache\n"
        "c = ServiceCache(sys.argv[1])\n"
        "for i in range(50):\n    c.put_many({f'{sys.argv[2]}-{i}': i})\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(path), name]) for name in ("p", "q", "r")
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    with ServiceCache(path) as cache:
        assert len(cache) == 150 and cache.get("q-49") == 49
