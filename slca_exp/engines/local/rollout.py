"""Multi-turn tool-calling rollouts on a Hugging Face causal LM.

For every prompt, ``group_size`` samples. Each sample alternates: the policy generates one
assistant turn (learnable, mask 1, up to and including its end-of-turn token); the tool calls in
that turn are parsed with the reward's parser and answered by the simulator; the tool responses,
wrapped in the chat template's glue, are appended as environment tokens (mask 0); and so on until
a turn has no call (the summary), the turn cap, or the token budget. Generation is batched over
every sample still running, with the KV cache of ``generate`` inside each turn.

The response of a sample is everything after its prompt: that is what verl calls ``responses``,
and its mask is what the estimators split into a tool and a summary segment.

Sampling uses one generation configuration built from the recipe alone (``sampling.py``), so
the tokens are drawn from the distribution the update scores them under.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from slca_exp.backbones.hf import stop_token_ids_of
from slca_exp.core.rows import Row
from slca_exp.engines.local.sampling import generating_with, generation_config
from slca_exp.rewards.toolcalls import ends_on_tool_call, parse_tool_calls
from slca_exp.simulators.base import SimContext, SimRequest, ToolResponse


@dataclass
class Rollouts:
    """A batch of B finished samples.

    Attributes:
        prompt_ids: per sample, the prompt's token ids.
        response_ids: per sample, the response's token ids (generated and injected).
        response_mask: per sample, 1 on generated tokens, 0 on injected ones.
        texts: per sample, the decoded response (special tokens kept: the reward reads the glue).
        rows: per sample, its data row (shared by the samples of one prompt).
        group: per sample, the index of its prompt in the batch.
        turns: per sample, the assistant turns generated.
        truncated: per sample, whether the budget or the turn cap cut it short.
        tool_results: every simulator response of the batch.
        timings: seconds spent generating and simulating.
        logprobs: per sample and response token, the log-probability the sampler drew it with
            (NaN on injected tokens); only with ``RolloutSettings.logprobs``, else None.
        answers: per sample, the simulator responses its response holds, in call order.

    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    response_mask: list[list[int]]
    texts: list[str]
    rows: list[dict[str, Any]]
    group: list[int]
    turns: list[int]
    truncated: list[bool]
    tool_results: list[ToolResponse] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    logprobs: list[list[float]] | None = None
    answers: list[list[ToolResponse]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.texts)

    def ends_on_tool_call(self) -> list[bool]:
        """Per sample, whether its last assistant turn is a tool call that no response followed.

        Out of turns, out of tokens inside the call, or a call the parser could not read: such a
        rollout was cut off before its summary. The text is read the way the reward reads it
        (``slca_exp.rewards.toolcalls.ends_on_tool_call``), as the verl engine does.
        """
        return [ends_on_tool_call(text) for text in self.texts]

    def batch(self, pad_id: int, device: torch.device | str = "cpu") -> PackedBatch:
        """Prompts left-padded and responses right-padded, so every response starts at column P."""
        return pack(self.prompt_ids, self.response_ids, self.response_mask, pad_id, device)


@dataclass(frozen=True)
class PackedBatch:
    """Prompt + response of B samples in one (B, P + T) tensor.

    Attributes:
        input_ids: (B, P + T) token ids; prompts end at column P, responses start there.
        attention_mask: (B, P + T) 1 on real tokens.
        response_mask: (B, T) 1 on learnable (generated) response tokens.
        prompt_len: P.

    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    prompt_len: int

    @property
    def response_ids(self) -> torch.Tensor:
        """(B, T) response token ids."""
        return self.input_ids[:, self.prompt_len :]


def pack(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    masks: Sequence[Sequence[int]],
    pad_id: int,
    device: torch.device | str = "cpu",
) -> PackedBatch:
    """Left-pad the prompts and right-pad the responses (see :class:`PackedBatch`)."""
    p = max(len(x) for x in prompts)
    t = max(1, max(len(x) for x in responses))
    b = len(prompts)
    ids = torch.full((b, p + t), pad_id, dtype=torch.long)
    attn = torch.zeros((b, p + t), dtype=torch.long)
    rmask = torch.zeros((b, t), dtype=torch.long)
    for i, (prompt, response, mask) in enumerate(zip(prompts, responses, masks, strict=True)):
        ids[i, p - len(prompt) : p] = torch.tensor(prompt, dtype=torch.long)
        attn[i, p - len(prompt) : p] = 1
        if response:
            ids[i, p : p + len(response)] = torch.tensor(response, dtype=torch.long)
            attn[i, p : p + len(response)] = 1
            rmask[i, : len(mask)] = torch.tensor(mask, dtype=torch.long)
    return PackedBatch(ids.to(device), attn.to(device), rmask.to(device), p)


@dataclass
class RolloutSettings:
    """The knobs of one rollout batch (``engine.rollout`` plus sampling mode).

    Attributes:
        max_turns: assistant turns that may call tools before the last one.
        max_turn_tokens: tokens one assistant turn may generate.
        max_response_tokens: the response budget, generated and injected tokens together.
        temperature: sampling temperature (the scorer divides the logits by the same).
        greedy: argmax decoding instead of sampling (validation).
        logprobs: keep the sampler's log-probability of every generated token
            (``Rollouts.logprobs``); a check, it holds every step's (B, V) scores while a turn is
            generated.

    """

    max_turns: int
    max_turn_tokens: int
    max_response_tokens: int
    temperature: float = 1.0
    greedy: bool = False
    logprobs: bool = False


class Roller:
    """Runs rollouts for a policy, a tokenizer and a simulator.

    Args:
        model: a causal LM (``generate`` with a KV cache).
        tokenizer: its tokenizer; its chat template renders the prompts.
        simulator: answers the tool calls.
        render_prompt: ``(tokenizer, messages, tools) -> str``, the prompt with the generation
            prompt appended (``slca_exp.backbones.chat.render_prompt``).
        tool_turn_text: ``(responses) -> str``, the glue and tool responses between two
            assistant turns (``slca_exp.backbones.chat.tool_turn_text``).
        stop_token_ids: the tokens that end an assistant turn (``Backbone.stop_token_ids``);
            empty: ``<|im_end|>`` and the tokenizer's eos token.

    """

    def __init__(
        self,
        model: Any,  # noqa: ANN401 - a transformers PreTrainedModel
        tokenizer: Any,  # noqa: ANN401
        simulator: Any,  # noqa: ANN401
        render_prompt: Any,  # noqa: ANN401
        tool_turn_text: Any,  # noqa: ANN401
        stop_token_ids: Sequence[int] = (),
    ) -> None:
        self.model = model
        self.tok = tokenizer
        self.simulator = simulator
        self.render_prompt = render_prompt
        self.tool_turn_text = tool_turn_text
        self.stop_ids = tuple(stop_token_ids) or stop_token_ids_of(tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.stop_ids[0]

    def prompt_ids(self, row: dict[str, Any]) -> list[int]:
        """Token ids of a row's prompt (system + user, tools listed, generation prompt)."""
        view = Row(row)
        text = self.render_prompt(self.tok, view.prompt(), view.tools())
        return self.tok(text, add_special_tokens=False)["input_ids"]

    @torch.no_grad()
    def run(
        self, rows: Sequence[dict[str, Any]], group_size: int, settings: RolloutSettings
    ) -> Rollouts:
        """``group_size`` samples of each row (sample-major within a group: row 0's first)."""
        started = time.perf_counter()
        timings = {"generate": 0.0, "simulate": 0.0}
        samples = [(g, row) for g, row in enumerate(rows) for _ in range(group_size)]
        prompts = [self.prompt_ids(row) for _, row in samples]
        n = len(samples)
        context = [list(p) for p in prompts]
        response: list[list[int]] = [[] for _ in range(n)]
        mask: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        turns = [0] * n
        truncated = [False] * n
        results: list[ToolResponse] = []
        answered: list[list[ToolResponse]] = [[] for _ in range(n)]
        active = list(range(n))
        for turn in range(settings.max_turns + 1):
            if not active:
                break
            budgets = [settings.max_response_tokens - len(response[i]) for i in active]
            t0 = time.perf_counter()
            generated = self._generate(
                [context[i] for i in active], min(settings.max_turn_tokens, max(budgets)), settings
            )
            timings["generate"] += time.perf_counter() - t0
            calls_of: dict[int, list] = {}
            for i, budget, (tokens, logps) in zip(active, budgets, generated, strict=True):
                ended = bool(tokens) and tokens[-1] in self.stop_ids
                if len(tokens) > budget:
                    tokens, logps, ended = tokens[:budget], logps[:budget], False
                response[i] += tokens
                mask[i] += [1] * len(tokens)
                logprobs[i] += logps
                context[i] += tokens
                turns[i] += 1
                if not ended:
                    truncated[i] = True
                    continue
                calls = parse_tool_calls(self.tok.decode(tokens)).calls
                if calls:
                    if turn == settings.max_turns:
                        truncated[i] = True  # a call in the last allowed turn: never answered
                    else:
                        calls_of[i] = calls
            t0 = time.perf_counter()
            answers = self._simulate(calls_of, samples)
            timings["simulate"] += time.perf_counter() - t0
            active = []
            for i, responses in answers.items():
                results.extend(responses)
                glue = self.tok(
                    self.tool_turn_text([r.content for r in responses]), add_special_tokens=False
                )["input_ids"]
                if len(response[i]) + len(glue) + 1 > settings.max_response_tokens:
                    truncated[i] = True  # no room left for another turn
                    continue
                response[i] += glue
                answered[i] += responses
                mask[i] += [0] * len(glue)
                logprobs[i] += [float("nan")] * len(glue)
                context[i] += glue
                active.append(i)
        texts = [self.tok.decode(r) for r in response]
        timings["total"] = time.perf_counter() - started
        return Rollouts(
            prompts,
            response,
            mask,
            texts,
            [row for _, row in samples],
            [g for g, _ in samples],
            turns,
            truncated,
            results,
            timings,
            logprobs if settings.logprobs else None,
            answered,
        )

    def _generate(
        self, contexts: list[list[int]], max_new: int, settings: RolloutSettings
    ) -> list[tuple[list[int], list[float]]]:
        """One assistant turn per context: its tokens up to and including the first stop token.

        Each comes with the sampler's log-probs of those tokens (empty unless
        ``settings.logprobs``).
        """
        device = next(self.model.parameters()).device
        width = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for j, c in enumerate(contexts):
            ids[j, width - len(c) :] = torch.tensor(c, dtype=torch.long)
            attn[j, width - len(c) :] = 1
        config = generation_config(
            temperature=settings.temperature,
            greedy=settings.greedy,
            max_new_tokens=max_new,
            stop_ids=self.stop_ids,
            pad_id=self.pad_id,
            scores=settings.logprobs,
        )
        with generating_with(self.model, config):
            out = self.model.generate(
                input_ids=ids.to(device), attention_mask=attn.to(device), generation_config=config
            )
        sequences = out.sequences if settings.logprobs else out
        new = sequences[:, width:]
        logps = [[] for _ in contexts]
        if settings.logprobs:
            # scores[k]: the (B, V) logits step k sampled from, after every logits processor
            picked = [
                torch.log_softmax(step.float(), dim=-1).gather(1, new[:, k, None]).squeeze(1)
                for k, step in enumerate(out.scores)
            ]
            logps = torch.stack(picked, dim=1).tolist()
        result = []
        stops = set(self.stop_ids)
        for tokens, lp in zip(new.tolist(), logps, strict=True):
            cut = next((k + 1 for k, t in enumerate(tokens) if t in stops), len(tokens))
            result.append((tokens[:cut], lp[:cut]))
        return result

    def _simulate(
        self, calls_of: dict[int, list], samples: list[tuple[int, dict[str, Any]]]
    ) -> dict[int, list[ToolResponse]]:
        """Answer every call of this turn in one simulator batch; unknown tools are refused."""
        requests, where = [], []
        answers: dict[int, list[ToolResponse | None]] = {}
        for i, calls in calls_of.items():
            row = Row(samples[i][1])
            schemas = {s["function"]["name"]: s for s in row.tools()}
            context = SimContext(question=row.question(), recorded=row.recorded())
            answers[i] = [None] * len(calls)
            for k, call in enumerate(calls):
                if call.name not in schemas:
                    content = json.dumps({"error": f"unknown tool {call.name!r}"})
                    answers[i][k] = ToolResponse(content, "schema_error", "unknown tool")
                    continue
                requests.append(SimRequest(call, schemas[call.name], context))
                where.append((i, k))
        for (i, k), response in zip(
            where, self.simulator.respond_batch(requests) if requests else [], strict=True
        ):
            answers[i][k] = response
        return {i: [r for r in rs if r is not None] for i, rs in answers.items()}
