"""NVIDIA kvpress as a measured peer: the same GGUF in transformers, each press at a whole-model ratio.

An optional extra (``pip install '.[compare]'`` after the CPU torch wheel), never a runtime
dependency: nothing else in the package imports this module's heavy parts.

How a press is run. kvpress compresses the cache of each layer in a forward hook *after* that
layer's attention has run on the whole prompt, so the prefill's hidden states - and therefore the
keys, values and attention every press sees - do not depend on the press. We use that: one
prefill per prompt (two when ObservedAttention, which needs eager attention, is in the grid)
calls ``press.compress`` for every (press, ratio) of the grid on each layer's inputs, exactly as
kvpress's own hook does, and keeps each compressed cache. Each continuation then runs on a copy
of its cache, with positions continuing from the uncompressed prompt length as kvpress's
pipeline does. ``tests/test_kvpress_peer.py`` checks this against kvpress's own
``with press(model): ...`` path.

KVzip (``KVzipPress``) is not a per-layer hook: after the prefill it asks the model to repeat
the prompt, scores every entry by the attention it receives while the model does so, and prunes
with one budget over all layers and heads (masking, as AdaKV does). We run kvpress's own
``with press(model): prefill`` around the shared prefill and keep its scores; each ratio is then
kvpress's own ``compress_post`` on those scores, so one reconstruction serves the whole grid.
Its ``compression_ratio`` is the fraction of *all* prompt entries (every layer and head)
removed, so the same :func:`compression_ratio` gives the same end state as for the other
presses: 1/r of every entry written is held in total, however the layers share it.

``@q8``: the cache holds llama.cpp q8_0 blocks (``q8_0``). The press runs on the float prefill
as always, then every kept entry is quantised, and so is every entry written afterwards (the
continuation, the generated tokens): the attention reads what a q8_0 cache would hold. ``none@q8``
is the full cache quantised, the engine's q8 floor.

Memory is reported the way ours is: the bytes of every (K, V) entry the cache holds at the end
of the continuation, every layer, at f16 size (2 bytes a value) or q8_0 size (34 bytes per 32
values). AdaKV and KVzip keep pruned entries in memory and mask them (kvpress's
``attention_patch``); we count them as freed, which is what a real implementation would hold.
A whole-model target ``r`` sets kvpress's ``compression_ratio`` (fraction of prompt entries
removed) so that the held entries after the continuation are 1/r' of all entries written, the
same end state our engine's target means (kvpress never evicts during decoding), with r' = r for
f16 and r' = ``quality.eviction_target(r, q8_0.gain())`` for q8: the element type pays its part
of r, eviction the rest, as our engine splits ``eviction.target_lossy_ratio``.
"""
from __future__ import annotations

import logging
import os
from contextlib import ExitStack, contextmanager
from typing import Dict, List, Optional, Sequence, Tuple

from .. import q8_0

# Our name -> (kvpress class path, needs eager attention). AdaKV wraps ExpectedAttention, the
# leading combination on kvpress's public leaderboard. KVzip is run by its own context manager
# (see the module doc), not by the prefill hook.
PRESSES: Dict[str, Tuple[str, bool]] = {
    "streaming": ("StreamingLLMPress", False),
    "snapkv": ("SnapKVPress", False),
    "observed": ("ObservedAttentionPress", True),
    "tova": ("TOVAPress", False),
    "keydiff": ("KeyDiffPress", False),
    "expected": ("ExpectedAttentionPress", False),
    "adakv_expected": ("AdaKVPress(ExpectedAttentionPress)", False),
    "kvzip": ("KVzipPress", False),
}
KVZIP = "kvzip"
# The cache's element types: float entries counted at f16 size, or q8_0 blocks.
DTYPES = ("f16", "q8")

INSTALL_HINT = ("install the optional extra: the CPU build of torch first (pip install torch --index-url "
                "https://download.pytorch.org/whl/cpu, or a local +cpu wheel), then pip install '.[compare]'")


class PeerUnavailable(RuntimeError):
    """torch, transformers, gguf or kvpress is missing."""


def check() -> None:
    """Raise :class:`PeerUnavailable` with an install hint unless the extra is importable."""
    problems = []
    for mod in ("torch", "transformers", "gguf", "kvpress"):
        try:
            __import__(mod)
        except ImportError as e:  # missing, or present with a version it refuses (e.g. tokenizers)
            problems.append(f"{mod} ({e})")
    if problems:
        raise PeerUnavailable(f"kvpress peer cannot import {'; '.join(problems)}: {INSTALL_HINT}")


def dtype_gain(kv_dtype: str) -> float:
    """f16 bytes / bytes of the peer's ``kv_dtype`` for the same entries."""
    if kv_dtype not in DTYPES:
        raise ValueError(f"the kvpress peer's cache is one of {', '.join(DTYPES)}, not {kv_dtype!r}")
    return q8_0.gain() if kv_dtype == "q8" else 1.0


def compression_ratio(target: float, prompt_tokens: int, later_tokens: int) -> float:
    """kvpress's fraction of prompt entries to remove so that, after ``later_tokens`` more are
    written uncompressed, 1/target of all entries are held."""
    if target <= 1:
        return 0.0
    keep = (prompt_tokens + later_tokens) / target - later_tokens
    if keep < 1:
        raise ValueError(f"ratio {target} is out of reach: the {later_tokens} uncompressed tokens after "
                         f"a {prompt_tokens}-token prompt already exceed 1/{target} of the cache")
    return max(0.0, 1.0 - keep / prompt_tokens)


def press_ratio(target: float, kv_dtype: str, prompt_tokens: int, later_tokens: int) -> float:
    """kvpress's ``compression_ratio`` for a whole-model ``target`` (against f16) with the cache
    in ``kv_dtype``: the element type pays its part, eviction the rest."""
    from .quality import eviction_target

    return compression_ratio(eviction_target(target, dtype_gain(kv_dtype)), prompt_tokens, later_tokens)


def make_press(name: str, cr: float):
    if name not in PRESSES:
        raise ValueError(f"unknown kvpress press {name!r} (allowed: {', '.join(PRESSES)})")
    import kvpress

    if name == "adakv_expected":
        return kvpress.AdaKVPress(kvpress.ExpectedAttentionPress(compression_ratio=cr))
    return getattr(kvpress, PRESSES[name][0])(compression_ratio=cr)


class _KvzipTokenizer:
    """What ``KVzipPress`` asks of a tokenizer, answered by ours (the frontier's token ids).
    No chat template: the frontier's prompts are raw text, not chat turns, so KVzip asks for the
    repetition as kvpress does for a model without one (no prefix to skip, suffix "\\n")."""
    chat_template = None

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def from_pretrained(self, *_args, **_kwargs):  # stands in for AutoTokenizer.from_pretrained
        return self

    def encode(self, text: str, return_tensors=None, add_special_tokens: bool = False):
        import torch

        return torch.tensor(self.tokenizer.encode(text), dtype=torch.long).reshape(1, -1)


@contextmanager
def kvzip_tokenizer(tokenizer):
    """Within this block, ``KVzipPress`` uses ``tokenizer`` (ours) instead of loading one by the
    model's name (a GGUF directory has no tokenizer files)."""
    from kvpress.presses import kvzip_press

    real = kvzip_press.AutoTokenizer
    kvzip_press.AutoTokenizer = _KvzipTokenizer(tokenizer)
    try:
        yield
    finally:
        kvzip_press.AutoTokenizer = real


def _q8_cache():
    """A transformers cache whose every written entry is stored as q8_0 and read back."""
    from transformers import DynamicCache

    class Q8Cache(DynamicCache):
        def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
            return super().update(q8_0.fake_torch(key_states), q8_0.fake_torch(value_states), layer_idx, cache_kwargs)

    return Q8Cache()


Job = Tuple[str, float]  # (press name, kvpress compression_ratio)


class KvpressPeer:
    """One GGUF loaded in transformers (dequantised to float32), the presses applied to it."""

    def __init__(self, gguf_path: str, threads: int = 2, tokenizer=None):
        check()
        import torch
        import transformers

        torch.set_num_threads(max(1, int(threads)))
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        logging.getLogger("kvpress.presses.kvzip_press").setLevel(logging.ERROR)  # its cost warning: documented
        import kvpress  # noqa: F401  (patches the attention functions AdaKV's masking needs)

        if not os.path.exists(gguf_path):
            raise FileNotFoundError(f"GGUF not found: {gguf_path}")
        self.gguf_path = gguf_path
        if tokenizer is None:
            from ..gguf_model import GgufModel
            from ..tokenizer import load_tokenizer

            tokenizer = load_tokenizer(GgufModel(gguf_path))
        self.tokenizer = tokenizer
        self._models: Dict[str, object] = {}
        self.model = self._model("sdpa")
        c = self.model.config
        self.n_layers, self.n_kv_heads = c.num_hidden_layers, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self._prompt_key = None
        self._caches: Dict[object, list] = {}
        self._last_logits: Dict[str, object] = {}

    def _model(self, attn: str):
        if attn not in self._models:
            import torch
            from transformers import AutoModelForCausalLM

            m = AutoModelForCausalLM.from_pretrained(
                os.path.dirname(self.gguf_path) or ".", gguf_file=os.path.basename(self.gguf_path),
                dtype=torch.float32, attn_implementation=attn)
            self._models[attn] = m.eval()
        return self._models[attn]

    def entry_bytes(self, entries: int, kv_dtype: str = "f16") -> int:
        """Bytes of ``entries`` (K, V) pairs of one head_dim each, in ``kv_dtype``."""
        row = q8_0.row_bytes(self.head_dim) if kv_dtype == "q8" else 2 * self.head_dim
        return entries * 2 * row

    def token_bytes(self, tokens: int, kv_dtype: str = "f16") -> int:
        """Bytes of ``tokens`` tokens in every layer and KV head."""
        return self.entry_bytes(tokens * self.n_layers * self.n_kv_heads, kv_dtype)

    # --- prefill with every press of the grid ---------------------------------------------------
    def _prefill(self, ids: Sequence[int], jobs: Sequence[Job], attn: str) -> Dict[object, list]:
        """One prefill of ``ids``; returns per job (and ``None`` for the uncompressed cache) the
        per-layer ``(keys, values, masked_key_indices)``."""
        import torch
        from kvpress.presses.base_press import is_prefilling
        from kvpress.utils import extract_keys_and_values
        from transformers import DynamicCache

        model = self._model(attn)
        presses = {job: make_press(job[0], job[1]) for job in jobs if job[0] != KVZIP}
        zipped = [job for job in jobs if job[0] == KVZIP]
        for p in presses.values():
            p.post_init_from_model(model)
        out: Dict[object, list] = {job: [None] * self.n_layers for job in jobs}
        if attn == "sdpa":
            out[None] = [None] * self.n_layers

        def hook(module, args, kwargs, output):
            if not is_prefilling(kwargs["cache_position"], kwargs["hidden_states"].shape[1]):
                return output
            i = module.layer_idx
            keys, values = extract_keys_and_values(kwargs["past_key_values"], i)
            if None in out:
                out[None][i] = (keys, values, None)
            for job, press in presses.items():
                module.masked_key_indices = None
                k, v = press.compress(module, kwargs["hidden_states"], keys, values, output[1], kwargs)
                out[job][i] = (k, v, getattr(module, "masked_key_indices", None))
            module.masked_key_indices = None
            return output

        for layer in model.model.layers:  # as kvpress's own hook set-up does: some presses need RoPE
            layer.self_attn.rotary_emb = model.model.rotary_emb
        zipper = _kvzip_scorer() if any(cr > 0 for _, cr in zipped) else None
        # Inference mode around KVzip's block too: leaving it runs the reconstruction passes.
        with torch.inference_mode(), ExitStack() as stack:
            if zipper:
                stack.enter_context(kvzip_tokenizer(self.tokenizer))
                stack.enter_context(zipper(model))
            hooks = [layer.self_attn.register_forward_hook(hook, with_kwargs=True) for layer in model.model.layers]
            try:
                h = model.model(input_ids=torch.tensor([list(ids)]), past_key_values=DynamicCache())
                # The prompt's own next-token logits (the first prediction after it).
                self._last_logits[attn] = model.lm_head(h.last_hidden_state[0, -1])
            finally:
                for h in hooks:
                    h.remove()
        for job in zipped:
            masks = kvzip_masks(model, zipper.scores, job[1]) if job[1] > 0 else [None] * self.n_layers
            out[job] = [(k, v, m) for (k, v, _), m in zip(out[None], masks)]
        return out

    def _compressed(self, ids: Sequence[int], job: Optional[Job], grid: Sequence[Job]) -> list:
        """The cache of ``job`` after prefilling ``ids``; one prefill serves the whole grid."""
        key = tuple(ids)
        if key != self._prompt_key:
            self._prompt_key, self._caches = key, {}
        if job not in self._caches:
            eager = job is not None and PRESSES[job[0]][1]
            todo = [j for j in set(grid) | ({job} if job else set())
                    if PRESSES[j[0]][1] == eager and j not in self._caches]
            self._caches.update(self._prefill(ids, todo, "eager" if eager else "sdpa"))
        return self._caches[job]

    def _run(self, layers: list, prompt_len: int, ids: Sequence[int], kv_dtype: str):
        """Forward ``ids`` after a copy of the cache ``layers`` (q8: stored as q8_0, and so is
        every entry written from here on); returns (logits, cache, entries held)."""
        import torch
        from transformers import DynamicCache

        cache = _q8_cache() if kv_dtype == "q8" else DynamicCache()
        held = 0
        attn = self.model.model.layers
        for i, (k, v, masked) in enumerate(layers):
            cache.update(k, v, i)
            attn[i].self_attn.masked_key_indices = masked
            held += k.shape[1] * k.shape[2] - (len(masked[0]) if masked is not None else 0)
        try:
            with torch.inference_mode():
                pos = torch.arange(prompt_len, prompt_len + len(ids))[None]
                logits = self.model(input_ids=torch.tensor([list(ids)]), past_key_values=cache,
                                    position_ids=pos).logits[0]
        finally:
            for layer in attn:
                layer.self_attn.masked_key_indices = None
        held += self.n_layers * self.n_kv_heads * len(ids)
        return logits, cache, held

    @staticmethod
    def _grid(prompt_tokens: int, later_tokens: int, grid_methods, grid_ratios) -> List[Job]:
        jobs = {(p, press_ratio(r, d, prompt_tokens, later_tokens)) for p, d in grid_methods for r in grid_ratios}
        return sorted(j for j in jobs if j[1] > 0)

    # --- what the frontier asks ------------------------------------------------------------------
    def teacher_forced(self, prompt: Sequence[int], cont: Sequence[int], press: Optional[str],
                       ratio: float, kv_dtype: str = "f16", grid_ratios: Sequence[float] = (),
                       grid_methods: Sequence[Tuple[str, str]] = ()) -> dict:
        """Log-probabilities [len(cont), vocab], row i that of cont[i] after prompt + cont[:i],
        with the prompt's cache compressed by ``press`` (None: uncompressed) to whole-model
        ``ratio`` in ``kv_dtype``; ``grid_methods`` (press, kv_dtype) and ``grid_ratios`` name the
        others this prompt will be asked for, so that one prefill serves them all. Row 0 comes from the prefill, before
        any press (as in kvpress's pipeline)."""
        import torch

        grid = self._grid(len(prompt), len(cont), grid_methods, grid_ratios)
        j = (press, press_ratio(ratio, kv_dtype, len(prompt), len(cont))) if press else None
        layers = self._compressed(prompt, j, grid)
        # The continuation's last token is written to the cache but predicts nothing we score.
        logits, _, held_entries = self._run(layers, len(prompt), list(cont[:-1]), kv_dtype)
        held_entries += self.n_layers * self.n_kv_heads
        eager = j is not None and PRESSES[j[0]][1]
        logits = torch.cat([self._last_logits["eager" if eager else "sdpa"][None], logits])
        logp = torch.log_softmax(logits.float(), dim=-1).numpy()
        held = self.entry_bytes(held_entries, kv_dtype)
        full = self.token_bytes(len(prompt) + len(cont))
        return {"logp": logp, "bytes_held": held, "bytes_full": full, "ratio": full / held}

    def generate(self, context: Sequence[int], question: Sequence[int], press: Optional[str], ratio: float,
                 question_inside: bool, max_new_tokens: int, kv_dtype: str = "f16", grid_ratios: Sequence[float] = (),
                 grid_methods: Sequence[Tuple[str, str]] = ()) -> Tuple[List[int], int, int]:
        """Greedy answer ids, bytes held at the end and f16 bytes of every entry written.
        ``question_inside``: the question is part of the compressed prompt, so the first answer
        token comes from the (uncompressed) prefill and the rest from the compressed cache, as
        kvpress runs it; otherwise only the context is compressed and the question follows it
        (kvpress's default)."""
        import torch

        prompt = list(context) + list(question) if question_inside else list(context)
        grid = self._grid(len(prompt), 0, grid_methods, grid_ratios)
        j = (press, press_ratio(ratio, kv_dtype, len(prompt), 0)) if press else None
        layers = self._compressed(prompt, j, grid)
        if question_inside:
            eager = j is not None and PRESSES[j[0]][1]
            first = self._last_logits["eager" if eager else "sdpa"]
            logits, cache, held = self._run(layers, len(prompt), [int(first.argmax())], kv_dtype)
            out = [int(first.argmax()), int(logits[-1].argmax())]
        else:
            logits, cache, held = self._run(layers, len(prompt), list(question), kv_dtype)
            out = [int(logits[-1].argmax())]
        pos = len(prompt) + (1 if question_inside else len(question))
        with torch.inference_mode():
            while len(out) < max_new_tokens:
                logits = self.model(input_ids=torch.tensor([[out[-1]]]), past_key_values=cache,
                                    position_ids=torch.tensor([[pos]])).logits[0]
                out.append(int(logits[-1].argmax()))
                pos += 1
                held += self.n_layers * self.n_kv_heads
        return out[:max_new_tokens], self.entry_bytes(held, kv_dtype), self.token_bytes(pos)


def _kvzip_scorer():
    """kvpress's ``KVzipPress`` that keeps its reconstruction scores past its context manager
    (which resets them) instead of pruning, so that each ratio is cut from one reconstruction."""
    from kvpress import KVzipPress

    class KVzipScores(KVzipPress):
        scores = None

        def compress_post(self, model):  # the cut is kvzip_masks', per ratio
            self.scores = self.score_val.clone()

    return KVzipScores(compression_ratio=0.5)  # any ratio > 0, or the press skips its scoring


def kvzip_masks(model, scores, cr: float) -> list:
    """Per layer, the entries KVzip prunes at ``compression_ratio`` ``cr`` given its
    reconstruction ``scores``: kvpress's own ``compress_post`` (one budget over all layers and
    heads), read back from the modules it marks."""
    from kvpress import KVzipPress

    press = KVzipPress(compression_ratio=cr)
    press.score_val = scores.clone()
    press.compress_post(model)
    out = []
    for layer in model.model.layers:
        out.append(layer.self_attn.masked_key_indices)
        layer.self_attn.masked_key_indices = None
    return out
