"""Keep secrets out of everything slca-exp writes: params, tags, artifacts, W&B files, logs.

Secrets come from the environment, never from a config. Three rules find them:

1. a mapping value whose key looks like a secret (``api_key``, ``hf_token``, ``password``, ...;
   not ``api_key_env``, which holds the NAME of a variable, nor counts like ``max_tokens``);
2. the value of an environment variable whose name looks like a secret (``*_API_KEY``,
   ``*_TOKEN``, ``*PASSWORD*``, ...) or that a config names as one (``judge.api_key_env``),
   wherever it occurs inside any string;
3. credentials embedded in URLs (``https://user:pass@host``, ``?token=...``) and
   ``secret_key=value`` pairs in free text (Hydra's override lists, log lines).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REDACTED = "<redacted>"

_SECRET_WORD = (
    r"(?:api[_-]?key|apikey|access[_-]?key|secret(?:[_-]?key)?|client[_-]?secret|passw(?:or)?d"
    r"|token|auth[_-]?token|access[_-]?token|bearer|credentials?|private[_-]?key)"
)
SECRET_KEY = re.compile(rf"^(?:.*[_.-])?{_SECRET_WORD}$", re.IGNORECASE)
"""A key whose last word names a secret: ``api_key``, ``HF_TOKEN``, ``judge.password``."""

SECRET_ENV = re.compile(rf"^(?:.*_)?{_SECRET_WORD}(?:_.*)?$|^(?:.*_)?(?:KEY|PAT)$", re.IGNORECASE)
"""An environment variable name that holds a secret: ``OPENAI_API_KEY``, ``WANDB_API_KEY``."""

_NOT_SECRET_ENV = re.compile(r"^(?:.*_)?(?:KEY_ENV|TOKENS?_(?:PER|LIMIT|COUNT).*)$", re.IGNORECASE)

_MIN_SECRET_LEN = 6
"""Shorter env values (``1``, ``true``) are too common to be replaced inside other text."""

_URL_AUTH = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@'\"]+@")
_PAIR = re.compile(
    rf"(?P<key>[\w.-]*{_SECRET_WORD})(?P<sep>\s*[=:]\s*|=)(?P<value>[^\s,&'\"}}\]]+)",
    re.IGNORECASE,
)
_NOT_PAIR_KEY = re.compile(r"(?:_env|tokens)$", re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    """True when a config or mapping key names a secret value (its value must be redacted).

    Example:
        >>> [is_secret_key(k) for k in ("api_key", "judge.hf_token", "api_key_env", "max_tokens")]
        [True, True, False, False]

    """
    return bool(SECRET_KEY.match(str(key)))


class Redactor:
    """Replaces secrets in strings and nested containers.

    Args:
        secrets: literal secret values to replace wherever they occur.

    Example:
        >>> r = Redactor(["s3cr3t-value"])
        >>> r.text("key is s3cr3t-value; url https://bob:pw@h/v1?token=abc&x=1")
        'key is <redacted>; url https://<redacted>@h/v1?token=<redacted>&x=1'
        >>> r.mapping({"judge": {"api_key": "x", "api_key_env": "K"}})
        {'judge': {'api_key': '<redacted>', 'api_key_env': 'K'}}

    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, so that a secret containing another one is replaced whole.
        self.secrets = sorted(
            {s for s in secrets if s and len(s) >= _MIN_SECRET_LEN}, key=len, reverse=True
        )

    @classmethod
    def from_env(
        cls, env_names: Iterable[str | None] = (), environ: Mapping[str, str] | None = None
    ) -> Redactor:
        """The secrets of the environment: secret-looking variables and those in ``env_names``."""
        environ = os.environ if environ is None else environ
        named = {n for n in env_names if n}
        values = [
            v
            for k, v in environ.items()
            if k in named or (SECRET_ENV.match(k) and not _NOT_SECRET_ENV.match(k))
        ]
        return cls(values)

    @classmethod
    def for_config(cls, config: Any) -> Redactor:  # noqa: ANN401 - a RunConfig
        """The redactor of a run: the environment plus the variables its services name."""
        services = (getattr(config, group, None) for group in ("judge", "simulator"))
        return cls.from_env(getattr(s, "api_key_env", None) for s in services)

    def text(self, value: str) -> str:
        """``value`` with every known secret, URL credential and secret pair replaced."""
        for secret in self.secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        value = _URL_AUTH.sub(rf"\g<scheme>{REDACTED}@", value)
        return _PAIR.sub(_redact_pair, value)

    def value(self, key: str, value: Any) -> Any:  # noqa: ANN401
        """A redacted copy of ``value`` stored under ``key`` (containers recursively)."""
        if is_secret_key(key) and value not in (None, ""):
            return REDACTED
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return self.mapping(value)
        if isinstance(value, list | tuple):
            return [self.value(key, v) for v in value]
        return value

    def mapping(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """A redacted copy of a nested mapping (keys are kept, values redacted)."""
        return {k: self.value(str(k), v) for k, v in data.items()}

    def file(self, path: Path) -> None:
        """Redact a text file in place (Hydra's ``.hydra/*.yaml``, log files)."""
        try:
            original = path.read_text()
        except (OSError, UnicodeDecodeError):
            return
        cleaned = self.text(original)
        if cleaned != original:
            path.write_text(cleaned)


def _redact_pair(match: re.Match[str]) -> str:
    if _NOT_PAIR_KEY.search(match.group("key")):
        return match.group(0)
    return f"{match.group('key')}{match.group('sep')}{REDACTED}"


class RedactingFilter(logging.Filter):
    """A logging filter that redacts every record's message before any handler writes it."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        """Replace the record's message by its redacted, fully formatted text."""
        message = record.getMessage()
        cleaned = self.redactor.text(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def install_log_redaction(redactor: Redactor) -> None:
    """Attach a :class:`RedactingFilter` to every handler of the root logger (idempotent).

    Handlers, not loggers, because a filter on a logger does not see records propagated from
    its children; Hydra's ``train.log`` and console handlers hang on the root logger.
    """
    for handler in logging.getLogger().handlers:
        handler.filters = [f for f in handler.filters if not isinstance(f, RedactingFilter)]
        handler.addFilter(RedactingFilter(redactor))


def redact_hydra_output(redactor: Redactor, *folders: str | Path | None) -> None:
    """Redact the files Hydra wrote into a job's output folder and its sweep folder.

    Hydra writes the composed config and the command-line overrides (``.hydra/*.yaml``,
    ``multirun.yaml``) before the task runs, so a secret given on the command line (a URL with
    credentials) would otherwise stay there.
    """
    for folder in filter(None, folders):
        base = Path(folder)
        for path in [*base.glob(".hydra/*.yaml"), *base.glob("*.yaml"), *base.glob("*.log")]:
            redactor.file(path)
