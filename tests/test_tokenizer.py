def test_known_ids(tokenizer):
    assert tokenizer.encode("The capital of France is") == [504, 3575, 282, 4649, 314]


def test_round_trip_and_specials(tokenizer):
    text = "Digits 12345 split, emoji \U0001F600 and  spaces.\n\nNew paragraph."
    assert tokenizer.decode(tokenizer.encode(text)) == text
    ids = tokenizer.encode("a<|im_end|>b")
    assert tokenizer.eos_token_id in ids
    assert tokenizer.eos_token_id in tokenizer.stop_token_ids


def test_chat_template(tokenizer):
    p = tokenizer.apply_chat_template("Hi")
    assert p.startswith("<|im_start|>system\n") and p.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def _spm(scores, add_space_prefix=False):
    """A hand-made SentencePiece vocabulary: control tokens, the 256 byte pieces, then pieces."""
    from mnn_h2o.tokenizer import Tokenizer

    pieces = ["\u2581", "a", "b", "c", "ab", "bc", "\u2581a"]
    tokens = ["<unk>", "<bos>", "<eos>", "<t>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [3, 3, 3, 4] + [6] * 256 + [1] * len(pieces)
    return Tokenizer({"model": "llama", "tokens": tokens, "token_type": types,
                      "scores": [0.0] * 260 + [scores.get(p, -100.0) for p in pieces],
                      "add_space_prefix": add_space_prefix, "bos_token_id": 1, "eos_token_id": 2})


def test_sentencepiece_merges_the_best_scoring_piece_first():
    """"abc": SentencePiece merges the pair whose piece scores highest, so "bc" before "ab" when
    it scores higher, and the other way round; "<t>" (user-defined) is matched whole; "é" (no
    piece) falls back to its UTF-8 bytes; spaces become ▁ (with one in front where the file says)."""
    bc_first, ab_first = _spm({"bc": -1.0, "ab": -2.0}), _spm({"ab": -1.0, "bc": -2.0})
    assert [bc_first.meta["tokens"][i] for i in bc_first.encode("abc")] == ["a", "bc"]
    assert [ab_first.meta["tokens"][i] for i in ab_first.encode("abc")] == ["ab", "c"]
    tok = ab_first
    assert [tok.meta["tokens"][i] for i in tok.encode("a<t>\u00e9 a")] == ["a", "<t>", "<0xC3>", "<0xA9>", "\u2581a"]
    assert tok.decode(tok.encode("a<t>\u00e9 a"), skip_special=False) == "a<t>\u00e9 a"
    prefixed = _spm({"ab": -1.0}, add_space_prefix=True)
    ids = prefixed.encode("a b")
    assert [prefixed.meta["tokens"][i] for i in ids] == ["\u2581a", "\u2581", "b"]
    assert prefixed.decode(ids) == "a b"
