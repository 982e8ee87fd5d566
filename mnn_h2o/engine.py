"""The decoding engine: the native core runs the layers' dense math (or MNN's modules do), caches
K/V and attends.

One decode step, top to bottom (llama2.c style):

    h = embed[token]
    for i in layers:       # native (or MNN module): finish layer i-1, then norm + QKV + RoPE of layer i
        h, q, k, v = layer_i(h, attn, cos[pos], sin[pos])
        attn = cache.step(i, q, k, v)      # native: append K/V, exact softmax attention
    x = tail(h, attn)                      # native: finish the last layer, final norm (runtime.tail)
    logits = lm_head(x)                    # native q8_0 rows x float x (runtime.lm_head)
"""
from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np

from . import config as config_mod
from .errors import ContextOverflowError, ModelFileError
from .export import ensure_exported
from .mnn_runtime import import_mnn
from .gguf_model import ModelConfig
from .numpy_ops import rope_tables
from .speed_counters import SpeedCounters
from .tokenizer import Tokenizer


@dataclass
class Sampling:
    """Greedy when ``temperature == 0``; otherwise temperature, then top-k, then top-p."""
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: Optional[int] = None

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Stats(SpeedCounters):
    """Counters of the current context (since the last ``reset``)."""
    # Where a forward's time goes (prefill + decode, disjoint; decode_s - their sum is Python glue):
    mnn_s: float = 0.0        # inside MNN Module.forward calls
    mnn_calls: int = 0        # the number of those calls
    convert_s: float = 0.0    # copies between numpy and MNN: the inputs written (embedding rows,
                              # RoPE rows, attention output), the outputs read (q/k/v, logits)
    attention_s: float = 0.0  # inside the native cache step (append, attention, score collection)
    policy_s: float = 0.0     # inside the native end of a forward (eviction when due, store jobs)
    head_s: float = 0.0       # inside the native tail and lm_head (runtime.tail, runtime.lm_head)
    dense_s: float = 0.0      # inside the native decode layers (runtime.decode_layers)
    kv_bytes_held: int = 0           # everything the cache holds: raw blocks, compressed chunks,
                                     # decode cache and scratch (the memory a user pays)
    kv_bytes_pool: int = 0           # of which raw blocks
    kv_bytes_kept: int = 0           # the tokens held at raw size, compressed or not: what
                                     # eviction alone leaves
    kv_bytes_peak: int = 0
    kv_bytes_uncompressed: int = 0   # what a cache without eviction/compression would hold,
                                     # in the cache's element type (runtime.kv_dtype)
    kv_bytes_f16: int = 0            # the same tokens as f16 rows: the reference of the
                                     # whole-model ratio, whatever the element type
    evictions: int = 0               # forwards after which the H2O policy evicted something
    # The context reconstruction pass of eviction.policy kvzip (docs/eviction.md "Reconstruction"): its part
    # of prefill_s (a user waits for it) or of compress_s (run after the answer: Llm.compress)
    # and the tokens it ran through the model (the repeat prompts and the context again).
    reconstruct_s: float = 0.0
    reconstruct_tokens: int = 0
    compress_s: float = 0.0
    # Sums over decode steps of uncompressed and held bytes: their ratio is the lossy ratio
    # averaged over the decode (weighted by time in tokens), not just its final value.
    decode_bytes_uncompressed_sum: int = 0
    decode_bytes_held_sum: int = 0

    @property
    def lossy_ratio(self) -> float:
        """Whole model, now: bytes an uncompressed cache would hold / bytes the tokens held take
        raw (eviction alone; with the lossless store off, all bytes held)."""
        return self.kv_bytes_uncompressed / self.kv_bytes_kept if self.kv_bytes_kept else 0.0

    @property
    def total_ratio(self) -> float:
        """Whole model, now: bytes an uncompressed cache would hold / all bytes held."""
        return self.kv_bytes_uncompressed / self.kv_bytes_held if self.kv_bytes_held else 0.0

    @property
    def whole_model_ratio(self) -> float:
        """Whole model, now: bytes an f16 cache of every token written would hold / all bytes
        held. Eviction, a quantised element type and the lossless store together."""
        return self.kv_bytes_f16 / self.kv_bytes_held if self.kv_bytes_held else 0.0

    @property
    def lossy_ratio_decode_avg(self) -> float:
        s = self.decode_bytes_held_sum
        return self.decode_bytes_uncompressed_sum / s if s else 0.0

    def as_dict(self) -> dict:
        d = super().as_dict()
        d.update(lossy_ratio=self.lossy_ratio, total_ratio=self.total_ratio,
                 whole_model_ratio=self.whole_model_ratio, lossy_ratio_decode_avg=self.lossy_ratio_decode_avg)
        return d


class PassCancelled(Exception):
    """Llm.compress was cancelled mid-pass: the cache holds partial scores (reset it)."""


@dataclass
class Sampled:
    """What :meth:`Llm.sample_tokens` produced: the text (a stop string cut off), every sampled
    token id, how many of them were fed to the cache (a prefix of ``token_ids``) and why it
    stopped."""
    text: str
    token_ids: List[int]
    fed: int
    stop_reason: str  # "stop_token" | "stop_string" | "max_new_tokens" | "cancelled"


@dataclass
class Generation:
    text: str
    token_ids: List[int]
    stop_reason: str  # "stop_token" | "stop_string" | "max_new_tokens"
    stats: Stats = field(default_factory=Stats)


_MEMORY_MODE = {"normal": 0, "low": 2}

# The context reconstruction pass (KVzip, as kvpress runs it): the context is repeated in chunks of
# this many tokens, each after a prompt asking for it; a chunk after the first quotes the last
# RECONSTRUCTION_QUOTE tokens of the one before. The pass's tokens are dropped after each chunk.
RECONSTRUCTION_CHUNK = 2048
RECONSTRUCTION_QUOTE = 8
REPEAT_FIRST = "\n\nRepeat the previous context exactly."
REPEAT_LATER = "\n\nRepeat the part of the previous context exactly, starting with"
_HINT_DYNAMIC_QUANT_OPTIONS = 5  # MNN::Interpreter::HintMode; MNN.llm's "dynamic_option"

# What one context is: the Llm attributes a forward pass reads and writes besides the model.
_CONTEXT_FIELDS = ("cache", "kv_dtype", "eviction", "lossless", "pos", "stats", "_token_bytes", "_f16_token_bytes",
                   "unpassed", "held")


def runtime_manager(runtime: dict):
    """The MNN runtime every module of an Llm runs on, from a validated ``runtime`` section
    (threads, memory mode, dynamic quantisation)."""
    MNN = import_mnn()
    manager = MNN.nn.create_runtime_manager(({
        "backend": "CPU", "numThread": runtime["threads"], "memory": _MEMORY_MODE[runtime["memory"]]},))
    manager.set_hint(_HINT_DYNAMIC_QUANT_OPTIONS, runtime["dynamic_quant"])
    return manager


class KvContext:
    """One context of an :class:`Llm`: its native KV cache as configured (element type, eviction,
    lossless store), the position of the next token and the counters. The Llm's own attributes
    (``llm.cache``, ``llm.pos``, ``llm.stats``, ...) are its current context; ``Llm.new_context``
    makes another and ``Llm.using`` runs the model against it (mnn_h2o/session.py)."""
    __slots__ = _CONTEXT_FIELDS


class Llm:
    """A loaded model: MNN modules, tokenizer, and a current context (native KV cache).

    Threads: ``lock`` (re-entrant) serialises uses of one Llm. ``generate``, ``using`` and
    ``new_context`` hold it; a thread calling ``prefill``/``decode`` directly on an Llm shared with
    other threads holds it around everything that must not interleave."""

    def __init__(self, export_dir: str, cfg: Optional[dict] = None):
        cfg = config_mod.validate(None, cfg) if cfg is not None else config_mod.defaults()
        self.cfg = cfg
        self.lock = threading.RLock()
        rt = cfg["runtime"]
        with open(os.path.join(export_dir, "model.json")) as f:
            meta = json.load(f)
        self.meta = meta
        self.export_dir = export_dir
        self.config: ModelConfig = ModelConfig.from_dict(meta["config"])
        c = self.config
        self.tokenizer = Tokenizer.load(os.path.join(export_dir, meta["tokenizer"]))
        self.max_context = min(rt["max_context"] or c.context, c.context)
        self.prefill_chunk = rt["prefill_chunk"]

        MNN = import_mnn()
        self._F = MNN.expr
        manager = runtime_manager(rt)
        # The native tail and head replace MNN's modules where the export has their blocks
        # (quantised layers; an 8-bit head); then those modules are not loaded at all.
        q8 = meta.get("lm_head_q8") if rt["lm_head"] == "native" else None
        tail_file = meta.get("tail_blocks") if rt["tail"] == "native" else None
        layers_file = meta.get("decode_layers") if rt["decode_layers"] == "native" else None
        if rt["decode_layers"] == "native" and not layers_file and meta["weight_bits"]:
            # Never a silent fallback to MNN's (slower) layers: say which tensor stops the core.
            raise ModelFileError(f"runtime.decode_layers native: {meta.get('no_decode_layers')}; set "
                                 "runtime.decode_layers=mnn to decode with MNN's layer modules instead")
        self._decode_layers = None
        if layers_file:
            from .native_layers import load_decode_layers

            self._decode_layers = load_decode_layers(os.path.join(export_dir, layers_file), c, rt["threads"])
        # Where the decode layers hold the output matrix (a k-quant head), they run the tail and
        # the head of every row on the GGUF's own blocks: no q8_0 copy of the head, no tail module.
        self._layers_head = (self._decode_layers is not None and self._decode_layers.has_head
                             and rt["lm_head"] == "native" and rt["tail"] == "native")
        if self._layers_head:
            q8 = tail_file = None
        self._prompt_native = self._native_prompt_layers(rt["prompt_layers"])
        names = (([] if self._prompt_native else [f"layer{i}" for i in range(c.n_layers)])
                 + ([] if tail_file or self._layers_head else ["tail"])
                 + ([] if q8 or self._layers_head else ["lm_head"]))
        # MNN's modules by name ("layer3", "tail", "lm_head"): only those this runtime uses are
        # loaded (a module not loaded holds no memory), and built the first time one is needed.
        if any(n not in meta["modules"] for n in names):
            from .export import ensure_modules

            meta = self.meta = ensure_modules(export_dir)
        self._modules = {}
        for name in names:
            m = meta["modules"][name]
            self._modules[name] = MNN.nn.load_module_from_file(
                os.path.join(export_dir, m["file"]), m["inputs"], m["outputs"], runtime_manager=manager)
        self._native_tail = None
        if tail_file:
            from .native_tail import NativeTail

            self._native_tail = NativeTail(os.path.join(export_dir, tail_file), c, rt["threads"])
        if self._decode_layers is not None:
            from . import native

            self._decode_call = native.decode_token  # bound once: it runs every decode token
            self._q, self._k, self._v = (np.empty((1, n * c.head_dim), np.float32)
                                         for n in (c.n_heads, c.n_kv_heads, c.n_kv_heads))
        self._q8_head = None
        if q8:
            from . import native

            # Memory-mapped: Q8Matrix copies the rows once, so they are never held twice.
            codes = np.load(os.path.join(export_dir, q8["codes"]), mmap_mode="r")
            scales = np.load(os.path.join(export_dir, q8["scales"]), mmap_mode="r")
            self._q8_head = native.Q8Matrix(codes, scales.view(np.uint16), threads=rt["threads"])
        self._embed = np.load(os.path.join(export_dir, meta["embedding"]), mmap_mode="r")
        cos, sin = rope_tables(c, np.arange(self.max_context), np.float32)
        self._cos = np.ascontiguousarray(cos[:, None, :])
        self._sin = np.ascontiguousarray(sin[:, None, :])

        self._inputs: Dict[int, tuple] = {}
        self._repeat: Optional[tuple] = None  # the reconstruction prompts' ids, made on first use
        self._block_tokens = rt["block_tokens"]
        self._threads = rt["threads"]
        self._scorer = None  # eviction.policy predicted_kvzip's map, read on first use (mnn_h2o/token_scorer.py)
        # A callable (layer, h rows) given every layer's input hidden states ([n, hidden]) as they
        # are computed, instead of the scorer: tools.fit_scorer collects its data through it.
        self.hidden_observer = None
        self.configure_kv_dtype(rt["kv_dtype"])
        self._apply_eviction(cfg["eviction"])  # validated above
        self._apply_lossless(cfg["lossless"])

    def _native_prompt_layers(self, choice: str) -> bool:
        """Whether a prompt's layers run in our core (runtime.prompt_layers native): on the native
        decode layers, so it needs them; a float export has none and runs in MNN, as its decode
        does."""
        if choice == "mnn":
            return False
        if self._decode_layers is None and self.cfg["runtime"]["decode_layers"] == "mnn":
            raise config_mod.ConfigError("runtime.prompt_layers native runs a prompt on the native decode layers, "
                                         "and runtime.decode_layers mnn loads none; set runtime.prompt_layers=mnn "
                                         "too")
        return self._decode_layers is not None

    @property
    def prompt_layers(self) -> str:
        """Where a prompt's layers run: "native" (our core, batched products) or "mnn"."""
        return "native" if self._prompt_native else "mnn"

    @property
    def weights(self) -> str:
        """The export's weight precision, e.g. 'int8' or 'int4 layers, int8 head'."""
        name = lambda b: f"int{b}" if b else "float"
        wb = self.meta["weight_bits"]
        hb = self.meta.get("head_bits", wb)
        return name(wb) if hb == wb else f"{name(wb)} layers, {name(hb)} head"

    @classmethod
    def load(cls, model: str = "smollm2", cfg: Optional[dict] = None, progress: bool = True) -> "Llm":
        """A named model or GGUF path (``model``; None: the config's model.name), exported the
        first time, the cached export after, then loaded: the two steps ``ensure_exported`` and
        ``Llm(export_dir, cfg)``."""
        cfg = config_mod.validate(None, cfg) if cfg is not None else config_mod.defaults()
        if model is not None:
            cfg["model"]["name"] = model
        export_dir = ensure_exported(cfg["model"], progress)
        return cls(export_dir, cfg)

    # --- state -------------------------------------------------------------------------------
    def new_context(self, cfg: Optional[dict] = None) -> KvContext:
        """A new, empty context configured by the runtime.kv_dtype, eviction and lossless sections of
        ``cfg`` (default: this Llm's config); the current context is left as it is. The other
        settings (block_tokens, max_context, threads, prefill_chunk) are the Llm's."""
        cfg = self.cfg if cfg is None else config_mod.validate(None, cfg)
        with self.lock:
            saved = self._swap_context(None)
            try:
                self.configure_kv_dtype(cfg["runtime"]["kv_dtype"])
                self.configure_eviction(cfg["eviction"])
                self.configure_lossless(cfg["lossless"])
            finally:
                made = self._swap_context(saved)
        return made

    @contextmanager
    def using(self, ctx: KvContext):
        """Within the with-block the Llm runs against ``ctx`` (prefill, decode, generate with
        keep_context=True, reset, configure_*), holding the lock; its own context is back after."""
        with self.lock:
            saved = self._swap_context(ctx)
            try:
                yield self
            finally:
                inner = self._swap_context(saved)
                for f in _CONTEXT_FIELDS:
                    setattr(ctx, f, getattr(inner, f))

    def _swap_context(self, ctx: Optional[KvContext]) -> KvContext:
        """Installs ctx's fields (None: none, the caller configures a new one) and returns the
        context that was current."""
        old = KvContext()
        for f in _CONTEXT_FIELDS:
            setattr(old, f, getattr(self, f, None))
            setattr(self, f, getattr(ctx, f) if ctx is not None else None)
        return old

    def configure_kv_dtype(self, kv_dtype: str) -> None:
        """A new, empty cache whose K and V rows are of element type ``kv_dtype`` (see the key
        runtime.kv_dtype), with eviction and the lossless store off: configure them after."""
        from . import native

        config_mod.validate({"runtime": {"kv_dtype": kv_dtype}})
        c = self.config
        self.cache = native.KvCache(c.n_layers, c.n_kv_heads, c.head_dim, c.n_heads,
                                    dtype=kv_dtype, block_tokens=self._block_tokens,
                                    max_tokens=self.max_context, threads=self._threads)
        self.kv_dtype = kv_dtype
        # K and V rows of every layer and kv head: bytes per token written.
        self._token_bytes = 2 * c.n_layers * c.n_kv_heads * native.kv_row_bytes(kv_dtype, c.head_dim)
        self._f16_token_bytes = 2 * c.n_layers * c.n_kv_heads * native.kv_row_bytes("f16", c.head_dim)
        self.eviction: Optional[dict] = None
        self.lossless: Optional[dict] = None
        self.reset()

    def configure_eviction(self, eviction: Optional[dict]) -> None:
        """Turn eviction on (an ``eviction`` config section, missing keys at their defaults) or off
        (None or enabled: false). Starts a fresh context."""
        if eviction is not None and eviction.get("enabled", True):
            eviction = config_mod.validate({"eviction": eviction})["eviction"]
        self._apply_eviction(eviction)

    def _apply_eviction(self, eviction: Optional[dict]) -> None:
        """configure_eviction of a validated section (or None): its values go to the native cache as
        they are (prefill_eviction is the engine's: which end_step calls say prefill), policy
        auto as this model's (token_scorer.default_policy), which ``self.eviction`` then names."""
        self.reset()
        if eviction is None or not eviction.get("enabled", True):
            self.cache.disable_eviction()
            self.eviction = None
            return
        if eviction["policy"] == "auto":
            eviction = dict(eviction, policy=self.policy_of(eviction))
            config_mod.check_prefill_eviction(eviction)
        if eviction["policy"] == "predicted_kvzip":
            from .token_scorer import check_layers, load_for_export

            if self._scorer is None:  # the file is read once; every context's layers are checked
                self._scorer = load_for_export(self.export_dir, self.meta, self.config)
            check_layers(self._scorer, self._evicting_layers(eviction))
        self.cache.enable_eviction(**config_mod.native_args("eviction", eviction))
        self.eviction = eviction

    def policy_of(self, eviction: dict) -> str:
        """The policy an eviction section runs on this model: its eviction.policy, auto resolved
        (token_scorer.default_policy: predicted_kvzip where a scorer ships for the GGUF)."""
        if eviction["policy"] != "auto":
            return eviction["policy"]
        from .token_scorer import default_policy

        return default_policy(self.meta["source_sha256"])

    def _evicting_layers(self, eviction: dict) -> tuple:
        end = eviction["layer_end"]
        return eviction["layer_start"], self.config.n_layers if end < 0 else min(end, self.config.n_layers)

    def _observer(self):
        """What sees each layer's input hidden states in this forward, after the layer's cache step,
        as ``observe(layer, h)``: tools.fit_scorer's hidden_observer, else, with eviction.policy
        predicted_kvzip, the scorer; None for everything else. What it returns (None, or scores
        [n_kv_heads, n]) goes to the cache as the predicted scores of the tokens the step has just
        appended (``_observe``)."""
        if self.hidden_observer is not None:
            return self.hidden_observer
        eviction = self.eviction
        if eviction is None or eviction["policy"] != "predicted_kvzip":
            return None
        scorer, cache = self._scorer, self.cache
        lo, hi = self._evicting_layers(eviction)

        def score(i: int, rows: np.ndarray) -> Optional[np.ndarray]:
            return scorer.scores(i, rows) if lo <= i < hi else None
        return score

    def _observe(self, observe, layer: int, h: np.ndarray) -> None:
        scores = observe(layer, h)
        if scores is not None:
            self.cache.set_token_scores(layer, scores)

    def configure_lossless(self, lossless: Optional[dict]) -> None:
        """Turn the lossless store on (a ``lossless`` config section, missing keys at their
        defaults, whose mode is not off) or off. Starts a fresh context."""
        if lossless is not None and lossless.get("mode", "off") != "off":
            lossless = config_mod.validate({"lossless": lossless,
                                            "runtime": {"block_tokens": self._block_tokens,
                                                        "kv_dtype": self.kv_dtype}})["lossless"]
        self._apply_lossless(lossless)

    def _apply_lossless(self, lossless: Optional[dict]) -> None:
        """configure_lossless of a validated section (or None): its values go to the native
        cache as they are."""
        self.reset()
        if lossless is None or lossless.get("mode", "off") == "off":
            self.cache.disable_store()
            self.lossless = None
            return
        self.cache.enable_store(**config_mod.native_args("lossless", lossless))
        self.lossless = lossless

    def store_stats(self) -> Optional[dict]:
        """The lossless store's counters (None when it is off)."""
        return self.cache.store_stats() if self.lossless is not None else None

    def reset(self) -> None:
        """Forget the context and give the KV memory back."""
        self.cache.reset()
        self.pos = 0
        self.stats = Stats()
        self.unpassed: List[int] = []  # tokens written since the last reconstruction pass
        self.held = False  # a kvzip pass and its eviction left for compress() (prefill's defer_pass)

    def _input_vars(self, n: int):
        """Placeholders for an n-row step, kept per n so decode steps allocate nothing."""
        v = self._inputs.get(n)
        if v is None:
            F, c = self._F, self.config
            v = (F.placeholder([n, c.hidden]), F.placeholder([n, c.hidden]),
                 F.placeholder([n, 1, c.head_dim]), F.placeholder([n, 1, c.head_dim]),
                 np.empty((n, c.hidden), np.float32))
            if n <= 1 or len(self._inputs) < 8:
                self._inputs[n] = v
        return v

    # --- forward -----------------------------------------------------------------------------
    def _layers(self, ids: Sequence[int], pos: int):
        """Run ``ids`` through every layer at positions pos.., caching their K/V; their time goes to
        the counters of ``stats``. Returns the last hidden state and the last attention output as
        MNN's input and as numpy rows (the tail's inputs)."""
        n = len(ids)
        if n == 1 and self._decode_layers is not None:
            return self._decode_token(int(ids[0]), pos)
        if self._prompt_native:
            return self._prompt_rows(ids, pos)
        c = self.config
        mods, cache, perf = self._modules, self.cache, time.perf_counter
        t0 = perf()
        h_in, attn_in, cos_in, sin_in, attn = self._input_vars(n)
        h_in.write(np.asarray(self._embed[np.asarray(ids)], dtype=np.float32))
        cos_in.write(self._cos[pos:pos + n])
        sin_in.write(self._sin[pos:pos + n])
        t_mnn = t_att = t_obs = 0.0
        t1 = perf()
        t_conv = t1 - t0
        h = h_in
        observe = self._observer()
        # One clock reading between consecutive parts: 4 per layer (~0.1 us each).
        for i in range(c.n_layers):
            h, q, k, v = mods[f"layer{i}"].forward([h, cos_in, sin_in] if i == 0 else [h, attn_in, cos_in, sin_in])
            t2 = perf()
            q, k, v = q.read(), k.read(), v.read()
            t3 = perf()
            cache.step(i, q, k, v, attn)
            t4 = perf()
            if observe is not None:  # timed as policy
                self._observe(observe, i, h.read())
                t_obs += perf() - t4
                t4 = perf()
            attn_in.write(attn)
            t5 = perf()
            t_mnn += t2 - t1
            t_conv += (t3 - t2) + (t5 - t4)
            t_att += t4 - t3
            t1 = t5
        st = self.stats
        st.mnn_s += t_mnn
        st.mnn_calls += c.n_layers
        st.convert_s += t_conv
        st.attention_s += t_att
        st.policy_s += t_obs
        return h, attn_in, attn

    def _decode_token(self, token: int, pos: int):
        """``_layers`` for one token through the native decode layers, every layer and its cache
        step in one native call on one team of threads (native/include/mnn_h2o/model/decode_token.h):
        the same returns, with the hidden state as numpy ([1, hidden]) and MNN's attention input None."""
        t0 = time.perf_counter()
        h = np.array(self._embed[token], dtype=np.float32)
        attn = self._input_vars(1)[4]
        dense, att, obs = self._decode_call(self._decode_layers, self.cache, h, self._cos[pos, 0], self._sin[pos, 0],
                                            self._q, self._k, self._v, attn, self._observer())
        st = self.stats
        st.dense_s += dense
        st.attention_s += att
        st.policy_s += obs
        st.convert_s += time.perf_counter() - t0 - dense - att - obs
        return h[None], None, attn

    def _prompt_rows(self, ids: Sequence[int], pos: int):
        """``_layers`` for a prompt chunk through the native layers (runtime.prompt_layers
        native): batched products over the chunk's rows, the same returns as ``_decode_token``."""
        c, layers = self.config, self._decode_layers
        n = len(ids)
        t0 = time.perf_counter()
        h = np.array(self._embed[np.asarray(ids)], dtype=np.float32)
        q = np.empty((n, c.n_heads * c.head_dim), np.float32)
        k, v = (np.empty((n, c.n_kv_heads * c.head_dim), np.float32) for _ in range(2))
        attn = np.empty((n, c.n_heads * c.head_dim), np.float32)
        cos, sin = self._cos[pos:pos + n, 0], self._sin[pos:pos + n, 0]
        self._native_steps(lambda i: layers.forward_rows(i, h, attn if i else None, cos, sin, q, k, v),
                           h, q, k, v, attn, t0)
        return h, None, attn

    def _native_steps(self, layer, h, q, k, v, attn, t0: float) -> None:
        """Every layer's ``layer(i)`` (the native layers' call, writing h, the layer's input
        hidden states, and q, k, v) and its cache step, timed as dense, attention and (since t0,
        the inputs' preparation) convert."""
        cache, perf = self.cache, time.perf_counter
        observe = self._observer()
        t1 = perf()
        t_dense = t_att = t_obs = 0.0
        for i in range(self.config.n_layers):
            layer(i)
            t2 = perf()
            cache.step(i, q, k, v, attn)
            t3 = perf()
            t_dense += t2 - t1
            t_att += t3 - t2
            if observe is not None:  # timed as policy
                self._observe(observe, i, h)
                t4 = perf()
                t_obs += t4 - t3
                t3 = t4
            t1 = t3
        st = self.stats
        st.dense_s += t_dense
        st.attention_s += t_att
        st.policy_s += t_obs
        st.convert_s += t1 - t0 - t_dense - t_att - t_obs

    def _forward(self, ids: Sequence[int], want: Optional[str], prefill: bool,
                 evict: bool = True) -> Optional[np.ndarray]:
        """Run ``ids`` (one chunk) through the model at positions pos.., caching their K/V.
        Returns the logits of the last row (``want="last"``, [1, vocab]), of every row
        (``"all"``, [n, vocab]) or nothing (``None``: a prompt chunk before the last).
        ``evict=False`` (a prompt chunk before the last, with eviction.prefill_eviction end) skips
        ``end_step``: scores keep accumulating and the next chunk's decides."""
        n = len(ids)
        if self.pos + n > self.max_context:
            raise ContextOverflowError(
                f"context overflow: {self.pos} tokens in context + {n} new > limit {self.max_context}")
        h, attn_in, attn = self._layers(ids, self.pos)
        self.unpassed.extend(int(t) for t in ids)
        if evict:
            self._end_step(n, prefill)
        logits = None
        if want is not None:
            logits = self._head(h, attn_in, attn, n, want)
        self.pos += n
        self.refresh_kv_stats()
        return logits

    def _head(self, h, attn_in, attn: np.ndarray, n: int, want: str) -> np.ndarray:
        """The tail (last layer's end, final norm) and lm_head: logits of the last row or of all.
        ``h`` and ``attn_in`` are MNN's, ``attn`` the attention output's numpy rows."""
        st, perf, c = self.stats, time.perf_counter, self.config
        rows = slice(n - 1, n) if want == "last" else slice(0, n)
        t0 = perf()
        if self._layers_head:
            # logits_rows finishes the last layer into its h: a copy
            h_rows = np.array((h if isinstance(h, np.ndarray) else h.read())[rows], np.float32)
            a_rows = np.ascontiguousarray(attn[rows], dtype=np.float32)
            logits = np.empty((len(h_rows), c.vocab), np.float32)
            t1 = perf()
            self._decode_layers.logits_rows(h_rows, a_rows, logits)
            st.convert_s += t1 - t0
            st.head_s += perf() - t1
            return logits
        if isinstance(h, np.ndarray) and self._native_tail is None:  # native decode layers, MNN's tail
            h_in, attn_in, _, _, _ = self._input_vars(n)
            h_in.write(h)
            attn_in.write(attn)
            h = h_in
        if self._native_tail is not None:
            h_rows = (h if isinstance(h, np.ndarray) else h.read())[rows]
            t1 = perf()
            x = self._native_tail(h_rows, attn[rows])
            t2 = perf()
            st.convert_s += t1 - t0
            st.head_s += t2 - t1
        else:
            x = self._modules["tail"].forward([h, attn_in])[0]
            t1 = perf()
            x = x.read()[rows]
            t2 = perf()
            st.mnn_s += t1 - t0
            st.mnn_calls += 1
            st.convert_s += t2 - t1
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self._q8_head is not None:
            t3 = perf()
            logits = self._q8_head.multiply(x)
            st.convert_s += t3 - t2
            st.head_s += perf() - t3
            return logits
        x = self._F.const(x, [len(x), c.hidden])
        t3 = perf()
        out = self._modules["lm_head"].forward([x])[0]
        t4 = perf()
        logits = np.array(out.read(), dtype=np.float32, copy=True)
        st.mnn_s += t4 - t3
        st.mnn_calls += 1
        st.convert_s += (t3 - t2) + (perf() - t4)
        return logits

    def _end_step(self, n: int, prefill: bool) -> None:
        """The cache's end of a forward (eviction when due, the lossless store's new frames), timed
        as policy; a cache with neither on has nothing to do there."""
        if self.eviction is None and self.lossless is None:
            return
        t0 = time.perf_counter()
        if self.cache.end_step(n, prefill):
            self.stats.evictions += 1
        self.stats.policy_s += time.perf_counter() - t0

    def refresh_kv_stats(self) -> None:
        """The byte counters of ``stats`` from the cache as it is now (after every forward, and
        after a cache was restored from a saved session)."""
        st, cache = self.stats, self.cache
        st.kv_bytes_held = held = cache.bytes_held()
        st.kv_bytes_pool = cache.pool_bytes_held()
        st.kv_bytes_kept = cache.kept_bytes()
        st.kv_bytes_peak = max(st.kv_bytes_peak, held)
        st.kv_bytes_uncompressed = self.pos * self._token_bytes
        st.kv_bytes_f16 = self.pos * self._f16_token_bytes

    # --- context reconstruction (eviction.policy kvzip) ----------------------------------------------
    def _repeat_ids(self) -> tuple:
        """The ids of the reconstruction prompts: the first chunk's, a later chunk's (before its
        quote of the previous chunk) and what closes the request, i.e. the chat template's text
        after a user turn (end of turn, assistant header) when the model has one, else a newline
        (kvpress's choice)."""
        if self._repeat is None:
            tok = self.tokenizer
            suffix = "\n"
            if tok.chat_template:
                marker = "\u241e"  # a character no template writes: its end is where the user text ends
                suffix = tok.apply_chat_template(marker).split(marker, 1)[1]
            self._repeat = (tok.encode(REPEAT_FIRST), tok.encode(REPEAT_LATER), tok.encode(suffix))
        return self._repeat

    def _reconstructs(self) -> bool:
        """Whether the context's eviction policy scores with a reconstruction pass (kvzip)."""
        return self.eviction is not None and self.cache.eviction_reconstructs

    def _pass_due(self, reserve: int) -> bool:
        """Whether a prompt's pass runs now. Below eviction.trigger_min_tokens nothing is evicted, so
        the scores would decide nothing yet: the pass waits, and the one that runs once the
        context (with the ``reserve`` decode tokens to come) reaches the trigger repeats every
        token written since the last (a conversation's short turns cost no pass)."""
        return self.pos + reserve >= self.eviction["trigger_min_tokens"]

    def _reconstruct(self, progress=None, cancel: Optional[threading.Event] = None) -> None:
        """KVzip's scoring pass over the tokens written since the last pass: the model is asked to
        repeat them, chunk by chunk, teacher-forced; the evicting layers keep the largest
        probability each held token gets from those queries (eviction.reconstruction_softmax: in a
        softmax over every key, or, chunk, over the sinks, that chunk and the pass, KVzip's
        own scoring). The pass's own tokens are dropped
        after each chunk, so afterwards the cache holds exactly what it held before. ``progress``
        as :meth:`prefill`'s, stage "pass"."""
        ctx = self.unpassed
        bos = self.tokenizer.bos_token_id
        if ctx and self.pos == len(ctx) and ctx[0] == bos:
            ctx = ctx[1:]  # the sequence start is no part of the text to repeat
        self.unpassed = []
        if not ctx:
            return
        first, later, suffix = self._repeat_ids()
        prompt_max = max(len(first), len(later) + RECONSTRUCTION_QUOTE) + len(suffix)
        chunk = min(RECONSTRUCTION_CHUNK, self.max_context - self.pos - prompt_max)
        if chunk < 1:
            raise ContextOverflowError(
                f"the reconstruction pass of eviction.policy kvzip needs {prompt_max + 1} free positions after "
                f"the {self.pos} tokens in context (limit {self.max_context})")
        t0 = time.perf_counter()
        cache, st = self.cache, self.stats
        # (offset of the chunk in ctx, the prompt that repeats it)
        prompts = [(s, (first if s == 0 else later + ctx[max(0, s - RECONSTRUCTION_QUOTE):s]) + suffix + ctx[s:s + chunk])
                   for s in range(0, len(ctx), chunk)]
        total, done = sum(len(ids) for _, ids in prompts), 0
        windowed = self.eviction["reconstruction_softmax"] == "chunk"
        cache.begin_reconstruction()
        try:
            for s, ids in prompts:
                if windowed:  # the chunk's tokens: the last len(ctx) - s rows held, chunk of them
                    cache.set_reconstruction_window(len(ctx) - s, min(chunk, len(ctx) - s))
                for o in range(0, len(ids), self.prefill_chunk):
                    if cancel is not None and cancel.is_set():
                        raise PassCancelled("the reconstruction pass was cancelled")
                    sub = ids[o:o + self.prefill_chunk]
                    self._layers(sub, self.pos + o)
                    st.kv_bytes_peak = max(st.kv_bytes_peak, cache.bytes_held())
                    done += len(sub)
                    if progress is not None:
                        progress("pass", done, total)
                st.reconstruct_tokens += len(ids)
                cache.rewind_reconstruction()
        finally:
            cache.end_reconstruction()
        st.reconstruct_s += time.perf_counter() - t0

    def _check_ids(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.config.vocab):
            raise ValueError(f"token ids must be in [0, {self.config.vocab}), got {ids.min()}..{ids.max()}")
        return ids

    def prefill(self, ids: Sequence[int], all_logits: bool = False, progress=None,
                reserve: int = 0, defer_pass: bool = False) -> np.ndarray:
        """Append ``ids`` to the context in chunks; logits of the last token ([vocab]) or of
        every token ([n, vocab]) with ``all_logits``. ``reserve``: the decode tokens the caller
        means to add after it (a kvzip pass is then run now, not in the middle of that decode,
        when they take the context to eviction.trigger_min_tokens). ``progress``, when given, is
        called as ``progress(stage, done, total)`` after each chunk, in tokens: stage "prompt"
        over ``ids``, then "pass" over the reconstruction pass's tokens when one runs (kvzip past
        the trigger: longer than the prompt, docs/eviction.md "Reconstruction (kvzip)").
        ``defer_pass``: with a reconstructing policy (kvzip) whose pass is due, neither the pass
        nor any eviction runs until :meth:`compress` (a conversation's answer starts from the
        cache as prefilled, docs/sessions.md "Compression after the answer"); other policies
        evict as they go."""
        ids = self._check_ids(ids)
        if ids.size == 0:
            raise ValueError("prefill needs at least one token")
        if self.pos + ids.size > self.max_context:
            raise ContextOverflowError(
                f"prompt of {ids.size} tokens does not fit: {self.pos} already in context, "
                f"limit {self.max_context} (runtime.max_context / the model's context)")
        t0 = time.perf_counter()
        outs = []
        # A reconstructing policy (kvzip) evicts once, after the pass that scores the prompt.
        reconstructs = self._reconstructs()
        end_only = self.eviction is not None and self.eviction["prefill_eviction"] == "end"
        for s in range(0, ids.size, self.prefill_chunk):
            chunk = ids[s:s + self.prefill_chunk]
            last = s + self.prefill_chunk >= ids.size
            out = self._forward(chunk, "all" if all_logits else "last" if last else None, True,
                                evict=not reconstructs and (last or not end_only))
            if out is not None:
                outs.append(out)
            if progress is not None:
                progress("prompt", s + len(chunk), int(ids.size))
        if reconstructs:
            if defer_pass and self._pass_due(reserve):
                self.held = True
            else:
                if self._pass_due(reserve):
                    self._reconstruct(progress)
                self._end_step(int(ids.size), True)
                self.held = False
            self.refresh_kv_stats()
        self.stats.prefill_s += time.perf_counter() - t0
        self.stats.prompt_tokens += int(ids.size)
        return np.concatenate(outs, 0) if all_logits else outs[-1][-1]

    def compress(self, progress=None, cancel: Optional[threading.Event] = None) -> bool:
        """What a prefill with ``defer_pass`` left: the kvzip pass over every token written since
        the last one (the prompt and the answer decoded after it), when the context has reached
        eviction.trigger_min_tokens, then the eviction to the budget. False when nothing was held.
        ``progress`` as :meth:`prefill`'s (stage "pass"). ``cancel.set()`` stops the pass
        between chunks with :class:`PassCancelled`; the cache then holds partial scores and is
        for the caller to reset."""
        if not self.held:
            return False
        t0 = time.perf_counter()
        if self._pass_due(0):
            self._reconstruct(progress, cancel)
        self._end_step(1, True)
        self.held = False
        self.refresh_kv_stats()
        self.stats.compress_s += time.perf_counter() - t0
        return True

    def decode(self, token: int) -> np.ndarray:
        """Append one token; logits [vocab] for the next. While a deferred pass is held
        (:meth:`compress`), nothing is evicted."""
        t0 = time.perf_counter()
        # A deferred pass runs when this token takes the context to the trigger (the cheap
        # position test first: this is the decode loop).
        if self.eviction is not None and self.pos + 1 == self.eviction["trigger_min_tokens"] and self.unpassed \
                and not self.held and self._reconstructs():
            self._reconstruct()
        logits = self._forward(self._check_ids([token]), "last", False, evict=not self.held)[0]
        st = self.stats
        st.decode_s += time.perf_counter() - t0
        st.decode_steps += 1
        st.decode_bytes_held_sum += st.kv_bytes_kept
        st.decode_bytes_uncompressed_sum += st.kv_bytes_uncompressed
        return logits

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced next-token logits [n, vocab] for a fresh context of ``token_ids``."""
        self.reset()
        return self.prefill(token_ids, all_logits=True)

    # --- generation --------------------------------------------------------------------------
    def sample(self, logits: np.ndarray, s: Sampling, rng: np.random.Generator) -> int:
        if s.temperature == 0.0:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / s.temperature
        if s.top_k:
            kth = np.partition(z, -s.top_k)[-s.top_k]
            z = np.where(z < kth, -np.inf, z)
        p = np.exp(z - z.max())
        p /= p.sum()
        if s.top_p < 1.0:
            order = np.argsort(-p)
            cum = np.cumsum(p[order])
            cut = order[cum - p[order] >= s.top_p]  # drop tokens after the nucleus is full
            p[cut] = 0.0
            p /= p.sum()
        return int(rng.choice(p.size, p=p))

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 128,
                 sampling: Optional[Sampling] = None, stop: Iterable[str] = (),
                 stream: Optional[Callable[[str], None]] = None, chat: bool = True,
                 keep_context: bool = False, progress=None) -> Generation:
        """Generate a continuation of ``prompt`` (text, wrapped in the chat template when the
        model has one and ``chat``; or token ids, used as they are). ``progress``: the
        prefill's, see :meth:`prefill`."""
        with self.lock:
            return self._generate(prompt, max_new_tokens, sampling, stop, stream, chat, keep_context, progress)

    def _generate(self, prompt, max_new_tokens, sampling, stop, stream, chat, keep_context, progress) -> Generation:
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        sampling = sampling or Sampling()
        tok = self.tokenizer
        if isinstance(prompt, str):
            text = tok.apply_chat_template(prompt) if chat else prompt
            ids = tok.encode(text)
        else:
            ids = list(prompt)
        if not keep_context:
            self.reset()
        if self.pos + len(ids) + max_new_tokens > self.max_context:
            raise ContextOverflowError(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                f"context limit of {self.max_context - self.pos} tokens")
        logits = self.prefill(ids, reserve=max_new_tokens, progress=progress)
        d = self.sample_tokens(logits, max_new_tokens, sampling, [s for s in stop if s], stream)
        return Generation(d.text, d.token_ids, d.stop_reason, self.stats)

    def sample_tokens(self, logits: np.ndarray, max_new_tokens: int, sampling: Sampling, stops: List[str],
                      on_text: Optional[Callable[[str], None]] = None, cancel=None,
                      feed_last: bool = True) -> "Sampled":
        """The decode loop after a prefill whose last logits are ``logits``: sample, feed, stream
        (never an incomplete UTF-8 sequence or a possible stop-string prefix), until
        ``max_new_tokens``, an end-of-turn token (never fed), a stop string (cut from the text;
        its token is not fed) or ``cancel.is_set()``. The last token of a turn that ran to
        ``max_new_tokens`` is fed only with ``feed_last`` (a conversation's next render writes
        the turn's end instead)."""
        tok = self.tokenizer
        rng = np.random.default_rng(sampling.seed)
        out: List[int] = []
        fed = 0
        emitted, text, reason = "", "", "max_new_tokens"
        for i in range(max_new_tokens):
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            t = self.sample(logits, sampling, rng)
            if t in tok.stop_token_ids:
                reason = "stop_token"
                break
            out.append(t)
            self.stats.generated_tokens += 1
            text = tok.decode(out)
            hit = min((text.find(s) for s in stops if s in text), default=-1)
            if hit >= 0:
                text, reason = text[:hit], "stop_string"
                break
            safe = stream_safe_len(text, stops)
            if on_text and safe > len(emitted):
                on_text(text[len(emitted):safe])
                emitted = text[:safe]
            if i + 1 == max_new_tokens and not feed_last:
                break
            logits = self.decode(t)
            fed += 1
        if on_text and len(text) > len(emitted):
            on_text(text[len(emitted):])
        return Sampled(text, out, fed, reason)


def stream_safe_len(text: str, stops: List[str]) -> int:
    """How much of ``text`` can be streamed: not an incomplete UTF-8 sequence at its end (shown
    as U+FFFD) nor a prefix of a stop string that the next tokens may complete."""
    n = len(text.rstrip("\ufffd"))
    for s in stops:
        for k in range(min(len(s) - 1, n), 0, -1):
            if text[:n].endswith(s[:k]):
                n -= k
                break
    return n
