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

Memory is reported the way ours is: f16 bytes of every (K, V) entry the cache holds at the end of
the continuation, every layer. AdaKV keeps pruned entries in memory and masks them (kvpress's
``attention_patch``); we count them as freed, which is what a real implementation would hold.
A whole-model target ``r`` sets kvpress's ``compression_ratio`` (fraction of prompt entries
removed) so that the held entries after the continuation are 1/r of all entries written, the
same end-state our engine's target means (kvpress never evicts during decoding).
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence, Tuple

# Our name -> (kvpress class path, needs eager attention). AdaKV wraps ExpectedAttention, the
# leading combination on kvpress's public leaderboard.
PRESSES: Dict[str, Tuple[str, bool]] = {
    "streaming": ("StreamingLLMPress", False),
    "snapkv": ("SnapKVPress", False),
    "observed": ("ObservedAttentionPress", True),
    "tova": ("TOVAPress", False),
    "keydiff": ("KeyDiffPress", False),
    "expected": ("ExpectedAttentionPress", False),
    "adakv_expected": ("AdaKVPress(ExpectedAttentionPress)", False),
}

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


def make_press(name: str, cr: float):
    if name not in PRESSES:
        raise ValueError(f"unknown kvpress press {name!r} (allowed: {', '.join(PRESSES)})")
    import kvpress

    if name == "adakv_expected":
        return kvpress.AdaKVPress(kvpress.ExpectedAttentionPress(compression_ratio=cr))
    return getattr(kvpress, PRESSES[name][0])(compression_ratio=cr)


Job = Tuple[str, float]  # (press name, kvpress compression_ratio)


class KvpressPeer:
    """One GGUF loaded in transformers (dequantised to float32), the presses applied to it."""

    def __init__(self, gguf_path: str, threads: int = 2):
        check()
        import torch
        import transformers

        torch.set_num_threads(max(1, int(threads)))
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        import kvpress  # noqa: F401  (patches the attention functions AdaKV's masking needs)

        if not os.path.exists(gguf_path):
            raise FileNotFoundError(f"GGUF not found: {gguf_path}")
        self.gguf_path = gguf_path
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

    def entry_bytes(self, tokens: int) -> int:
        """f16 bytes of ``tokens`` (K, V) entries in every layer and KV head."""
        return tokens * 2 * self.n_layers * self.n_kv_heads * self.head_dim * 2

    # --- prefill with every press of the grid ---------------------------------------------------
    def _prefill(self, ids: Sequence[int], jobs: Sequence[Job], attn: str) -> Dict[object, list]:
        """One prefill of ``ids``; returns per job (and ``None`` for the uncompressed cache) the
        per-layer ``(keys, values, masked_key_indices)``."""
        import torch
        from kvpress.presses.base_press import is_prefilling
        from kvpress.utils import extract_keys_and_values
        from transformers import DynamicCache

        model = self._model(attn)
        presses = {job: make_press(job[0], job[1]) for job in jobs}
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
        hooks = [layer.self_attn.register_forward_hook(hook, with_kwargs=True) for layer in model.model.layers]
        try:
            with torch.inference_mode():
                h = model.model(input_ids=torch.tensor([list(ids)]), past_key_values=DynamicCache())
                # The prompt's own next-token logits (for a question inside the prompt).
                self._last_logits[attn] = model.lm_head(h.last_hidden_state[0, -1])
        finally:
            for h in hooks:
                h.remove()
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

    def _run(self, layers: list, prompt_len: int, ids: Sequence[int]):
        """Forward ``ids`` after a copy of the cache ``layers``; returns (logits, entries held)."""
        import torch
        from transformers import DynamicCache

        cache = DynamicCache()
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

    # --- what the frontier asks ------------------------------------------------------------------
    def teacher_forced(self, prompt: Sequence[int], cont: Sequence[int], press: Optional[str],
                       ratio: float, grid_ratios: Sequence[float] = (), grid_presses: Sequence[str] = ()) -> dict:
        """Log-probabilities [len(cont), vocab] of each next token after prompt + cont[:i], with the
        prompt's cache compressed by ``press`` (None: uncompressed) to whole-model ``ratio``;
        ``grid_*`` name the other (press, ratio) pairs this prompt will be asked for, so that one
        prefill serves them all."""
        import torch

        def job(p, r):
            return (p, compression_ratio(r, len(prompt), len(cont)))

        grid = [job(p, r) for p in grid_presses for r in grid_ratios if r > 1]
        j = job(press, ratio) if press else None
        layers = self._compressed(prompt, j, grid)
        logits, _, held_entries = self._run(layers, len(prompt), cont)
        logp = torch.log_softmax(logits.float(), dim=-1).numpy()
        held = held_entries * 2 * self.head_dim * 2  # K and V, f16 bytes per element
        return {"logp": logp, "bytes_held": held, "bytes_full": self.entry_bytes(len(prompt) + len(cont)),
                "ratio": self.entry_bytes(len(prompt) + len(cont)) / held}

    def generate(self, context: Sequence[int], question: Sequence[int], press: Optional[str], ratio: float,
                 question_inside: bool, max_new_tokens: int, grid_ratios: Sequence[float] = (),
                 grid_presses: Sequence[str] = ()) -> Tuple[List[int], int, int]:
        """Greedy answer ids, f16 bytes held at the end and f16 bytes of every entry written. ``question_inside``: the question is part of the compressed prompt,
        so the first answer token comes from the (uncompressed) prefill and the rest from the
        compressed cache, as kvpress runs it; otherwise only the context is compressed and the
        question follows it (kvpress's default)."""
        import torch

        prompt = list(context) + list(question) if question_inside else list(context)

        def job(p, r):
            return (p, compression_ratio(r, len(prompt), 0))

        grid = [job(p, r) for p in grid_presses for r in grid_ratios if r > 1]
        j = job(press, ratio) if press else None
        layers = self._compressed(prompt, j, grid)
        if question_inside:
            eager = j is not None and PRESSES[j[0]][1]
            first = self._last_logits["eager" if eager else "sdpa"]
            logits, cache, held = self._run(layers, len(prompt), [int(first.argmax())])
            out = [int(first.argmax()), int(logits[-1].argmax())]
        else:
            logits, cache, held = self._run(layers, len(prompt), list(question))
            out = [int(logits[-1].argmax())]
        pos = len(prompt) + (1 if question_inside else len(question))
        with torch.inference_mode():
            while len(out) < max_new_tokens:
                logits = self.model(input_ids=torch.tensor([[out[-1]]]), past_key_values=cache,
                                    position_ids=torch.tensor([[pos]])).logits[0]
                out.append(int(logits[-1].argmax()))
                pos += 1
                held += self.n_layers * self.n_kv_heads
        held_bytes = held * 2 * self.head_dim * 2
        return out[:max_new_tokens], held_bytes, self.entry_bytes(pos)
