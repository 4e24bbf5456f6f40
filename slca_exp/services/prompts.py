"""Versioned prompt templates: where they live, their sha256, and one-pass rendering.

A template is a UTF-8 text file with ``{{name}}`` placeholders. The value of a ``prompt`` config key
is either a path to such a file or the bare name of a file shipped in a package's ``prompts/``
folder (``slca_exp/judges/prompts``, ``slca_exp/simulators/prompts``). The file's sha256 travels
with the recipe and into every cache key, so editing a template can never reuse stale answers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
"""The ``slca_exp`` package folder."""

PROMPT_DIRS = {
    "judge": PACKAGE_ROOT / "judges" / "prompts",
    "simulator": PACKAGE_ROOT / "simulators" / "prompts",
    "reward.outcome": PACKAGE_ROOT / "judges" / "prompts" / "outcome",
}
"""Config group -> the folder holding its shipped templates."""


def resolve_prompt(value: str, group: str) -> Path | None:
    """The template file a ``prompt`` config value names, or ``None`` when there is none.

    Args:
        value: a path (absolute, or relative to the working directory) or a shipped file name.
        group: ``judge``, ``simulator`` or ``reward.outcome`` (selects the shipped folder).

    """
    given = Path(value).expanduser()
    if given.is_file():
        return given.resolve()
    shipped = PROMPT_DIRS[group] / value
    return shipped if shipped.is_file() else None


def shipped_prompts(group: str) -> list[str]:
    """Names of the templates shipped for ``group``, sorted."""
    return sorted(p.name for p in PROMPT_DIRS[group].glob("*.txt"))


@dataclass(frozen=True)
class PromptTemplate:
    """A loaded template, split once at its placeholders so rendering is a single join.

    Rendering in one pass matters: substituting placeholders one after the other would expand a
    ``{{reply}}`` that happens to occur inside the question text.

    Attributes:
        path: the file.
        text: its content.
        sha256: hex digest of its bytes.
        parts: literal text and placeholder names, alternating (literal first).

    """

    path: Path
    text: str
    sha256: str
    parts: tuple[str, ...]

    @classmethod
    def load(cls, value: str, group: str) -> PromptTemplate:
        """Load the template a ``prompt`` config value names.

        Raises:
            FileNotFoundError: naming the ``{group}.prompt`` key and the shipped templates.

        """
        path = resolve_prompt(value, group)
        if path is None:
            raise FileNotFoundError(
                f"{group}.prompt={value!r} is neither a file nor a shipped template; give a path "
                f"to a template file or one of: {', '.join(shipped_prompts(group)) or '(none)'}"
            )
        data = path.read_bytes()
        text = data.decode("utf-8")
        return cls(path, text, hashlib.sha256(data).hexdigest(), _split(text))

    @property
    def fields(self) -> tuple[str, ...]:
        """The names of its ``{{name}}`` fields, in order of appearance."""
        return self.parts[1::2]

    def render(self, **values: str) -> str:
        """The template with every placeholder replaced by its value.

        Raises:
            KeyError: a placeholder has no value.

        """
        out = list(self.parts)
        for i in range(1, len(out), 2):
            out[i] = values[out[i]]
        return "".join(out)


def literal_text(template: str) -> str:
    """A template's text without its placeholders: what every prompt rendered from it holds."""
    return "".join(_split(template)[0::2])


def _split(text: str) -> tuple[str, ...]:
    parts: list[str] = []
    literal: list[str] = []
    pos = 0
    while True:
        start = text.find("{{", pos)
        stop = text.find("}}", start + 2) if start >= 0 else -1
        if stop < 0:
            literal.append(text[pos:])
            parts.append("".join(literal))
            return tuple(parts)
        name = text[start + 2 : stop].strip()
        if not name.isidentifier():
            # "{{" not opening a placeholder (e.g. a JSON example): literal text.
            literal.append(text[pos : start + 2])
            pos = start + 2
            continue
        literal.append(text[pos:start])
        parts.append("".join(literal))
        parts.append(name)
        literal = []
        pos = stop + 2
