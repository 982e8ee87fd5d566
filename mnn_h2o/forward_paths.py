"""The paths a forward takes through the model, each chosen once when an Llm loads (engine.py):

    layers of a decode token:  NativeTokenLayers (one native call: every layer and its cache step,
                               and the logits where the layers hold the head)
                               | MnnLayers (MNN's layer modules, a cache step after each)
    layers of a prompt chunk:  NativePromptLayers (the chunk's rows, batched native products)
                               | MnnLayers
    head (tail + lm_head):     LayersHead (the decode layers' own tail and output matrix: a
                               k-quant head, or the q8 rows of a Q8_0 one)
                               | TailThenHead(NativeTail | MnnTail, Q8Head | MnnHead)

A layers path runs ids through every layer at positions pos.. against a context's cache (its K/V
appended, attended; the observer given each layer's input hidden states) and returns LayerRows;
a head path turns LayerRows into logits. Asked for logits, a decode token's native call computes
them itself where the layers hold the head (LayerRows.logits), and LayersHead hands those on:
Python asks for a token and reads counters. Each adds its time to the context's Stats (engine.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np

from .architecture import ARCHITECTURES, is_local

# An observer: (layer, input hidden states [n, hidden]) -> None or the predicted scores of the
# tokens the layer's cache step has just appended ([n_kv_heads, n]).
Observer = Callable[[int, np.ndarray], Optional[np.ndarray]]


@dataclass
class LayerRows:
    """What the layers leave for the head: the last layer's input residual stream ``h`` (numpy
    rows, or MNN's output variable when MNN's modules ran), its attention output ``attn``
    ([n, n_heads * head_dim] float32), when MNN's modules ran, that output as MNN's input
    variable (``mnn_attn``, so MNN's tail reads it without a copy), and the logits ([n, vocab])
    where the layers' call computed them."""
    h: Any
    attn: np.ndarray
    mnn_attn: Any = None
    logits: Optional[np.ndarray] = None

    def h_rows(self) -> np.ndarray:
        return self.h if isinstance(self.h, np.ndarray) else self.h.read()


def observe_into(cache, observe: Observer, layer: int, h: np.ndarray) -> None:
    """Gives ``observe`` a layer's input hidden states; the scores it returns go to the cache
    as those of the tokens the layer's step has just appended."""
    scores = observe(layer, h)
    if scores is not None:
        cache.set_token_scores(layer, scores)


class Inputs:
    """The model's inputs by position and token (the embedding rows, scaled where the architecture
    says so; the RoPE rows of the global layers and, where the model has sliding-window layers,
    theirs) and MNN's placeholders for an n-row step, kept per n so decode steps allocate nothing.

    The RoPE rows are computed a block of positions at a time, and the last block of each table
    kept: a whole table would hold max_context x head_dim floats twice per base (128 MiB for
    Gemma 3 at 32K tokens). The rows are those of the whole table bit for bit (rope_tables is
    elementwise)."""

    ROPE_BLOCK = 1024  # positions a RoPE block holds

    def __init__(self, F, cfg, embedding_rows: Callable[[np.ndarray], np.ndarray]):
        # embedding_rows(ids) -> float32 [n, hidden]: the export's f16 rows, or a tied Q8_0
        # embedding's from the head's q8 rows (Q8Matrix.rows_of)
        self.F, self.cfg, self._rows = F, cfg, embedding_rows
        form = ARCHITECTURES[cfg.arch]
        self._scale = np.float32(np.sqrt(cfg.hidden)) if form.embedding_scale == "sqrt_hidden" else None
        # base 0: the model's own (rope_tables); the window layers' where it has them.
        self._bases = {False: 0.0, True: form.local_rope_base} if form.global_every else {False: 0.0}
        self._rope_blocks: Dict[bool, tuple] = {}
        self._vars: Dict[int, tuple] = {}

    @property
    def has_local(self) -> bool:
        """Whether the model has sliding-window layers, with a RoPE base of their own."""
        return True in self._bases

    def rope(self, pos: int, n: int, local: bool = False) -> tuple:
        """(cos, sin), each [n, head_dim] float32, of positions pos..pos + n - 1: the global
        layers' rotation, or with ``local`` the sliding-window layers'."""
        from .numpy_ops import rope_tables

        b = pos // self.ROPE_BLOCK
        start = b * self.ROPE_BLOCK
        if pos + n > start + self.ROPE_BLOCK:  # across blocks: this range alone
            return rope_tables(self.cfg, np.arange(pos, pos + n), np.float32, self._bases[local])
        block = self._rope_blocks.get(local)
        if block is None or block[0] != b:
            cos, sin = rope_tables(self.cfg, np.arange(start, start + self.ROPE_BLOCK), np.float32, self._bases[local])
            block = self._rope_blocks[local] = (b, cos, sin)
        return block[1][pos - start:pos - start + n], block[2][pos - start:pos - start + n]

    def vars(self, n: int) -> tuple:
        """(h, attn, cos, sin) placeholders and an attention output buffer [n, hidden]."""
        v = self._vars.get(n)
        if v is None:
            F, c = self.F, self.cfg
            v = (F.placeholder([n, c.hidden]), F.placeholder([n, c.hidden]),
                 F.placeholder([n, 1, c.head_dim]), F.placeholder([n, 1, c.head_dim]),
                 np.empty((n, c.hidden), np.float32))
            if n <= 1 or len(self._vars) < 8:
                self._vars[n] = v
        return v

    def embedding(self, ids) -> np.ndarray:
        rows = self._rows(np.asarray(ids, dtype=np.int32))
        if self._scale is not None:  # Gemma: the row times sqrt(hidden), in float32 as llama.cpp does
            rows *= self._scale
        return rows


class MnnLayers:
    """Every layer through MNN's module ``layer{i}`` (the export's), the cache step between."""

    def __init__(self, modules: Dict[str, Any], inputs: Inputs):
        self.layers = [modules[f"layer{i}"] for i in range(inputs.cfg.n_layers)]
        self.inputs = inputs

    def run(self, ids: Sequence[int], pos: int, cache, st, observe: Optional[Observer],
            logits: bool = False) -> LayerRows:  # MNN's layers leave the logits to the head path
        n, inp, perf = len(ids), self.inputs, time.perf_counter
        t0 = perf()
        h_in, attn_in, cos_in, sin_in, attn = inp.vars(n)
        h_in.write(inp.embedding(ids))
        cos, sin = inp.rope(pos, n)
        cos_in.write(cos[:, None, :])
        sin_in.write(sin[:, None, :])
        t_mnn = t_att = t_obs = 0.0
        t1 = perf()
        t_conv = t1 - t0
        h = h_in
        # One clock reading between consecutive parts: 4 per layer (~0.1 us each).
        for i, layer in enumerate(self.layers):
            h, q, k, v = layer.forward([h, cos_in, sin_in] if i == 0 else [h, attn_in, cos_in, sin_in])
            t2 = perf()
            q, k, v = q.read(), k.read(), v.read()
            t3 = perf()
            cache.step(i, q, k, v, attn)
            t4 = perf()
            if observe is not None:  # timed as policy
                observe_into(cache, observe, i, h.read())
                t_obs += perf() - t4
                t4 = perf()
            attn_in.write(attn)
            t5 = perf()
            t_mnn += t2 - t1
            t_conv += (t3 - t2) + (t5 - t4)
            t_att += t4 - t3
            t1 = t5
        st.mnn_s += t_mnn
        st.mnn_calls += len(self.layers)
        st.convert_s += t_conv
        st.attention_s += t_att
        st.policy_s += t_obs
        return LayerRows(h, attn, attn_in)


class NativeTokenLayers:
    """One decode token through the native decode layers: every layer and its cache step in one
    native call on one team of threads (native/include/mnn_h2o/model/decode_token.h), and its
    logits in the same call when asked for and ``head`` (the layers hold the output matrix and
    the engine chose them as its head path)."""

    def __init__(self, layers, inputs: Inputs, head: bool):
        from . import native

        c = inputs.cfg
        self.layers, self.inputs = layers, inputs
        self.vocab = layers.vocab if head else 0
        self._call = native.decode_token  # bound once: it runs every decode token
        self._q, self._k, self._v = (np.empty((1, n * c.head_dim), np.float32)
                                     for n in (c.n_heads, c.n_kv_heads, c.n_kv_heads))
        self._attn = np.empty((1, c.n_heads * c.head_dim), np.float32)  # the attention output: heads x head_dim wide

    def run(self, ids: Sequence[int], pos: int, cache, st, observe: Optional[Observer],
            logits: bool = False) -> LayerRows:
        t0 = time.perf_counter()
        inp = self.inputs
        # A fresh array each token: a caller may keep the previous token's.
        out = np.empty((1, self.vocab), np.float32) if logits and self.vocab else None
        h = inp.embedding(ids[:1])[0]  # one place for the embedding (and, for Gemma, its scale)
        cos, sin = inp.rope(pos, 1)
        local_cos = local_sin = None
        if inp.has_local:  # the window layers' rotation (the cache's window layers take it)
            local_cos, local_sin = (x[0] for x in inp.rope(pos, 1, local=True))
        dense, att, obs, head = self._call(self.layers, cache, h, cos[0], sin[0], self._q, self._k, self._v,
                                           self._attn, observe, None, local_cos, local_sin, out)
        st.dense_s += dense
        st.attention_s += att
        st.policy_s += obs
        st.head_s += head
        st.convert_s += time.perf_counter() - t0 - dense - att - obs - head
        return LayerRows(h[None], self._attn, logits=out)


class NativePromptLayers:
    """A prompt chunk through the native layers (runtime.prompt_layers native): each layer's
    products batched over the chunk's rows, then its cache step."""

    def __init__(self, layers, inputs: Inputs):
        self.layers, self.inputs = layers, inputs

    def run(self, ids: Sequence[int], pos: int, cache, st, observe: Optional[Observer]) -> LayerRows:
        c, inp, perf = self.inputs.cfg, self.inputs, time.perf_counter
        n = len(ids)
        t0 = perf()
        h = inp.embedding(ids)
        q = np.empty((n, c.n_heads * c.head_dim), np.float32)
        k, v = (np.empty((n, c.n_kv_heads * c.head_dim), np.float32) for _ in range(2))
        attn = np.empty((n, c.n_heads * c.head_dim), np.float32)
        rope = {False: inp.rope(pos, n)}
        if inp.has_local:
            rope[True] = inp.rope(pos, n, local=True)
        t1 = perf()
        t_dense = t_att = t_obs = 0.0
        for i in range(c.n_layers):
            cos, sin = rope[is_local(c, i)]
            self.layers.forward_rows(i, h, attn if i else None, cos, sin, q, k, v)
            t2 = perf()
            cache.step(i, q, k, v, attn)
            t3 = perf()
            t_dense += t2 - t1
            t_att += t3 - t2
            if observe is not None:  # timed as policy
                observe_into(cache, observe, i, h)
                t4 = perf()
                t_obs += t4 - t3
                t3 = t4
            t1 = t3
        st.dense_s += t_dense
        st.attention_s += t_att
        st.policy_s += t_obs
        st.convert_s += t1 - t0 - t_dense - t_att - t_obs
        return LayerRows(h, attn)


class LayersHead:
    """The decode layers' own tail and output matrix (a k-quant head read from the GGUF's
    blocks, or a Q8_0 one's q8 rows): the last layer finished, the final norm and the logits in
    one native call, or in the token's own (LayerRows.logits)."""

    def __init__(self, layers, vocab: int):
        self.layers, self.vocab = layers, vocab

    def logits(self, rows: LayerRows, sel: slice, st) -> np.ndarray:
        if rows.logits is not None:  # the token's call computed them (its time counted there)
            return rows.logits[sel]
        perf = time.perf_counter
        t0 = perf()
        # logits_rows finishes the last layer into its h: a copy
        h = np.array(rows.h_rows()[sel], np.float32)
        a = np.ascontiguousarray(rows.attn[sel], dtype=np.float32)
        logits = np.empty((len(h), self.vocab), np.float32)
        t1 = perf()
        self.layers.logits_rows(h, a, logits)
        st.convert_s += t1 - t0
        st.head_s += perf() - t1
        return logits


class MnnTail:
    """MNN's ``tail`` module (the last layer's end and the final norm)."""

    def __init__(self, module, inputs: Inputs):
        self.module, self.inputs = module, inputs

    def __call__(self, rows: LayerRows, sel: slice, st) -> np.ndarray:
        perf = time.perf_counter
        t0 = perf()
        h, attn_in = rows.h, rows.mnn_attn
        if attn_in is None:  # the layers were native: their rows into MNN's placeholders
            h_in, attn_in = self.inputs.vars(len(rows.attn))[:2]
            h_in.write(rows.h_rows())
            attn_in.write(rows.attn)
            h = h_in
        t1 = perf()
        x = self.module.forward([h, attn_in])[0]
        t2 = perf()
        x = x.read()[sel]
        st.convert_s += (t1 - t0) + (perf() - t2)
        st.mnn_s += t2 - t1
        st.mnn_calls += 1
        return x


class NativeTailRows:
    """The native tail (mnn_h2o/native_tail.py: the GGUF's blocks, float activations)."""

    def __init__(self, tail):
        self.tail = tail

    def __call__(self, rows: LayerRows, sel: slice, st) -> np.ndarray:
        perf = time.perf_counter
        t0 = perf()
        h = rows.h_rows()[sel]
        t1 = perf()
        x = self.tail(h, rows.attn[sel])
        st.convert_s += t1 - t0
        st.head_s += perf() - t1
        return x


class Q8Head:
    """The native lm_head: q8_0 rows times the float activation."""

    def __init__(self, matrix):
        self.matrix = matrix

    def __call__(self, x: np.ndarray, st) -> np.ndarray:
        t0 = time.perf_counter()
        logits = self.matrix.multiply(x)
        st.head_s += time.perf_counter() - t0
        return logits


class MnnHead:
    """MNN's ``lm_head`` module."""

    def __init__(self, module, F, hidden: int):
        self.module, self.F, self.hidden = module, F, hidden

    def __call__(self, x: np.ndarray, st) -> np.ndarray:
        perf = time.perf_counter
        t0 = perf()
        v = self.F.const(x, [len(x), self.hidden])
        t1 = perf()
        out = self.module.forward([v])[0]
        t2 = perf()
        logits = np.array(out.read(), dtype=np.float32, copy=True)
        st.mnn_s += t2 - t1
        st.mnn_calls += 1
        st.convert_s += (t1 - t0) + (perf() - t2)
        return logits


class TailThenHead:
    """A tail (native or MNN's) and then an lm_head (native q8_0 or MNN's)."""

    def __init__(self, tail, head):
        self.tail, self.head = tail, head

    def logits(self, rows: LayerRows, sel: slice, st) -> np.ndarray:
        x = self.tail(rows, sel, st)
        t0 = time.perf_counter()
        x = np.ascontiguousarray(x, dtype=np.float32)
        st.convert_s += time.perf_counter() - t0
        return self.head(x, st)
