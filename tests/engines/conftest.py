"""Fixtures shared by the local engine's tests."""

import pytest

from tests.conftest import built_once
from tests.engines.tool_caller import build_tool_caller


@pytest.fixture(scope="session")
def tool_caller(tmp_path_factory):
    """A tiny checkpoint fine-tuned to call tools (``tool_caller.ToolCaller``), built once."""
    return built_once(tmp_path_factory, "tool-caller", build_tool_caller)
