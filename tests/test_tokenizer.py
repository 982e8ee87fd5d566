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
