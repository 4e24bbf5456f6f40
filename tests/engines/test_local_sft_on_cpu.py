"""The local SFT stage skips (and counts) batches that ``engine.sft.max_len`` left without a label.

The trajectories are the synthetic SFT split, tokenised by the tiny built-in backbone: their
prompts (system, tool schemas, user) are long, so a ``max_len`` below some prompts' length cuts
those trajectories before their first assistant token.
"""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from slca_exp.config.schema import SFTConfig
from slca_exp.engines.local import data_io
from slca_exp.engines.local.sft import IGNORE, collate, train_sft
from tests.engines.tiny_world import build_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory)


def _first_assistant_token(world):
    full = data_io.sft_examples(world.backbone.tokenizer, world.sft, 100_000)
    return [mask.index(1) for _, mask in full]


@pytest.fixture(scope="module")
def cut(world):
    """(max_len, examples cut at it): some keep assistant tokens, the others keep none."""
    firsts = sorted(_first_assistant_token(world))
    max_len = firsts[len(firsts) // 2]
    examples = data_io.sft_examples(world.backbone.tokenizer, world.sft, max_len)
    labelled = [any(mask[1:]) for _, mask in examples]
    assert 0 < sum(labelled) < len(labelled)
    return max_len, examples, labelled


def test_a_batch_cut_before_every_assistant_token_has_a_nan_loss(world, cut):
    """What used to be stepped on: cross-entropy over no label is 0 / 0."""
    max_len, examples, labelled = cut
    batch = [ex for ex, keep in zip(examples, labelled, strict=True) if not keep][:2]
    ids, attn, labels = collate(batch, world.backbone.tokenizer.pad_token_id, max_len)
    assert bool((labels[:, 1:] == IGNORE).all())
    with torch.no_grad():
        logits = world.backbone.model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
    assert math.isnan(loss.item())


def test_label_less_batches_are_skipped_counted_and_never_stepped_on(world, cut, capsys):
    max_len, examples, labelled = cut
    model = copy.deepcopy(world.backbone.model)
    before = [p.detach().clone() for p in model.parameters()]
    forwarded = []
    model.register_forward_pre_hook(
        lambda _, args, kwargs: forwarded.append(kwargs["input_ids"][0].tolist()),
        with_kwargs=True,
    )
    skips = []
    steps = labelled.count(True) + 1  # one example per batch: into a second pass over them
    losses = train_sft(
        model,
        examples,
        SFTConfig(steps=steps, batch_size=1, lr=1e-3, max_len=max_len),
        seed=0,
        pad_id=world.backbone.tokenizer.pad_token_id,
        on_skip=lambda step, skipped: skips.append((step, skipped)),
    )
    unlabelled = labelled.count(False)
    # every optimizer step taken, each on a labelled batch, with a finite loss
    assert len(losses) == steps and all(math.isfinite(x) for x in losses)
    by_ids = {tuple(ids): keep for (ids, _), keep in zip(examples, labelled, strict=True)}
    assert len(forwarded) == steps and all(by_ids[tuple(ids)] for ids in forwarded)
    # the first pass drew (and skipped) every cut example
    assert len(skips) >= unlabelled
    assert [n for _, n in skips] == list(range(1, len(skips) + 1))
    assert all(0 <= step < steps for step, _ in skips)
    assert f"SFT skipped {len(skips)} batches" in capsys.readouterr().err
    params = list(model.parameters())
    assert all(bool(torch.isfinite(p).all()) for p in params)
    assert any(not torch.equal(p.detach(), q) for p, q in zip(params, before, strict=True))


def test_a_split_with_no_assistant_token_within_max_len_is_refused(world):
    max_len = min(_first_assistant_token(world))
    examples = data_io.sft_examples(world.backbone.tokenizer, world.sft, max_len)
    with pytest.raises(ValueError, match=rf"engine\.sft\.max_len={max_len}"):
        train_sft(
            copy.deepcopy(world.backbone.model),
            examples,
            SFTConfig(steps=1, batch_size=2, max_len=max_len),
            seed=0,
            pad_id=world.backbone.tokenizer.pad_token_id,
        )
