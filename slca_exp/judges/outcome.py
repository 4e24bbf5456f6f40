"""Outcome judges: did the rollout solve the user's task? R_tool of ``reward.tool_reward=outcome``.

The execution-outcome control of the paper's public code replaces HierR's gold matching by a
binary verdict on the outcome, to ask whether segment routing still helps when the tool reward
is an outcome instead of a match against gold calls. An outcome judge answers ``Solved`` (1.0),
``Unsolved`` or ``Unsure`` (0.0) for each rollout; when it cannot answer, the result is
``failed`` with score NaN, and R_tool is absent for that rollout (never a score).

Two backends, in :data:`OUTCOME_JUDGES` (``reward.outcome.backend``; plugins add their own):

- ``openai``: the summary judge's server (``judge.*``: model, endpoint or service, decoding,
  retries, cache) asked with two prompts of its own. The first shows the question and the final
  answer; on ``Unsure`` a fallback prompt also shows the tool calls and responses, and its answer
  is final. A reply is read as the public code reads it (:func:`parse_verdict`).
- ``facts``: a deterministic CPU decision for rows that record the answers of their gold calls
  (the synthetic world): ``Solved`` when every fact of those answers (the rubric judge's facts)
  is among the tool responses the rollout obtained and its final answer states it; on a row that
  needs no call, when the rollout made no call.

For both, a final answer shorter than ``reward.outcome.min_answer_chars`` is ``Unsolved`` without
asking (status ``short_circuit``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from slca_exp.judges.rubric import Fact, Statement, response_facts
from slca_exp.registry import Registry
from slca_exp.rewards.judging import OutcomeRequest, OutcomeResult
from slca_exp.rewards.toolcalls import TOOL_CALL, TOOL_RESPONSE, blocks, final_reply, strip_think
from slca_exp.rewards.toolcalls import tool_responses as responses_of
from slca_exp.services.backend import Closing, Counted
from slca_exp.services.cache import cache_key, canonical_json, open_cache
from slca_exp.services.cached import Answer, CachedChat, user_request
from slca_exp.services.client import ChatClient, ChatRequest
from slca_exp.services.prompts import PromptTemplate

PROMPT_GROUP = "reward.outcome"
"""The prompts' config group: where shipped templates live and how their keys are named."""
CHECK_PROMPT = "exec_outcome_check_v1.txt"
"""The shipped first prompt (``reward.outcome.prompt: null``)."""
FALLBACK_PROMPT = "exec_outcome_fallback_v1.txt"
"""The shipped fallback prompt (``reward.outcome.fallback_prompt: null``)."""
FACTS_VERSION = "facts-v1"
_FACTS_RULE = {
    "outcome": FACTS_VERSION,
    "solved": "every fact of the gold calls' recorded answers is among the tool responses the "
    "rollout obtained and is stated by its final answer; no call on a row that needs none",
    "facts": "the rubric judge's facts (rubric-v1 rules 1-3)",
}
"""The facts rule as recorded: its hash is the judge's ``prompt_sha256``."""


def parse_verdict(content: str) -> str:
    """The verdict in an outcome judge's reply, as the public code reads it.

    Case-insensitive, anywhere in the reply (think blocks removed): ``Solved`` when it says
    "solved" and never "unsolved" (which contains "solved"); ``Unsolved`` when it says
    "unsolved"; anything else, an empty reply included, is ``Unsure``.

    >>> parse_verdict("Solved."), parse_verdict("UNSOLVED: wrong city"), parse_verdict("")
    ('Solved', 'Unsolved', 'Unsure')
    >>> parse_verdict("Solved? No: it is unsolved"), parse_verdict("I am unsure")
    ('Unsolved', 'Unsure')

    """
    text = strip_think(content).lower()
    if "unsolved" in text:
        return "Unsolved"
    return "Solved" if "solved" in text else "Unsure"


def render_interactions(response_text: str) -> str:
    """The rollout's tool calls and responses in order, numbered, as the fallback prompt shows.

    >>> print(render_interactions("<tool_call>{}</tool_call><tool_response>4</tool_response>"))
    [Tool Call 1]
    {}
    <BLANKLINE>
    [Tool Response 1]
    4

    """
    text = strip_think(response_text)
    found = [(start, "Call", text[a:b]) for start, a, b, _ in blocks(text, *TOOL_CALL)]
    found += [(start, "Response", text[a:b]) for start, a, b, _ in blocks(text, *TOOL_RESPONSE)]
    counts = {"Call": 0, "Response": 0}
    parts = []
    for _, kind, content in sorted(found):
        counts[kind] += 1
        parts.append(f"[Tool {kind} {counts[kind]}]\n{content.strip()}")
    return "\n\n".join(parts) if parts else "(no tool calls)"


class OutcomeJudgeBase(Counted, Closing, ABC):
    """Shared plumbing: the short-answer rule, counters, the recipe fields, the context manager.

    A backend is a subclass registered in :data:`OUTCOME_JUDGES`; ``cls(outcome, judge)`` builds
    it from the ``reward.outcome`` config and the summary judge's config (``judge``).
    """

    name = ""
    STATUS_COUNTERS = {"short_circuit": "short_circuits", "failed": "failures"}
    remote: bool = False
    """Whether it asks the judge's server (then ``judge.backend`` must ask one too)."""

    def __init__(self, outcome: Any, judge: Any) -> None:  # noqa: ANN401 - the two configs
        super().__init__()
        self.cfg = outcome
        self.judge_cfg = judge

    def score(self, batch: Sequence[OutcomeRequest]) -> list[OutcomeResult]:
        """Decide a batch; failures come back as ``status="failed"``, never raised."""
        results: list[OutcomeResult | None] = [self._short(r) for r in batch]
        todo = [i for i, r in enumerate(results) if r is None]
        for i, result in zip(todo, self._decide([batch[i] for i in todo]), strict=True):
            results[i] = result
        return self._count([r for r in results if r is not None])

    @abstractmethod
    def _decide(self, batch: Sequence[OutcomeRequest]) -> list[OutcomeResult]:
        """The verdicts of the requests no rule decided, in order."""

    def _short(self, request: OutcomeRequest) -> OutcomeResult | None:
        least = int(self.cfg.min_answer_chars)
        if len(final_reply(request.response_text).strip()) < least:
            return OutcomeResult.short_circuit(f"final answer shorter than {least} characters")
        return None

    def describe(self) -> dict[str, Any]:
        """The recipe fields of this judge."""
        return type(self).describe_config(self.cfg, self.judge_cfg)

    @classmethod
    @abstractmethod
    def describe_config(cls, outcome: Any, judge: Any) -> dict[str, Any]:  # noqa: ANN401
        """The recipe fields the configs would build (cheap: no network, no cache)."""

    @classmethod
    def prompt_texts(cls, outcome: Any, judge: Any) -> dict[str, str]:  # noqa: ANN401
        """Role (``outcome``, ``outcome_fallback``) -> the text registered in the prompt registry.

        Each text hashes to the recorded ``prompt_sha256`` (``fallback_prompt_sha256``).
        """
        return {}


class FactsOutcomeJudge(OutcomeJudgeBase):
    """The deterministic CPU outcome judge (registry name ``facts``); see the module docstring."""

    name = "facts"

    def _decide(self, batch: Sequence[OutcomeRequest]) -> list[OutcomeResult]:
        return [facts_verdict(request) for request in batch]

    @classmethod
    def describe_config(cls, outcome: Any, judge: Any) -> dict[str, Any]:  # noqa: ANN401
        """Backend, rule version and the hash of the rule, the short-answer threshold."""
        return {
            "backend": "facts",
            "model": None,
            "prompt_version": FACTS_VERSION,
            "prompt_sha256": cache_key(_FACTS_RULE),
            "min_answer_chars": int(outcome.min_answer_chars),
            "stand_in": "deterministic facts rule, not the paper's LLM outcome judge",
        }

    @classmethod
    def prompt_texts(cls, outcome: Any, judge: Any) -> dict[str, str]:  # noqa: ANN401
        """The rule as canonical JSON (what ``prompt_sha256`` hashes)."""
        return {"outcome": canonical_json(_FACTS_RULE)}


def facts_verdict(request: OutcomeRequest) -> OutcomeResult:
    """The facts rule's verdict on one rollout (the short-answer rule not applied).

    Failed (absent) on a row that needs a call but records no answers of its gold calls: the
    rule has nothing to decide from.
    """
    text = request.response_text
    if not request.needs_call:
        made = TOOL_CALL[0] in strip_think(text)
        return OutcomeResult.decided("Unsolved" if made else "Solved")
    if not request.gold_answers:
        return OutcomeResult.failed(
            "the row records no answers of its gold calls (extra_info.tool_responses): the "
            "facts rule cannot decide it"
        )
    obtained = responses_of(text)
    if not obtained:
        return OutcomeResult.decided("Unsolved")
    facts: dict[Fact, None] = {}
    for answer in request.gold_answers:
        facts.update(dict.fromkeys(response_facts(answer)))
    got = Statement("\n".join(obtained))
    said = Statement(final_reply(text))
    solved = all(got.states(fact) and said.states(fact) for fact in facts)
    return OutcomeResult.decided("Solved" if solved else "Unsolved")


class OpenAIOutcomeJudge(OutcomeJudgeBase):
    """The LLM outcome judge over the summary judge's OpenAI-compatible server."""

    name = "openai"
    remote = True

    def __init__(self, outcome: Any, judge: Any) -> None:  # noqa: ANN401
        super().__init__(outcome, judge)
        self.check, self.fallback = _templates(outcome)
        self.chat = CachedChat(
            ChatClient.from_config(judge, "judge"),
            open_cache(judge.cache, judge.cache_path),
            kind="outcome",
            prompt_sha256=cache_key({"check": self.check.sha256, "fallback": self.fallback.sha256}),
        )

    def request_for(self, request: OutcomeRequest, *, fallback: bool = False) -> ChatRequest:
        """The chat request of the first prompt (or of the fallback prompt) for one rollout."""
        answer = final_reply(request.response_text).strip()
        if fallback:
            prompt = self.fallback.render(
                question=request.question,
                tool_interactions=render_interactions(request.response_text),
                answer=answer,
            )
        else:
            prompt = self.check.render(question=request.question, answer=answer)
        return user_request(prompt, self.judge_cfg)

    def _decide(self, batch: Sequence[OutcomeRequest]) -> list[OutcomeResult]:
        firsts = self.chat.complete([self.request_for(r) for r in batch], _any) if batch else []
        results: list[OutcomeResult | None] = []
        unsure: list[int] = []
        for i, answer in enumerate(firsts):
            verdict = None if answer.content is None else parse_verdict(answer.content)
            if verdict == "Unsure":
                unsure.append(i)
            results.append(_result(answer, verdict))
        asked = [self.request_for(batch[i], fallback=True) for i in unsure]
        seconds = self.chat.complete(asked, _any) if asked else []
        for i, answer in zip(unsure, seconds, strict=True):
            verdict = None if answer.content is None else parse_verdict(answer.content)
            results[i] = _result(answer, verdict, before=firsts[i])
        return [r for r in results if r is not None]

    @classmethod
    def describe_config(cls, outcome: Any, judge: Any) -> dict[str, Any]:  # noqa: ANN401
        """Backend, the judge's model, both prompts' versions and hashes, decoding, threshold."""
        check, fallback = _templates(outcome)
        return {
            "backend": "openai",
            "model": judge.model,
            "prompt": check.path.name,
            "prompt_version": outcome.prompt_version or check.path.stem,
            "prompt_sha256": check.sha256,
            "fallback_prompt": fallback.path.name,
            "fallback_prompt_sha256": fallback.sha256,
            "temperature": float(judge.temperature),
            "max_tokens": int(judge.max_tokens),
            "min_answer_chars": int(outcome.min_answer_chars),
        }

    @classmethod
    def prompt_texts(cls, outcome: Any, judge: Any) -> dict[str, str]:  # noqa: ANN401
        """The two template files' texts."""
        check, fallback = _templates(outcome)
        return {"outcome": check.text, "outcome_fallback": fallback.text}

    def close(self) -> None:
        """Close the HTTP client and the cache (idempotent)."""
        self.chat.close()


def _templates(outcome: Any) -> tuple[PromptTemplate, PromptTemplate]:  # noqa: ANN401
    check = PromptTemplate.load(outcome.prompt or CHECK_PROMPT, PROMPT_GROUP)
    fallback = PromptTemplate.load(outcome.fallback_prompt or FALLBACK_PROMPT, PROMPT_GROUP)
    return check, fallback


def _any(content: str) -> bool:
    """Every reply is usable (an unreadable one is Unsure), so every reply may be cached."""
    return True


def _result(answer: Answer, verdict: str | None, before: Answer | None = None) -> OutcomeResult:
    fallback = before is not None
    latency = answer.latency_ms + (before.latency_ms if before is not None else 0.0)
    if verdict is None:
        return OutcomeResult.failed(answer.error, fallback=fallback, latency_ms=latency)
    cached = answer.cached and (before is None or before.cached)
    return OutcomeResult.decided(verdict, fallback=fallback, cached=cached, latency_ms=latency)


OUTCOME_JUDGES: Registry[type[OutcomeJudgeBase]] = Registry("outcome judge")
"""Outcome judge backends, keyed by ``reward.outcome.backend``; ``cls(outcome, judge)`` builds
one. Plugins (``SLCA_EXP_PLUGINS``) register their own."""
OUTCOME_JUDGES.register("facts", FactsOutcomeJudge)
OUTCOME_JUDGES.register("openai", OpenAIOutcomeJudge)


def outcome_backend(outcome: Any, judge_remote: bool) -> str:  # noqa: ANN401
    """The backend ``reward.outcome.backend`` names; ``auto``: openai beside a served judge."""
    backend = str(outcome.backend)
    if backend != "auto":
        return backend
    return "openai" if judge_remote else "facts"
