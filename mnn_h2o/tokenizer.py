"""The tokenizer rebuilt from a GGUF file's metadata, plus the chat template.

Two kinds, as ``tokenizer.ggml.model`` says:

- ``gpt2``, byte-level BPE (Llama 3, SmolLM, Qwen2): GGUF stores the vocabulary, the merges and
  the special tokens; the pre-tokenizer is chosen from ``tokenizer.ggml.pre`` the way llama.cpp
  does.
- ``llama``, SentencePiece (Gemma, Llama 2): GGUF stores each piece's score instead of merges.
  SentencePiece's BPE merges, of all adjacent pairs whose concatenation is a piece, the one whose
  piece scores highest; that is BPE with merges ranked by the merged piece's score, so the merges
  are derived from the scores (every split of a piece into two pieces). Spaces become ``▁``
  (U+2581), with one in front of the text where ``add_space_prefix`` says so; a character no piece
  covers falls back to its UTF-8 bytes (the ``<0xXX>`` pieces).

In both, ``tokenizers`` does the merging, and control and user-defined tokens (token_type 3, 4:
Gemma's ``<start_of_turn>``, its runs of newlines and spaces, ...) are matched whole first.
"""
from __future__ import annotations

import json
from typing import Iterable, List

from .errors import ModelFileError

# GPT-2 / Llama-3 style split regexes, as llama.cpp uses them per `tokenizer.ggml.pre`.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def load_tokenizer(gguf_model) -> "Tokenizer":
    """Tokenizer of a :class:`~mnn_h2o.gguf_model.GgufModel`."""
    return Tokenizer(gguf_model.tokenizer_metadata())


def _pre_tokenizer(pre: str):
    from tokenizers import Regex, pre_tokenizers as pt

    bytelevel = pt.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre == "smollm":
        # SmolLM: every digit is its own token, then the GPT-2 split.
        return pt.Sequence([pt.Digits(individual_digits=True),
                            pt.Split(Regex(_GPT2_SPLIT), behavior="isolated"), bytelevel])
    if pre == "qwen2":
        return pt.Sequence([pt.Split(Regex(_QWEN2_SPLIT), behavior="isolated"), bytelevel])
    return pt.Sequence([pt.Split(Regex(_GPT2_SPLIT), behavior="isolated"), bytelevel])


_NORMAL, _CONTROL, _USER_DEFINED, _BYTE = 1, 3, 4, 6  # tokenizer.ggml.token_type values


def spm_merges(tokens, token_type, scores) -> List[tuple]:
    """SentencePiece's merges as BPE ranks: each normal piece split in two normal pieces, every
    split of it, ranked by the piece's score (highest first; ties by the pieces' ids, as
    transformers' SentencePieceExtractor orders them)."""
    normal = {t: i for i, (t, ty) in enumerate(zip(tokens, token_type)) if ty == _NORMAL}
    ranked = []
    for piece, i in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                ranked.append((-scores[i], normal[left], normal[right], left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


class Tokenizer:
    def __init__(self, meta: dict):
        from tokenizers import AddedToken, Tokenizer as HfTokenizer, decoders, models

        tokens = meta["tokens"]
        vocab = {t: i for i, t in enumerate(tokens)}
        self.kind = meta.get("model", "gpt2")  # exports made before SentencePiece support say nothing
        spm = self.kind == "llama"
        merges = (spm_merges(tokens, meta["token_type"], meta["scores"]) if spm
                  else [tuple(m.split(" ", 1)) for m in meta["merges"]])
        try:
            bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=spm)
        except Exception as e:  # e.g. a merge of tokens that are not in the vocabulary
            raise ModelFileError(f"the model's tokenizer is inconsistent: {e}") from None
        tok = HfTokenizer(bpe)
        if spm:
            from tokenizers import pre_tokenizers

            prefix = meta.get("add_space_prefix", True)
            # "first": llama.cpp puts the prefix before the text's first piece only, not after
            # each special token
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", split=False,
                                                         prepend_scheme="first" if prefix else "never")
            tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                             decoders.Fuse()] + ([decoders.Strip(" ", 1, 0)] if prefix else []))
        else:
            tok.pre_tokenizer = _pre_tokenizer(meta.get("pre", "default"))
            tok.decoder = decoders.ByteLevel()
        # token_type 3 = control, 4 = user-defined: matched whole, never split by BPE.
        special = [AddedToken(t, special=True, normalized=False)
                   for t, ty in zip(tokens, meta["token_type"]) if ty in (_CONTROL, _USER_DEFINED)]
        tok.add_special_tokens(special)
        self._tok = tok
        self.meta = meta
        self.vocab_size = len(tokens)
        self.bos_token_id = meta.get("bos_token_id", -1)
        self.eos_token_id = meta.get("eos_token_id", -1)
        self.chat_template = meta.get("chat_template")
        # A sequence starts with BOS where the file says so and the chat template does not write
        # it itself (Gemma 3 270M has no template).
        self.add_bos = bool(meta.get("add_bos_token")) and self.bos_token_id >= 0 and not (
            self.chat_template and "bos_token" in self.chat_template)
        self._compiled = None
        if self.chat_template:
            self._template()  # a broken template is a broken model file: say so at load time
        # the end of an assistant's turn in each family's chat format (ChatML, Llama 3, Gemma)
        self.stop_token_ids = {i for i in (self.eos_token_id, vocab.get("<|im_end|>"), vocab.get("<|endoftext|>"),
                                           vocab.get("<|eot_id|>"), vocab.get("<end_of_turn>"))
                               if i is not None and i >= 0}

    def encode(self, text: str) -> List[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def sequence_start(self) -> List[int]:
        """The ids a new sequence starts with before its text: [BOS] where the model wants one
        (add_bos), else none."""
        return [self.bos_token_id] if self.add_bos else []

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    def apply_chat_template(self, user_text: str, system: str | None = None) -> str:
        """The prompt an instruct model expects for one user turn, ready for the assistant."""
        if not self.chat_template:
            return user_text
        messages = ([{"role": "system", "content": system}] if system else []) + \
            [{"role": "user", "content": user_text}]
        return self.render_chat(messages)

    def render_chat(self, messages: List[dict], add_generation_prompt: bool = True) -> str:
        """A conversation ({"role", "content"} dicts) through the model's chat template, ready for
        the assistant's next turn with ``add_generation_prompt``. The model must have a template."""
        if not self.chat_template:
            raise ModelFileError("the model has no chat template (tokenizer.chat_template in its GGUF)")
        try:
            return self._template().render(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=self.meta["tokens"][self.bos_token_id] if self.bos_token_id >= 0 else "",
                eos_token=self.meta["tokens"][self.eos_token_id] if self.eos_token_id >= 0 else "")
        except Exception as e:  # the template is code from the model file: any failure is the file's
            raise ModelFileError(f"the model's chat template failed: {type(e).__name__}: {e}") from None

    def _template(self):
        """The chat template compiled once, sandboxed (it comes from the model file)."""
        if self._compiled is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            try:
                self._compiled = env.from_string(self.chat_template)
            except Exception as e:
                raise ModelFileError(f"the model's chat template does not compile: {e}") from None
        return self._compiled

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.meta, f)

    @staticmethod
    def load(path: str) -> "Tokenizer":
        with open(path, encoding="utf-8") as f:
            return Tokenizer(json.load(f))
