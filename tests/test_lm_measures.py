"""Language-model measurements on tiny models: validation loss and loss by position against direct sums,
needle prompts hold what they say, scoring picks the right number, λ by level over non-empty buckets."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from loglin_edu.data.corpus import Document
from loglin_edu.data.needles import needle_prompt, needle_sentence, question
from loglin_edu.data.token_stream import build_stream, evaluation_starts
from loglin_edu.data.tokenizer import ByteTokenizer
from loglin_edu.fenwick import bucket
from loglin_edu.layers import ModelConfig, build_model
from loglin_edu.train.lm_measures import (level_weights, needle_scores, nonempty_levels, per_position_loss, score_prompt,
                                      smooth_by_log_position, validation_loss)

PROSE = ("In the beginning God created the heaven and the earth. And the earth was without form, and void. "
         "And darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters.\n")


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    docs = [Document("t", f"d{i}", PROSE * 12) for i in range(3)]
    return build_stream(docs, ByteTokenizer(), tmp_path_factory.mktemp("s") / "v")


def tiny(mixer="loglinear_gated_deltanet", max_len=64):
    return build_model(ModelConfig(mixer, vocab_size=256, d_model=16, n_layers=2, max_len=max_len, mlp=True,
                                   mixer_options=dict(backend="torch", form="naive")), seed=0)


def test_nonempty_levels_match_the_fenwick_buckets():
    table = nonempty_levels(37, 8)
    for t in range(37):
        for lvl in range(8):
            assert bool(table[t, lvl]) == (len(bucket(t, lvl)) > 0), (t, lvl)


def test_validation_loss_and_loss_by_position_are_the_direct_means(stream):
    model = tiny()
    starts = evaluation_starts(stream, 17, 5)
    windows = stream.windows(starts, 17)
    with torch.no_grad():
        logits = model(windows[:, :-1])
    direct = F.cross_entropy(logits.transpose(1, 2), windows[:, 1:], reduction="none")  # [5, 16]
    result = validation_loss(model, stream, 16, 5, batch_size=2)
    assert result["tokens"] == 80 and math.isclose(result["loss"], direct.mean().item(), rel_tol=1e-5)
    assert math.isclose(result["perplexity"], math.exp(result["loss"]))
    torch.testing.assert_close(per_position_loss(model, stream, 16, 5, batch_size=3), direct.mean(0).double(),
                               rtol=1e-5, atol=1e-6)


def test_log_position_bins_average_the_positions():
    losses = torch.arange(100, dtype=torch.float64)
    centers, means = smooth_by_log_position(losses)
    assert centers == means and centers[0] == 0 and centers[-1] < 100
    assert all(a < b for a, b in zip(centers, centers[1:]))


def test_needle_prompts_hold_their_needles_where_they_say(stream):
    tok = ByteTokenizer()
    for depth in (0.0, 0.5, 1.0):
        p = needle_prompt(tok, stream, length=300, depth=depth, num_keys=3, choices=6, seed=4)
        text = tok.decode(p.tokens)
        assert len(p.tokens) + max(map(len, p.candidates)) == 300
        assert len(p.candidates) == 6 and len({tuple(c) for c in p.candidates}) == 6
        asked = tok.decode(p.tokens[p.needle_position:]).split(".")[0] + "."
        city, number = asked.split(" for ")[1].split(" is ")
        assert tok.decode(p.answer) == " " + number[:-1] and text.endswith(question(city))
        assert text.count("The special magic number for") == 4  # 3 needles and the question
        assert p == needle_prompt(tok, stream, length=300, depth=depth, num_keys=3, choices=6, seed=4)
        before = tok.decode(p.tokens[:p.needle_position])
        after = tok.decode(p.tokens[p.needle_position + len(tok.encode(asked)):])
        assert after[:1].isspace()  # the needle splits no word
        assert depth == 1.0 or before == "" or before.endswith(".")  # nor a sentence (the end may cut one)
        haystack = 300 - len(tok.encode(question(city))) - 3 * len(tok.encode(asked)) - 8
        assert abs(p.needle_position - depth * haystack) <= 64 + 2 * len(tok.encode(asked))
    first = needle_prompt(tok, stream, length=200, depth=0.0, seed=1)
    number = tok.decode(first.answer).strip()
    city = tok.decode(first.tokens).split("number for ")[-1].split(" is")[0]
    assert first.needle_position == 0 and tok.decode(first.tokens).startswith(needle_sentence(city, int(number)))


def test_needle_prompts_refuse_what_does_not_fit(stream):
    with pytest.raises(ValueError, match="no document of the haystack stream holds"):
        needle_prompt(ByteTokenizer(), stream, length=100_000, depth=0.5)
    with pytest.raises(ValueError, match="depth"):
        needle_prompt(ByteTokenizer(), stream, length=300, depth=1.5)


class Oracle(nn.Module):
    """Puts all mass on the tokens of one chosen candidate right after the prompt (teacher-forced)."""

    def __init__(self, prompt_len, answer):
        super().__init__()
        self.prompt_len, self.answer = prompt_len, answer
        self.anchor = nn.Parameter(torch.zeros(()))

    def forward(self, tokens):
        logits = torch.zeros(*tokens.shape, 256)
        for k, tok in enumerate(self.answer):
            logits[:, self.prompt_len - 1 + k, tok] = 20.0
        return logits


def test_scoring_by_greedy_and_by_choice(stream):
    p = needle_prompt(ByteTokenizer(), stream, length=300, depth=0.3, num_keys=2, choices=5, seed=0)
    right = score_prompt(Oracle(len(p.tokens), p.candidates[0]), p)
    assert right["greedy"] and right["choice"] and len(right["log_probs"]) == 5
    wrong = score_prompt(Oracle(len(p.tokens), p.candidates[1]), p)  # the distractor needle's number
    assert not wrong["greedy"] and not wrong["choice"]
    grid = needle_scores(tiny(max_len=256), ByteTokenizer(), stream, lengths=[200, 256], depths=[0.0, 1.0], num_keys=2,
                         samples=1, choices=3)
    assert len(grid["greedy"]) == 2 and len(grid["choice"][0]) == 2 and grid["chance"] == 1 / 3
    assert all(0 <= x <= 1 for row in grid["choice"] for x in row)


def test_level_weights_average_over_nonempty_buckets():
    model = tiny("loglinear_gated_deltanet", max_len=32)  # 6 levels
    for block in model.blocks:
        nn.init.zeros_(block.mixer.l_proj.weight)  # dl = 0, so λ = softplus(0) = ln 2 wherever it is read
    weights = torch.tensor(level_weights(model, torch.randint(256, (2, 8))))  # T = 8 reaches levels 0..3
    assert weights.shape == (2, 2, 6)
    torch.testing.assert_close(weights[..., :4], torch.full((2, 2, 4), math.log(2)))
    assert weights[..., 4:].isnan().all()
    model = tiny("loglinear_mamba2", max_len=32)
    weights = torch.tensor(level_weights(model, torch.randint(256, (2, 16))))
    assert weights.shape[0] == 2 and weights[..., :5].isfinite().all() and (weights[..., :5] > 0).all()
    assert level_weights(tiny("mamba2"), torch.randint(256, (1, 8))) == []


def test_the_exercise_loss_by_position_is_the_package_measurement(stream):
    from loglin_edu.exercises.ch13_language_modelling import loss_by_position
    from loglin_edu.train.lm_measures import token_losses

    model = tiny()
    tokens = stream.windows(evaluation_starts(stream, 13, 3), 13)
    with torch.no_grad():
        torch.testing.assert_close(loss_by_position(model(tokens[:, :-1]), tokens), token_losses(model, tokens).mean(0))
