"""The decoding engine: the native core runs the layers' dense math (or MNN's modules do), caches
K/V and attends. Which of those runs each part is chosen once at load (mnn_h2o/forward_paths.py);
the context reconstruction pass of eviction.policy kvzip is mnn_h2o/reconstruction.py.

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
from typing import Callable, Iterable, List, Optional, Sequence

import numpy as np

from . import config as config_mod
from . import reconstruction
from .architecture import ARCHITECTURES, is_local
from .errors import ContextOverflowError, ModelFileError
from .export import ensure_exported
from .forward_paths import (Inputs, LayerRows, LayersHead, MnnHead, MnnLayers, MnnTail, NativePromptLayers,
                            NativeTailRows, NativeTokenLayers, Q8Head, TailThenHead)
from .mnn_runtime import import_mnn
from .gguf_model import ModelConfig
from .speed_counters import SpeedCounters
from .tokenizer import Tokenizer


class _RowsOnDisk:
    """The rows of a 2-D .npy file, read row by row (os.pread) when asked for. A prompt reads a
    few embedding rows scattered over the table; through a memory map each one faulted in its
    neighbours too (the kernel maps up to 64 KiB around a fault from the page cache, madvise or
    not), and the 1.5B's 467 MB table held 155 MB of RSS after one 2048-token prompt for its
    ~1500 distinct 3 KiB rows. Read this way the process holds only what it asked for."""

    def __init__(self, path: str):
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(f)
            self._offset = f.tell()
            size = os.fstat(f.fileno()).st_size
        if len(shape) != 2 or fortran or dtype.hasobject:
            raise ModelFileError(f"{path}: expected a C-ordered 2-D array of numbers, not {dtype} {shape}")
        self.shape, self.dtype = shape, dtype
        self._row_bytes = shape[1] * dtype.itemsize
        if self._offset + shape[0] * self._row_bytes > size:
            raise ModelFileError(f"{path}: truncated ({size} bytes for an array of {shape})")
        self._path = path
        self._fd = os.open(path, os.O_RDONLY)

    def rows(self, ids) -> np.ndarray:
        """float32 [len(ids), cols]."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.shape[0]):
            raise IndexError(f"{self._path}: a row id outside 0..{self.shape[0] - 1}")
        out = np.empty((ids.size, self.shape[1]), dtype=self.dtype)
        for i, r in enumerate(ids):
            out[i] = np.frombuffer(os.pread(self._fd, self._row_bytes, self._offset + int(r) * self._row_bytes),
                                   dtype=self.dtype)
        return out.astype(np.float32)

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
            self._fd = None


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

_HINT_DYNAMIC_QUANT_OPTIONS = 5  # MNN::Interpreter::HintMode; MNN.llm's "dynamic_option"


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
    lossless store), the position of the next token, the counters, and what a kvzip pass has yet
    to repeat. ``Llm.ctx`` is the current one, and the Llm's attributes of the same names
    (``llm.cache``, ``llm.pos``, ``llm.stats``, ...) are its fields; ``Llm.new_context`` makes
    another and ``Llm.using`` runs the model against it (mnn_h2o/session.py)."""
    __slots__ = ("cache", "kv_dtype", "eviction", "lossless", "pos", "stats", "layer_token_bytes",
                 "layer_f16_token_bytes", "unpassed", "held")


class _ContextField:
    """An Llm attribute that is a field of its current context (``Llm.ctx``)."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, llm, owner=None):
        return self if llm is None else getattr(llm.ctx, self.name)

    def __set__(self, llm, value):
        setattr(llm.ctx, self.name, value)


def chunk_starts(n: int, chunk: int, last_at_least: int = 1) -> List[int]:
    """Where a prompt of n tokens is cut into chunks of ``chunk`` tokens; the last chunk holds at
    least ``last_at_least`` of them (eviction.prompt_end_share scores with that chunk's last
    queries), taken from the chunk before it."""
    starts = list(range(0, n, chunk))
    if len(starts) > 1 and n - starts[-1] < last_at_least:
        starts[-1] = max(starts[-2] + 1, n - last_at_least)
    return starts


class Llm:
    """A loaded model: MNN modules, tokenizer, and a current context (native KV cache).

    Threads: ``lock`` (re-entrant) serialises uses of one Llm. ``generate``, ``using`` and
    ``new_context`` hold it; a thread calling ``prefill``/``decode`` directly on an Llm shared with
    other threads holds it around everything that must not interleave."""

    # The current context's fields (KvContext), read and written through ``self.ctx``.
    cache = _ContextField()
    kv_dtype = _ContextField()
    eviction = _ContextField()
    lossless = _ContextField()
    pos = _ContextField()
    stats = _ContextField()
    unpassed = _ContextField()
    held = _ContextField()

    def __init__(self, export_dir: str, cfg: Optional[dict] = None):
        cfg = config_mod.validate(None, cfg) if cfg is not None else config_mod.defaults()
        self.cfg = cfg
        self.lock = threading.RLock()
        self.ctx = KvContext()
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
        self._decode_layers = self._q8_head = None
        if layers_file:
            from .native_layers import holds_head_matrix, load_decode_layers

            path = os.path.join(export_dir, layers_file)
            # A Q8_0 output matrix is the export's q8 rows: the layers hold them as their head
            # (on their own threads: the matrix gets none), shared with the embedding's rows.
            if q8 and rt["tail"] == "native" and not holds_head_matrix(path):
                self._q8_head = self._q8_rows(q8, threads=1)
            self._decode_layers = load_decode_layers(path, c, rt["threads"], self._q8_head)
        # Where the decode layers hold the output matrix, they run the tail and the head of every
        # row, a decode token's in its own call: no tail module, no head of the runtime's own.
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
        if q8:
            self._q8_head = self._q8_rows(q8, threads=rt["threads"])
        if meta["embedding"]:
            embedding_rows = _RowsOnDisk(os.path.join(export_dir, meta["embedding"])).rows
        else:  # a tied Q8_0 embedding: the head's own rows (export.py), loaded for them if MNN's head runs
            head_rows = (self._q8_head or self._q8_rows(meta["lm_head_q8"], threads=1)).rows_of
            # Rounded to f16 as the export's copy of them was: the values every result and bench
            # reference round was measured with (exact rows moved the quick round's q8_evict KL
            # from 0.0028 to 0.0043: another choice of evicted tokens on one 64-token segment).
            embedding_rows = lambda ids: head_rows(ids).astype(np.float16).astype(np.float32)  # noqa: E731
        self._inputs = Inputs(self._F, c, embedding_rows)
        self._choose_paths()

        self._repeat: Optional[tuple] = None  # the reconstruction prompts' ids, made on first use
        self._block_tokens = rt["block_tokens"]
        form = ARCHITECTURES[c.arch]
        self._layer_windows = tuple(c.sliding_window if is_local(c, i) else 0 for i in range(c.n_layers)) \
            if form.global_every else ()
        self._threads = rt["threads"]
        self._scorer = None  # eviction.policy predicted_kvzip's map, read on first use (mnn_h2o/token_scorer.py)
        self._native_scorer = None  # (its evicting layers, the core's copy of it)
        # A callable (layer, h rows) given every layer's input hidden states ([n, hidden]) as they
        # are computed, instead of the scorer: tools.fit_scorer collects its data through it.
        self.hidden_observer = None
        self.configure_kv_dtype(rt["kv_dtype"])
        self._apply_eviction(cfg["eviction"])  # validated above
        self._apply_lossless(cfg["lossless"])

    def _q8_rows(self, q8: dict, threads: int):
        """The export's q8 rows (codes and scales .npy) as a native Q8Matrix, read from the files
        straight into it (stored_arrays.py): never held twice, not even as mapped pages."""
        from . import native
        from .stored_arrays import stored_npy

        codes = stored_npy(os.path.join(self.export_dir, q8["codes"]), np.int8)
        scales = stored_npy(os.path.join(self.export_dir, q8["scales"]), np.float16)
        return native.Q8Matrix(codes, scales, threads=threads)

    def _choose_paths(self) -> None:
        """The forward's paths (mnn_h2o/forward_paths.py), from the parts this runtime loaded:
        the layers of a decode token and of a prompt chunk, and the head."""
        inputs, layers = self._inputs, self._decode_layers
        mnn = None if self._prompt_native else MnnLayers(self._modules, inputs)
        self._token_path = NativeTokenLayers(layers, inputs, self._layers_head) if layers is not None else mnn
        self._prompt_path = NativePromptLayers(layers, inputs) if self._prompt_native else mnn
        if self._layers_head:
            self._head_path = LayersHead(layers, self.config.vocab)
        else:
            tail = (NativeTailRows(self._native_tail) if self._native_tail is not None
                    else MnnTail(self._modules["tail"], inputs))
            head = (Q8Head(self._q8_head) if self._q8_head is not None
                    else MnnHead(self._modules["lm_head"], self._F, self.config.hidden))
            self._head_path = TailThenHead(tail, head)

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
    def layer_windows(self) -> List[int]:
        """Per layer, its sliding window in tokens (0: a global layer); empty when every layer is
        global (mnn_h2o/architecture.py, the file's attention.sliding_window)."""
        return list(self._layer_windows)

    def _tokens_uncompressed(self) -> int:
        """Token rows an uncompressed cache of this model holds at ``pos``, summed over the layers:
        every token in a global layer, its window in a sliding-window one."""
        if not self._layer_windows:
            return self.pos * self.config.n_layers
        return sum(min(self.pos, w) if w else self.pos for w in self._layer_windows)

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
        made = KvContext()
        with self.using(made):
            self.configure_kv_dtype(cfg["runtime"]["kv_dtype"])
            self.configure_eviction(cfg["eviction"])
            self.configure_lossless(cfg["lossless"])
        return made

    @contextmanager
    def using(self, ctx: KvContext):
        """Within the with-block the Llm runs against ``ctx`` (prefill, decode, generate with
        keep_context=True, reset, configure_*), holding the lock; its own context is back after."""
        with self.lock:
            saved, self.ctx = self.ctx, ctx
            try:
                yield self
            finally:
                self.ctx = saved

    def configure_kv_dtype(self, kv_dtype: str) -> None:
        """A new, empty cache whose K and V rows are of element type ``kv_dtype`` (see the key
        runtime.kv_dtype), with eviction and the lossless store off: configure them after."""
        from . import native

        config_mod.validate({"runtime": {"kv_dtype": kv_dtype}})
        c = self.config
        self.cache = native.KvCache(c.n_layers, c.n_kv_heads, c.head_dim, c.n_heads,
                                    dtype=kv_dtype, block_tokens=self._block_tokens,
                                    max_tokens=self.max_context, threads=self._threads,
                                    windows=self.layer_windows)
        self.kv_dtype = kv_dtype
        # K and V rows of one layer's kv heads: bytes per token written to a layer.
        self.ctx.layer_token_bytes = 2 * c.n_kv_heads * native.kv_row_bytes(kv_dtype, c.head_dim)
        self.ctx.layer_f16_token_bytes = 2 * c.n_kv_heads * native.kv_row_bytes("f16", c.head_dim)
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
        if eviction["prompt_end_share"] < 0:  # the model's choice, as its map says (token_scorer.py)
            mapped = eviction["policy"] == "predicted_kvzip"
            eviction = dict(eviction, prompt_end_share=self._scorer.prompt_end_share if mapped else 0.0)
        self.cache.enable_eviction(**config_mod.native_args("eviction", eviction))
        if eviction["policy"] == "predicted_kvzip":
            self.cache.set_query_peaks(self._scorer.query_peaks)  # the model's map says (token_scorer.py)
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
        appended (forward_paths.observe_into)."""
        if self.hidden_observer is not None:
            return self.hidden_observer
        eviction = self.eviction
        if eviction is None or eviction["policy"] != "predicted_kvzip":
            return None
        from . import native
        layers = self._evicting_layers(eviction)
        if self._native_scorer is None or self._native_scorer[0] != layers:
            # The core's copy of the map (TokenScorer.scores is its reference): decode_token applies
            # it at every layer without calling back into Python.
            self._native_scorer = (layers, native.TokenScorer(self._scorer.weights, *layers))
        return self._native_scorer[1]

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

    # --- forward -----------------------------------------------------------------------------
    def _layers(self, ids: Sequence[int], pos: int, logits: bool = False) -> LayerRows:
        """Run ``ids`` through every layer at positions pos.., caching their K/V in the current
        context, on the path chosen at load for a decode token or a prompt chunk; their time goes
        to the context's counters. ``logits``: a decode token's are wanted (its native call then
        computes them too, where the layers hold the head: LayerRows.logits)."""
        if len(ids) == 1:
            return self._token_path.run(ids, pos, self.cache, self.stats, self._observer(), logits)
        return self._prompt_path.run(ids, pos, self.cache, self.stats, self._observer())

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
        rows = self._layers(ids, self.pos, want is not None)
        self.unpassed.extend(int(t) for t in ids)
        if evict:
            self._end_step(n, prefill)
        logits = None
        if want is not None:
            # The tail (the last layer's end, final norm) and lm_head of the last row or of all.
            logits = self._head_path.logits(rows, slice(n - 1, n) if want == "last" else slice(0, n), self.stats)
        self.pos += n
        self.refresh_kv_stats()
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
        tokens = self._tokens_uncompressed()
        st.kv_bytes_uncompressed = tokens * self.ctx.layer_token_bytes
        st.kv_bytes_f16 = tokens * self.ctx.layer_f16_token_bytes

    # --- context reconstruction (eviction.policy kvzip: mnn_h2o/reconstruction.py) -------------
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
        """KVzip's scoring pass (reconstruction.run_pass) over the tokens written since the last
        pass. ``progress`` as :meth:`prefill`'s, stage "pass"."""
        ctx = self.unpassed
        bos = self.tokenizer.bos_token_id
        if ctx and self.pos == len(ctx) and ctx[0] == bos:
            ctx = ctx[1:]  # the sequence start is no part of the text to repeat
        self.unpassed = []
        if not ctx:
            return
        if self._repeat is None:
            self._repeat = reconstruction.repeat_ids(self.tokenizer)
        reconstruction.run_pass(ctx, self._repeat, self._layers, self.cache, self.stats, self.pos,
                                self.max_context, self.prefill_chunk,
                                self.eviction["reconstruction_softmax"] == "chunk", progress, cancel)

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
        end_share = self._prompt_end_share()
        starts = chunk_starts(int(ids.size), self.prefill_chunk, self.eviction["observation_window"] if end_share else 1)
        for s, e in zip(starts, starts[1:] + [int(ids.size)]):
            chunk = ids[s:e]
            last = e == ids.size
            if last and end_share:
                self.cache.set_prompt_end_share(end_share, int(ids.size))
            try:
                out = self._forward(chunk, "all" if all_logits else "last" if last else None, True,
                                    evict=not reconstructs and (last or not end_only))
            finally:
                if last and end_share:
                    self.cache.set_prompt_end_share(0.0, 0)
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

    def _prompt_end_share(self) -> float:
        """eviction.prompt_end_share where it applies: a policy with token scores (kvzip,
        predicted_kvzip), evicting; else 0."""
        if self.eviction is None or not (self.cache.eviction_reconstructs or self.cache.eviction_predicts):
            return 0.0
        return float(self.eviction["prompt_end_share"])

    def compress(self, progress=None, cancel: Optional[threading.Event] = None) -> bool:
        """What a prefill with ``defer_pass`` left: the kvzip pass over every token written since
        the last one (the prompt and the answer decoded after it), when the context has reached
        eviction.trigger_min_tokens, then the eviction to the budget. False when nothing was held.
        ``progress`` as :meth:`prefill`'s (stage "pass"). ``cancel.set()`` stops the pass
        between chunks with :class:`reconstruction.PassCancelled`; the cache then holds partial scores and is
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
        if not keep_context:
            self.reset()
        if isinstance(prompt, str):
            text = tok.apply_chat_template(prompt) if chat else prompt
            ids = (tok.sequence_start() if self.pos == 0 else []) + tok.encode(text)
        else:
            ids = list(prompt)
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
