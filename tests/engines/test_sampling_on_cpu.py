"""One generation configuration decides sampling and scoring; the backbone's stop tokens end turns.

The checkpoint here carries the generation settings of a public Qwen2.5-Instruct config
(repetition penalty 1.05, top-k 20, top-p 0.8, temperature 0.7) plus an n-gram ban: none of them
may shape what the rollout samples, or the log-probs the update uses (the scorer's) are not the
ones the tokens were drawn with.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.backbones.hf import load_folder
from slca_exp.engines.local.policy import response_logprobs
from slca_exp.engines.local.rollout import RolloutSettings, pack
from slca_exp.engines.local.sampling import generating_with, generation_config
from tests.engines.tool_caller import roller_for, sampler_logprobs, with_generation_config

QWEN_LEFTOVERS = {
    "do_sample": True,
    "repetition_penalty": 1.05,
    "no_repeat_ngram_size": 3,
    "top_k": 20,
    "top_p": 0.8,
    "temperature": 0.7,
}
"""What a Qwen2.5-Instruct ``generation_config.json`` sets (plus an n-gram ban)."""
TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def penalised(tool_caller, tmp_path_factory):
    """The tool caller, loaded from a checkpoint whose generation config has those settings."""
    folder = with_generation_config(
        tool_caller.folder, tmp_path_factory.mktemp("penalised") / "ckpt", **QWEN_LEFTOVERS
    )
    backbone = load_folder(folder, name="penalised", dtype="float32")
    assert backbone.model.generation_config.repetition_penalty == 1.05  # it did load them
    return backbone


def scorer_logprobs(model, batch):
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch, TEMPERATURE)
    return logp


def test_sampler_and_scorer_log_probs_agree_on_a_real_multi_turn_batch(penalised, tool_caller):
    roller = roller_for(penalised)
    before = penalised.model.generation_config.to_dict()
    torch.manual_seed(0)
    rolls = roller.run(
        tool_caller.rows[:8], 2, RolloutSettings(2, 64, 256, TEMPERATURE, logprobs=True)
    )
    assert penalised.model.generation_config.to_dict() == before  # the checkpoint's is restored
    assert max(rolls.turns) >= 2  # later turns sample after injected tool responses
    batch = rolls.batch(roller.pad_id)
    sampled = sampler_logprobs(rolls, batch.response_mask.shape[1])
    learnable = batch.response_mask.bool()
    # the sampler reports a log-prob on exactly the generated tokens (NaN on injected ones)
    assert torch.equal(sampled.isfinite(), learnable)
    gap = (scorer_logprobs(penalised.model, batch) - sampled)[learnable].abs()
    assert gap.max().item() < 1e-4, gap.max().item()


def test_the_checkpoints_settings_would_have_shaped_sampling(penalised, tool_caller):
    """Passing ``generate`` only the sampling knobs leaves the checkpoint's penalty and ban on."""
    model, roller = penalised.model, roller_for(penalised)
    prompts = [roller.prompt_ids(row) for row in tool_caller.rows[:4]]
    width = max(map(len, prompts))
    ids = torch.tensor([[roller.pad_id] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(0)
    out = model.generate(
        input_ids=ids,
        attention_mask=attention,
        do_sample=True,
        temperature=TEMPERATURE,
        top_k=0,
        top_p=1.0,
        max_new_tokens=48,
        eos_token_id=list(roller.stop_ids),
        pad_token_id=roller.pad_id,
        output_scores=True,
        return_dict_in_generate=True,
    )
    new = out.sequences[:, width:]
    picked = [torch.log_softmax(s, -1).gather(1, new[:, k, None]) for k, s in enumerate(out.scores)]
    sampled = torch.cat(picked, dim=1)
    turns = []  # each row's turn: up to and including its first stop token
    for row in new.tolist():
        cut = next((k + 1 for k, t in enumerate(row) if t in roller.stop_ids), len(row))
        turns.append(row[:cut])
    batch = pack(prompts, turns, [[1] * len(t) for t in turns], roller.pad_id)
    learnable = batch.response_mask.bool()
    gap = (scorer_logprobs(model, batch) - sampled[:, : learnable.shape[1]])[learnable].abs()
    assert gap.max().item() > 1e-2  # the penalty and the n-gram ban reached the sampler


@given(
    temperature=st.floats(0.05, 4.0),
    greedy=st.booleans(),
    stops=st.lists(st.integers(0, 50_000), min_size=1, max_size=4, unique=True),
    scores=st.booleans(),
)
@settings(max_examples=40, deadline=None)
def test_the_generation_config_holds_the_recipe_and_nothing_else(
    temperature, greedy, stops, scores
):
    config = generation_config(
        temperature=temperature,
        greedy=greedy,
        max_new_tokens=32,
        stop_ids=stops,
        pad_id=7,
        scores=scores,
    )
    set_keys = {k for k, v in config.to_diff_dict().items() if k != "transformers_version"}
    expected = {"max_new_tokens", "eos_token_id", "pad_token_id", "do_sample"}
    if not greedy:
        expected |= {"temperature", "top_k", "top_p"}
        assert (config.temperature, config.top_k, config.top_p) == (temperature, 0, 1.0)
    if scores:
        expected |= {"output_scores", "return_dict_in_generate"}
    assert set_keys <= expected and config.do_sample is not greedy
    assert config.eos_token_id == stops and config.pad_token_id == 7


def test_generating_with_restores_the_models_config_after_an_error(penalised):
    own = penalised.model.generation_config
    fresh = generation_config(
        temperature=1.0, greedy=False, max_new_tokens=4, stop_ids=[2], pad_id=0
    )
    with pytest.raises(RuntimeError), generating_with(penalised.model, fresh):
        assert penalised.model.generation_config is fresh
        raise RuntimeError("generation failed")
    assert penalised.model.generation_config is own


def test_the_backbones_stop_tokens_end_every_turn(tool_caller, tmp_path):
    """A checkpoint that declares a second end-of-turn token: every turn stops on it."""
    plain = load_folder(tool_caller.folder, name="plain", dtype="float32")
    im_end = plain.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert plain.stop_token_ids == (im_end,)
    torch.manual_seed(0)
    before = roller_for(plain).run(tool_caller.rows[:4], 2, RolloutSettings(1, 48, 160))
    # the token generated most often inside a turn (never the last one of a turn)
    inner = [
        t
        for ids, m in zip(before.response_ids, before.response_mask, strict=True)
        for t, nxt in zip(ids, m[1:] + [0], strict=True)
        if nxt == 1
    ]
    stop = max(set(inner) - {im_end}, key=inner.count)
    folder = with_generation_config(
        tool_caller.folder, tmp_path / "ckpt", eos_token_id=[im_end, stop]
    )
    backbone = load_folder(folder, name="two-stops", dtype="float32")
    assert backbone.stop_token_ids == (im_end, stop)
    torch.manual_seed(0)
    rolls = roller_for(backbone).run(tool_caller.rows[:4], 2, RolloutSettings(1, 48, 160))
    ended_on_it = 0
    for ids, mask in zip(rolls.response_ids, rolls.response_mask, strict=True):
        for k, (token, learnable) in enumerate(zip(ids, mask, strict=True)):
            if learnable and token in backbone.stop_token_ids:
                # a stop token is the last token of its turn: the environment or nothing follows
                assert k == len(ids) - 1 or mask[k + 1] == 0
                ended_on_it += token == stop
    assert ended_on_it > 0
