"""The qa1 probe: generated episodes against their construction, spans, scoring, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attngeom import api
from attngeom.assets import asset
from attngeom.capture import load_model, load_tokenizer
from attngeom.core.support import support_statistics
from attngeom.errors import ConfigError, CorpusError
from attngeom.interventions.selection import (
    positional_keep,
    positional_restriction,
    restriction,
)
from attngeom.probes import qa
from attngeom.probes.qa_probe import full_pass

BACKGROUND_TEXT = " ".join(
    f"The old clock number {i} ticked on the wall of the quiet room. "
    f"A bird sang {i} songs outside the window today! Why did the rain stop so soon?"
    for i in range(40))


STORIES = asset("stories260K")


@pytest.fixture(scope="module")
def stories():
    model, tokenizer = load_model(asset("stories260K"))
    return model, tokenizer


@pytest.fixture(scope="module")
def smol_tokenizer():
    return load_tokenizer(asset("smollm2-135m"))


def test_episodes_match_their_construction() -> None:
    episodes = qa.generate_episodes(200, facts=(2, 6), seed=5)
    assert episodes == qa.generate_episodes(200, facts=(2, 6), seed=5)
    assert episodes != qa.generate_episodes(200, facts=(2, 6), seed=6)
    for ep in episodes:
        assert 2 <= len(ep.facts) <= 6
        # replay the moves: the answer is the asked person's last location
        where, last = {}, {}
        for i, fact in enumerate(ep.facts):
            name, rest = fact.split(" ", 1)
            location = rest.rsplit(" ", 1)[1].rstrip(".")
            assert location in qa.LOCATIONS and where.get(name) != location
            where[name], last[name] = location, i
        assert ep.answer == where[ep.person]
        assert ep.support == last[ep.person]
        assert ep.facts.count(ep.support_sentence) == 1
        assert ep.question == f"Where is {ep.person}?"
    # the asked person is not always the last to move
    assert any(ep.support != len(ep.facts) - 1 for ep in episodes)


@pytest.mark.parametrize("prompt_format", ["plain", "chat"])
def test_prompt_spans_cover_exactly_the_support_sentence(smol_tokenizer, prompt_format) -> None:
    tok = smol_tokenizer
    sentences = qa.split_sentences(BACKGROUND_TEXT)
    episodes = qa.generate_episodes(8, seed=1)
    short = qa.build_examples(episodes, tok, 40, sentences=sentences,
                              prompt_format=prompt_format, seed=2)
    long = qa.build_examples(episodes, tok, 120, sentences=sentences,
                             prompt_format=prompt_format, seed=2)
    for ex, ep, ex_long in zip(short, episodes, long, strict=True):
        assert ex.prompt.count(ep.support_sentence) == 1
        ids = list(ex.input_ids)
        span = [ids[i] for i in ex.support]
        assert tok.decode(span).strip() == ep.support_sentence
        assert list(ex.support) == list(range(ex.support[0], ex.support[-1] + 1))
        assert set(ex.support) < set(ex.context)
        context = ex.prompt[ex.prompt.index("Context:\n") + 9: ex.prompt.index("\n\nQuestion")]
        assert tok.decode([ids[i] for i in ex.context]).strip() == context
        # facts stay in order; every fact is in the context
        places = [context.index(f) for f in ep.facts]
        assert places == sorted(places)
        assert 0 < ex.background_tokens <= 40 < ex_long.background_tokens <= 120
        # nested backgrounds: the shorter run of sentences opens the longer one
        first = [s for s in sentences if s in context][:1]
        assert first and first[0] in ex_long.prompt
        if prompt_format == "plain":
            assert ids[0] == tok.bos_token_id
            assert ex.prompt.startswith(qa.INSTRUCTION + "\n\nContext:\n")
            assert ex.prompt.endswith(f"\n\nQuestion: {ep.question}\n\nAnswer:")
        else:
            assert ex.prompt.startswith("<|im_start|>")
            assert ex.prompt.endswith("<|im_start|>assistant\n")


def test_token_span_rule() -> None:
    """Offsets (0,4) (4,9) (9,9) (9,12): [4, 9) holds token 1 only; (9,9) is empty."""
    offsets = [(0, 4), (4, 9), (9, 9), (9, 12)]
    assert qa.token_span(offsets, 4, 9) == [1]
    assert qa.token_span(offsets, 3, 10) == [0, 1, 3]
    assert qa.token_span(offsets, 4, 9, shift=1) == [2]


def test_answer_loss_and_prediction() -> None:
    scores = torch.tensor([1.0, 3.0, 3.0, 0.0])
    loss, predicted = qa.answer_loss(scores, 2)
    expected = math.log(sum(math.exp(v) for v in (1.0, 3.0, 3.0, 0.0))) - 3.0
    assert loss == pytest.approx(expected, abs=1e-12)
    assert predicted == 1  # tie goes to the first in sorted order
    assert qa.screen(1 / 6 + 0.06, math.log(6) - 0.06)
    assert not qa.screen(1 / 6 + 0.04, 0.5)
    assert not qa.screen(0.9, math.log(6) - 0.04)


def test_colliding_first_tokens_fall_back_to_the_whole_candidate(stories) -> None:
    model, tok = stories
    cands = qa.candidate_tokens(tok)
    assert cands.collide and cands.rule == "mean continuation log-probability"
    ex = qa.build_examples(qa.generate_episodes(1, seed=0), tok, 0)[0]
    scores = qa.candidate_scores(model, ex, cands, torch.device("cpu"))
    for c, tokens in enumerate(cands.tokens):  # one candidate alone, no padding
        ids = torch.tensor([list(ex.input_ids) + list(tokens)])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].double(), -1)
        n = ex.length
        want = np.mean([float(logp[n - 1 + j, t]) for j, t in enumerate(tokens)])
        assert float(scores[c].detach()) == pytest.approx(want, abs=1e-5)


def test_first_token_rule_reads_the_final_logit(stories) -> None:
    model, tok = stories
    cands = qa.candidate_tokens(tok, ["garden", "kitchen", "office"])
    assert not cands.collide
    ex = qa.build_examples(qa.generate_episodes(1, seed=0), tok, 0)[0]
    scores = qa.candidate_scores(model, ex, cands, torch.device("cpu"))
    with torch.no_grad():
        logits = model(torch.tensor([ex.input_ids])).logits[0, -1]
    assert scores.tolist() == pytest.approx(logits[list(cands.first)].double().tolist())


def test_support_statistics_from_capture_equal_eager_attention(stories) -> None:
    model, tok = stories
    sentences = qa.split_sentences(BACKGROUND_TEXT)
    examples = qa.build_examples(qa.generate_episodes(3, seed=4), tok, 60,
                                 sentences=sentences, seed=1)
    result = full_pass(model, examples, qa.candidate_tokens(tok))
    for i, ex in enumerate(examples):
        with torch.no_grad():
            out = model(torch.tensor([ex.input_ids]), output_attentions=True,
                        attn_implementation="eager")
        for layer, att in enumerate(out.attentions):
            alpha = att[0, :, -1].double()
            s = support_statistics(alpha, list(ex.support), list(ex.context))
            got = result.support["attention/displacement"][i, layer]
            np.testing.assert_allclose(got, s.displacement.numpy(), atol=1e-9)
            np.testing.assert_allclose(result.support["attention/mass"][i, layer],
                                       s.mass.numpy(), atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=12), st.integers(1, 14))
def test_positional_keep_against_loop(visible, n) -> None:
    vis = torch.tensor(visible)
    keep = positional_keep(vis, n).tolist()
    positions = [j for j, v in enumerate(visible) if v]
    if len(positions) <= n:
        want = set(positions)
    else:
        want = set(positions[-(n - 1):] if n > 1 else []) | ({0} & set(positions))
    assert {j for j, k in enumerate(keep) if k} == want


def test_positional_control_cuts_every_path_but_initial_and_self(stories) -> None:
    """N = 2 keeps the initial token and the query itself. Renormalised, a token between
    them cannot reach the last position; deleted, it still does through the softmax
    denominator (the kept probabilities are those of the whole row)."""
    model, _ = stories
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 500, (1, 20), generator=gen)
    other = ids.clone()
    other[0, 1:-1] = torch.randint(3, 500, (18,), generator=gen)
    with torch.no_grad():
        plain_a, plain_b = model(ids).logits[0, -1], model(other).logits[0, -1]
        assert not torch.allclose(plain_a, plain_b, atol=1e-4)
        with positional_restriction(model, 2, renormalize=True):
            a, b = model(ids).logits[0, -1], model(other).logits[0, -1]
        torch.testing.assert_close(a, b)
        with positional_restriction(model, 2, renormalize=False):
            c, d = model(ids).logits[0, -1], model(other).logits[0, -1]
        assert not torch.allclose(c, d, atol=1e-4) and not torch.allclose(a, c, atol=1e-4)
        with restriction(model, 20, ranking="positional"):
            same = model(ids).logits
        assert torch.equal(same, model(ids).logits)


def test_probe_tables(stories, tmp_path) -> None:
    model, tok = stories
    corpus = tmp_path / "background.txt"
    corpus.write_text(BACKGROUND_TEXT)
    res = api.competition(str(STORIES), str(corpus), None, model_and_tokenizer=(model, tok),
                          backgrounds=(0, 40), n_episodes=2, grid_max=2, bootstrap=50,
                          positional=True, progress=False, model_label="stories260K")
    frames = res.tables
    answers = frames["qa_answers"]
    assert answers["background"].tolist() == [0, 40]
    assert (answers["scoring"] == "mean continuation log-probability").all()
    assert set(frames["qa_nstar"]["ranking"]) == {"attention", "positional"}
    assert set(frames["qa_support"]["split"]) == {"all", "correct", "incorrect"}
    ex = frames["qa_examples"]
    for b in (0, 40):
        rows = ex[ex.background == b]
        assert answers.set_index("background").loc[b, "accuracy"] == rows["correct"].mean()
        assert answers.set_index("background").loc[b, "loss"] == pytest.approx(
            rows["loss"].mean())
    curve = frames["qa_curve"]
    assert {1, 2} <= set(curve["n"])
    nstar = frames["qa_nstar"]
    for _, row in nstar.iterrows():  # the smallest tried N within tau, else the prompt length
        sub = curve[(curve.background == row.background) & (curve.ranking == row.ranking)]
        passing = sub[sub.delta_loss <= row.tau]["n"]
        want = int(passing.min()) if len(passing) else int(row.prompt_tokens_max)
        assert int(row.nstar) == want
    assert res.manifest["corpus"]["probe"]["episodes"] == {"0": 2, "40": 2}


def test_bad_input_one_line_each(stories, smol_tokenizer, tmp_path) -> None:
    model, tok = stories
    episodes = qa.generate_episodes(2, seed=0)
    sentences = qa.split_sentences(BACKGROUND_TEXT)
    with pytest.raises(ConfigError, match="longer than the model's 512 positions"):
        qa.build_examples(episodes, tok, 2000, sentences=sentences * 20, max_positions=512)
    with pytest.raises(CorpusError, match="too short"):
        qa.build_examples(episodes, tok, 5000, sentences=sentences[:5])
    with pytest.raises(ConfigError, match="needs a chat template"):
        qa.build_examples(episodes, tok, 0, prompt_format="chat")
    with pytest.raises(ConfigError, match="empty episode set"):
        qa.build_examples([], tok, 0)
    with pytest.raises(ConfigError, match="at least one episode"):
        qa.generate_episodes(0)
    with pytest.raises(ConfigError, match="n_episodes: expected an integer >= 1, got 0"):
        api.competition(str(STORIES), None, None, model_and_tokenizer=(model, tok),
                        n_episodes=0, progress=False)
    with pytest.raises(ConfigError, match="ranking"), \
            restriction(model, 2, ranking="alphabetical"):
        pass
    # a real-data file without the support sentence: left out and counted
    rows = [{"input": "Mary went to the garden. John moved to the office.",
             "question": "Where is Mary?", "target": "garden"},
            {"input": "Mary went to the garden.", "question": "Where is John?",
             "target": "office"}]
    path = tmp_path / "qa1.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    examples, dropped = qa.load_babilong(smol_tokenizer, source=path)
    assert dropped == 1 and len(examples) == 1
    assert smol_tokenizer.decode([examples[0].input_ids[i] for i in examples[0].support]
                                 ).strip() == "Mary went to the garden."
    with pytest.raises(CorpusError, match="does not exist"):
        qa.load_babilong(smol_tokenizer, source=tmp_path / "none.jsonl")


def test_chat_candidates_open_the_assistant_turn(smol_tokenizer) -> None:
    assert qa.candidate_prefix("chat", "") == "" and qa.candidate_prefix("plain", "") == " "
    cands = qa.candidate_tokens(smol_tokenizer, prefix="")
    assert not cands.collide and cands.prefix == ""
    assert [smol_tokenizer.decode(list(t)) for t in cands.tokens] == list(qa.LOCATIONS)


def test_competition_entry_point(stories, tmp_path) -> None:
    model, tok = stories
    res = api.competition(str(STORIES), None, None, model_and_tokenizer=(model, tok),
                          backgrounds=(0,), n_episodes=2, nstar=False, bootstrap=20,
                          progress=False)
    frames = res.tables
    settings = dict(zip(frames["competition_settings"]["setting"],
                        frames["competition_settings"]["value"], strict=True))
    assert settings["prompt_format"] == "plain"  # no chat template: auto picks plain
    assert settings["candidate_scoring"] == "mean continuation log-probability"
    assert "taus_nats" not in settings and settings["nstar"] == "False"  # nothing searched
    assert frames["qa_answers"]["n_examples"].tolist() == [2]
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(" ".join(f"Doc {k} says the cat sat {i} times."
                                           for i in range(12)) for k in range(3)))
    res = api.competition(str(STORIES), str(corpus), None, model_and_tokenizer=(model, tok),
                          probe="context", lengths=(16, 32), n_documents=2, tail=8,
                          taus=(0.1,), bootstrap=20, progress=False)
    assert sorted(res["context_nstar"]["length"].unique()) == [16, 32]
    assert len(res["context_slope"]) == 2  # tail and all, one tau
    with pytest.raises(ConfigError, match="probe: unknown probe 'maze'"):
        api.competition(str(STORIES), None, None, probe="maze")


@pytest.mark.parametrize("prompt_format", ["plain", "chat"])
def test_an_answer_prefix_opens_the_answer_and_moves_nothing_else(smol_tokenizer,
                                                                  prompt_format) -> None:
    """"{person} is in the" ends the prompt with the asked person's name (plain: after
    "Answer: "; chat: at the start of the assistant turn); the support and context
    positions are those of the prompt without it, and candidates then take a space."""
    tok = smol_tokenizer
    sentences = qa.split_sentences(BACKGROUND_TEXT)
    episodes = qa.generate_episodes(6, seed=4)
    plain = qa.build_examples(episodes, tok, 40, sentences=sentences,
                              prompt_format=prompt_format, seed=2)
    opened = qa.build_examples(episodes, tok, 40, sentences=sentences,
                               prompt_format=prompt_format, seed=2,
                               answer_prefix="{person} is in the")
    for ex, ep, base in zip(opened, episodes, plain, strict=True):
        tail = f" {ep.person} is in the" if prompt_format == "plain" else \
            f"<|im_start|>assistant\n{ep.person} is in the"
        assert ex.prompt == base.prompt + (tail if prompt_format == "plain"
                                           else f"{ep.person} is in the")
        assert ex.prompt.endswith(tail) and ex.answer_prefix == "{person} is in the"
        assert ex.support == base.support and ex.context == base.context
        assert list(ex.input_ids[: len(base.input_ids) - 1]) == list(base.input_ids[:-1])
    assert qa.candidate_prefix(prompt_format, "{person} is in the") == " "
    assert qa.candidate_prefix("chat", "") == "" and qa.candidate_prefix("plain", "") == " "
    with pytest.raises(ConfigError, match="only {person}"):
        qa.render_prompt("x", "Where is Mary?", prompt_format, tok, "{place} is")
