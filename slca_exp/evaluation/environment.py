"""A benchmark's own Python environment: built once, under a lock, and recorded.

``bfcl-eval`` pins numpy 1.26.4, filelock 3.20.0, networkx 3.3 and more, against the project's
own versions, so it runs in a virtual environment of its own, outside the project's:
``<root>/bfcl-eval-<version>-py<major.minor>`` (root: ``eval.env_root``, else
``$SLCA_EXP_ENVS``, else ``~/.cache/slca-exp/envs``). The first eval that needs it builds it
with uv (a dependency of slca-exp) under a file lock, so that concurrent evals (a sweep's jobs)
build it once and the others wait; it is built in a temporary folder and renamed into place only
once BFCL's generation and checker import in it, so a killed build leaves nothing half-made.

What is left out, and why (:data:`BFCL_EXCLUDED`): ``sentence-transformers`` (which would pull a
second, multi-GB torch) and ``faiss-cpu``. BFCL imports them only in the vector backend of its
memory categories, which slca-exp does not offer. What is added (:data:`BFCL_ADDED`):
``soundfile``, which ``qwen-agent`` imports without declaring it, and which BFCL imports when it
loads its model registry.

The environment's record (``slca-exp-env.json`` in its folder) holds the distribution, its
version, what was left out and added, the Python and every installed package's version; each
eval logs it with the scores.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

ENVS_ENV = "SLCA_EXP_ENVS"
"""The environment variable naming the folder benchmark environments are built in."""
RECORD = "slca-exp-env.json"
BFCL_EXCLUDED = ("sentence-transformers", "faiss-cpu")
BFCL_ADDED = ("soundfile",)
BFCL_IMPORTS = (
    "bfcl_eval._llm_response_generation",
    "bfcl_eval.eval_checker.eval_runner",
    "bfcl_eval.constants.model_config",
    "bfcl_eval.model_handler.api_inference.openai_completion",
)
"""What the driver imports: the environment is not kept unless all of them import."""
BUILD_TIMEOUT_S = 1800


class BuildError(RuntimeError):
    """The benchmark's environment could not be built."""


@dataclass(frozen=True)
class BenchmarkEnv:
    """A built environment: its folder, its Python and its record."""

    folder: Path
    record: dict

    @property
    def python(self) -> Path:
        """The environment's interpreter."""
        return self.folder / "bin" / "python"


def env_root(configured: str | None = None) -> Path:
    """Where benchmark environments live: ``eval.env_root``, ``$SLCA_EXP_ENVS``, or the cache."""
    chosen = configured or os.environ.get(ENVS_ENV)
    return Path(chosen).expanduser() if chosen else Path.home() / ".cache" / "slca-exp" / "envs"


def bfcl_folder(root: Path, version: str) -> Path:
    """The folder of BFCL ``version``'s environment under ``root``."""
    python = f"py{sys.version_info.major}.{sys.version_info.minor}"
    return root / f"bfcl-eval-{version}-{python}"


def existing(folder: Path) -> BenchmarkEnv | None:
    """The environment in ``folder`` if it was built to the end (its record is written last)."""
    record = folder / RECORD
    if not record.is_file():
        return None
    return BenchmarkEnv(folder, json.loads(record.read_text()))


def bfcl_env(version: str, root: Path, say=print) -> BenchmarkEnv:  # noqa: ANN001
    """BFCL ``version``'s environment under ``root``: found, or built once under a lock."""
    folder = bfcl_folder(root, version)
    found = existing(folder)
    if found is not None:
        return found
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        found = existing(folder)  # another eval may have built it while this one waited
        if found is not None:
            return found
        say(f"building BFCL's environment (bfcl-eval {version}) in {folder}: once, a minute or so")
        return _build(folder, version)


def _build(folder: Path, version: str) -> BenchmarkEnv:
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)  # a folder without its record is a dead build
    uv = _uv()
    python = partial / "bin" / "python"
    excludes = partial.with_name(partial.name + ".excludes.txt")
    excludes.write_text("".join(f"{name}\n" for name in BFCL_EXCLUDED))
    try:
        _run([uv, "venv", "--quiet", "--python", sys.executable, str(partial)])
        _run(
            [
                uv,
                "pip",
                "install",
                "--quiet",
                "--native-tls",
                "--python",
                str(python),
                "--excludes",
                str(excludes),
                f"bfcl-eval=={version}",
                *BFCL_ADDED,
            ]
        )
        imports = "; ".join(f"import {module}" for module in BFCL_IMPORTS)
        # BFCL writes its result folders beside its package unless told where: a scratch one
        probe = {**os.environ, "BFCL_PROJECT_ROOT": str(partial / "probe")}
        _run([str(python), "-c", imports], env=probe)
        shutil.rmtree(partial / "probe", ignore_errors=True)
        freeze = _run([uv, "pip", "freeze", "--python", str(python)])
    finally:
        excludes.unlink(missing_ok=True)
    record = {
        "distribution": "bfcl-eval",
        "version": version,
        "excluded": list(BFCL_EXCLUDED),
        "added": list(BFCL_ADDED),
        "python": sys.version.split()[0],
        "packages": sorted(freeze.split()),
        "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    # renamed into place: its console scripts keep the temporary folder in their first line,
    # but nothing runs them (the driver runs as `<folder>/bin/python <script>`)
    partial.rename(folder)
    (folder / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return BenchmarkEnv(folder, record)


def _uv() -> str:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found is None:
            raise BuildError(
                "uv, which builds benchmark environments, is not installed: pip install uv"
            ) from None
        return found


def _run(command: list[str], env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env=env, check=False
    )
    if done.returncode != 0:
        raise BuildError(
            f"building BFCL's environment failed at `{' '.join(command[:4])} ...` "
            f"(exit status {done.returncode}):\n{done.stderr[-3000:]}"
        )
    return done.stdout
