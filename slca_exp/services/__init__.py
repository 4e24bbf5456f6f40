"""What judges and simulators share: the OpenAI-compatible client, the cache, prompt templates.

``loopback`` (a real OpenAI-compatible server on 127.0.0.1 for tests and benchmarks) is imported
on demand: ``from slca_exp.services.loopback import serve_in_thread``.
"""

from slca_exp.services.cache import ServiceCache, cache_key, canonical_json, default_cache_path
from slca_exp.services.client import (
    ChatClient,
    ChatRequest,
    Completion,
    MissingAPIKeyError,
    ServiceError,
    scrub,
)
from slca_exp.services.prompts import PromptTemplate, resolve_prompt

__all__ = [
    "ChatClient",
    "ChatRequest",
    "Completion",
    "MissingAPIKeyError",
    "PromptTemplate",
    "ServiceCache",
    "ServiceError",
    "cache_key",
    "canonical_json",
    "default_cache_path",
    "resolve_prompt",
    "scrub",
]
