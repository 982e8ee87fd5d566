"""The runtime configuration: one schema, strict validation, YAML in and out.

Every key is declared once in :data:`SCHEMA` with its type, default, unit, allowed values and
meaning; this is the only place a key, a default, a bound or an allowed name is written.
``docs/config.md`` is generated from it (``python -m mnn_h2o.config --markdown``), and so is the
native core's copy of the keys that reach it, ``native/include/mnn_h2o/config_schema.h``
(``python -m mnn_h2o.config --native-header``): per key its default and bounds, and per native
section the X-macro list of its fields, over which ``KvCacheConfig``, ``EvictionConfig`` and
``StoreConfig``, their validation, the C API's structs and copies, the saved-session config bytes
and the pybind11 keyword arguments and dicts iterate. Tests fail when a generated file and the
schema disagree. Unknown keys, wrong types and out-of-range values are errors that name the key
and what is allowed. Importing this module needs no built native module (``mnn_h2o._core``);
``validate`` does: the rules over several native keys are the native core's, asked through it.
"""
from __future__ import annotations

import copy
import re
import sys
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Key:
    section: str
    name: str
    type: type
    default: Any
    unit: str
    meaning: str
    choices: Optional[Sequence[Any]] = None
    range: Optional[Tuple[Optional[float], Optional[float]]] = None  # inclusive bounds
    item: Optional[type] = None  # for type list: the type of every item (choices/range apply per item)
    hi_open: bool = False  # the upper bound itself is excluded

    @property
    def path(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def type_name(self) -> str:
        return f"list of {self.item.__name__}" if self.type is list else self.type.__name__

    def allowed(self) -> str:
        if self.choices is not None:
            return " | ".join(str(c) for c in self.choices)
        if self.range is not None:
            lo, hi = self.range
            text = f"{'-inf' if lo is None else lo} .. {'inf' if hi is None else hi}"
            return text + f" ({hi} excluded)" if self.hi_open else text
        return "any " + self.type_name

    def in_range(self, value) -> bool:
        lo, hi = self.range
        if lo is not None and value < lo:
            return False
        return hi is None or (value < hi if self.hi_open else value <= hi)

    def check(self, value: Any) -> Any:
        if self.type is not list:
            return self._check_one(value, self.type, self.path)
        if not isinstance(value, list) or not value:
            raise ConfigError(f"{self.path}: expected a non-empty list of {self.item.__name__}, got "
                              f"{type(value).__name__} {value!r} (allowed items: {self.allowed()})")
        return [self._check_one(v, self.item, f"{self.path}[{i}]") for i, v in enumerate(value)]

    def _check_one(self, value: Any, t: type, path: str) -> Any:
        if t is float and isinstance(value, int) and not isinstance(value, bool):
            try:
                value = float(value)
            except OverflowError:
                raise ConfigError(f"{path}: {value} is too large for a float (allowed: {self.allowed()})") from None
        if not isinstance(value, t) or (t is int and isinstance(value, bool)):
            # YAML 1.1 reads a bare off/on/no/yes as a boolean.
            hint = " (quote it: YAML reads bare off/on/no/yes as booleans)" if isinstance(value, bool) and t is str else ""
            raise ConfigError(f"{path}: expected {t.__name__}, got {type(value).__name__} "
                              f"{value!r} (allowed: {self.allowed()}){hint}")
        if t is float and value != value:
            raise ConfigError(f"{path}: NaN is not allowed (allowed: {self.allowed()})")
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"{path}: {value!r} is not allowed (allowed: {self.allowed()})")
        if self.range is not None and not self.in_range(value):
            raise ConfigError(f"{path}: {value!r} is out of range (allowed: {self.allowed()})")
        return value


# eviction.target_lossy_ratio when it is the budget (eviction.target_keep_ratio and eviction.kv_budget_bytes
# are 0): a whole-model ratio below this would hold more than every token takes.
LOSSY_RATIO_IN_USE_MIN = 1.0

SCHEMA: Tuple[Key, ...] = (
    Key("model", "name", str, "smollm2", "-",
        "named model (smollm2, qwen2.5-0.5b, qwen2.5-1.5b) or a path to a Llama-family GGUF file"),
    Key("model", "weight_bits", int, -1, "bits", "weight quantisation of MNN's layer modules "
        "(block 32): 8, 4, 0 = float, or -1 = the fewest bits that hold the GGUF's own values "
        "(4 when every layer matrix is Q4_0/Q4_1, else 8). The native layers (runtime.decode_layers, "
        "runtime.prompt_layers native, the defaults) read the GGUF's own blocks whatever it says, "
        "so it matters where MNN's modules run; 0 (float) has no native layers",
        choices=(-1, 0, 4, 8)),
    Key("model", "head_bits", int, -1, "bits", "weight quantisation of the output projection "
        "(lm_head, which is the embedding table in tied models) on its own: 8, 4, 0 = float, or "
        "-1 = as the GGUF stores it (as weight_bits decides; float when weight_bits is 0); the "
        "head is the tensor most sensitive to 4 bits", choices=(-1, 0, 4, 8)),
    Key("runtime", "threads", int, 2, "threads", "threads for MNN and for the attention kernel",
        range=(1, 64)),
    Key("runtime", "memory", str, "low", "-", "MNN memory mode; 'low' runs the quantised "
        "kernels (int8 activations), 'normal' expands weights to float", choices=("low", "normal")),
    Key("runtime", "lm_head", str, "native", "-", "where the output projection runs when the export's "
        "head is 8-bit: native = in our core, a Q8_0 head as its q8_0 rows times the float activation, "
        "a k-quant one on its own blocks (with native decode layers and tail: in a decode token's own "
        "call); mnn = MNN's module, which rounds the activation to int8 under memory low "
        "(docs/results.md 'The native tail and lm_head' has the difference). A 4-bit or float head "
        "always runs in MNN",
        choices=("native", "mnn")),
    Key("runtime", "tail", str, "native", "-", "where the last layer's end (o_proj, MLP) and the "
        "final norm run when the export's layers are quantised: native = in our core, by the native "
        "decode layers as they run every other layer (runtime.decode_layers native), else over the "
        "GGUF's blocks of 32 (exact for q8_0 / q4_0 / q4_1 tensors, others as q8_0) times float "
        "activations; mnn = MNN's module, which rounds the activations to int8 under memory low "
        "(docs/results.md 'The native tail and lm_head'). Float layers always run it in MNN",
        choices=("native", "mnn")),
    Key("runtime", "decode_layers", str, "native", "-", "where a decode token's layers run when the "
        "export is quantised: native = the GGUF's own blocks (q4_0, q4_1, q4_k, q5_k, q6_k, mixed per "
        "matrix as Q4_K_M files are) times activations rounded to int8 (per block of 32: twice for "
        "q4_0 / q4_1; once for the k-quants, their rounding errors taken at the codes' centre), in our "
        "core (docs/results.md 'Native decode layers'; native/include/mnn_h2o/dense/q4_matrix.h); a file with another "
        "type is refused, naming the tensor; mnn = MNN's layer modules. Float layers "
        "(model.weight_bits 0) always decode in MNN. "
        "Prefill (several tokens at once): runtime.prompt_layers",
        choices=("native", "mnn")),
    Key("runtime", "prompt_layers", str, "native", "-", "where a prompt's layers run (several tokens "
        "at once: prefill chunks, the kvzip pass) when the export is quantised: native = the native "
        "decode layers' blocks, each product batched over the chunk (16 weight rows unpacked to "
        "their integers at a time, each activation row rounded to int8 per block of 32, twice for q4_0 / q4_1 rows, once for k-quant ones, "
        "integer dots: AVX-512 VNNI, AVX2, NEON), and MNN's layer modules are then not loaded (one "
        "copy of the weights); it needs runtime.decode_layers native. mnn = MNN's layer modules "
        "(batched int8 kernels on its own re-quantisation). Float layers (model.weight_bits 0) "
        "always run in MNN (docs/results.md 'Prompt layers')",
        choices=("native", "mnn")),
    Key("runtime", "dynamic_quant", int, 2, "-", "MNN's dynamic activation quantisation with "
        "memory low: 0 one scale per tensor, 1 per batch, 2 per block asymmetric (the most accurate "
        "of the three; measured agreement: docs/results.md)",
        choices=(0, 1, 2)),
    Key("runtime", "kv_dtype", str, "q8r", "-", "element type of the cached K and V: f16, bf16, "
        "f32, q8 (int8 + an fp16 scale per 32 values, 68 bytes per row of 64), q4 (4-bit, 36 "
        "bytes per row of 64), q4r / q8r (q4 / q8 of Hadamard-rotated rows, the same bytes; "
        "head_dim a power of two); docs/kv_cache.md 'Row formats'. Every type works "
        "with every lossless.mode",
        choices=("f16", "bf16", "f32", "q8", "q4", "q4r", "q8r")),
    Key("runtime", "block_tokens", int, 16, "tokens", "tokens per KV cache block (the unit of "
        "allocation, eviction and compression); smaller blocks let H2O keep finer-grained heavy "
        "hitters", choices=(16, 32, 64, 128, 256)),
    Key("runtime", "prefill_chunk", int, 256, "tokens", "prompt tokens per prefill step",
        range=(1, 4096)),
    Key("runtime", "max_context", int, 0, "tokens", "context limit; 0 = the model's own",
        range=(0, 1 << 20)),
    Key("eviction", "enabled", bool, True, "-", "evict KV blocks (which ones: eviction.policy) in "
        "layers [layer_start, layer_end)"),
    Key("eviction", "policy", str, "auto", "-", "which blocks to keep (docs/eviction.md 'Policies'): auto "
        "(predicted_kvzip where the package ships a scorer for the model's GGUF, i.e. one whose "
        "dev-split check it passed; kvzip for every other model), h2o "
        "(highest attention EMA), snapkv (attention of the last eviction.observation_window queries), "
        "tova (attention of the latest query), keydiff (keys least like the head's mean key; "
        "query-agnostic), vatp (attention EMA x value norm), expected_attention (expected attention "
        "of a Gaussian of the recent queries), streaming (sink + most recent, StreamingLLM), random "
        "(baseline), kvzip (KVzip: the most attention a block gets while the model repeats the "
        "prompt, a reconstruction pass after each prompt that about doubles the prefill work; "
        "query-agnostic; meant with layer_budget global), predicted_kvzip (kvzip's scores predicted "
        "from each token's hidden state by a per-layer linear map fitted once per model, "
        "python -m mnn_h2o.tools.fit_scorer: no pass; where the map asks for it, with the peaks of "
        "each prompt chunk's last eviction.observation_window queries)",
        # The native registry (eviction_policies.cpp) holds one class per name; a static_assert
        # there and tests/test_config.py check that its names are these but auto (ENGINE_VALUES).
        choices=("auto", "h2o", "snapkv", "tova", "keydiff", "vatp", "expected_attention", "streaming", "random",
                 "kvzip", "predicted_kvzip")),
    Key("eviction", "sink_tokens", int, 64, "tokens", "first tokens never evicted (attention sink)",
        range=(0, 1 << 20)),
    Key("eviction", "recent_tokens", int, 256, "tokens", "last tokens never evicted (recent window; at "
        "least 1, so the newest token always stays)", range=(1, 1 << 20)),
    Key("eviction", "max_floor_share", float, 1.0, "fraction", "the sink and recent floors take at most "
        "this share of a head's budget; beyond it both shrink in proportion (the recent floor keeps "
        "at least the newest block), so a budget smaller than the floors is still met; 0 = never "
        "shrink: a head whose floors exceed its budget is not evicted", range=(0.0, 1.0)),
    Key("eviction", "target_keep_ratio", float, 0.0, "fraction", "static budget: keep this fraction "
        "of the tokens seen in each evicting layer; 0 = use target_lossy_ratio", range=(0.0, 1.0)),
    Key("eviction", "target_lossy_ratio", float, 3.2, "x", "adaptive budget: evicting layers keep what "
        "makes the whole-model ratio (all layers) reach this; with a quantised runtime.kv_dtype "
        "the ratio is against f16 rows and the type pays its part first (32/17 for q8), eviction "
        "the rest; used when target_keep_ratio and kv_budget_bytes are 0, and then at least "
        f"{LOSSY_RATIO_IN_USE_MIN:g}", range=(0.0, 1000.0)),
    Key("eviction", "kv_budget_bytes", int, 0, "bytes", "byte budget: the whole model's K and V blocks (all "
        "layers, in runtime.kv_dtype, so a quantised type fits more tokens) are held to at most this; "
        "the evicting layers share what the others leave; 0 = use the ratio targets. Set at most one of "
        "target_keep_ratio and kv_budget_bytes (either replaces target_lossy_ratio)", range=(0, 1 << 50)),
    Key("eviction", "ema_alpha", float, 0.5, "-", "weight of the previous score in the per-block "
        "exponential moving average", range=(0.0, 1.0), hi_open=True),
    Key("eviction", "layer_start", int, 0, "layer", "first evicting layer (layers before it keep "
        "everything, so the evicting ones are cut harder for the same whole-model ratio)",
        range=(0, 1 << 10)),
    Key("eviction", "layer_end", int, -1, "layer", "one past the last evicting layer; -1 = all layers",
        range=(-1, 1 << 10)),
    Key("eviction", "trigger_min_tokens", int, 3072, "tokens", "a layer is evicted only once it has "
        "seen this many tokens (counting those already evicted, so a head cut below it stays at "
        "its budget): shorter contexts keep every token, where eviction costs the most quality "
        "per byte and the cache is small (docs/results.md 'Short prompts'); 0 = evict at any length",
        range=(0, 1 << 20)),
    Key("eviction", "update_interval", int, 32, "decode tokens", "decode tokens between policy updates "
        "(the same for every layer)", range=(1, 1 << 20)),
    Key("eviction", "prefill_eviction", str, "end", "-", "when a prompt is evicted: chunk = after "
        "every prefill chunk whose heads are over budget (peak memory stays near the budget); end = "
        "once, after the prompt's last chunk, with scores from every prompt query (peak memory holds "
        "the whole prompt)", choices=("chunk", "end")),
    Key("eviction", "per_head_budget", bool, False, "-", "share each layer's budget among its KV heads "
        "by where their attention mass is (KV-Compress) instead of equal per-head budgets"),
    Key("eviction", "seed", int, 0, "-", "seed of the random policy", range=(0, (1 << 31) - 1)),
    Key("eviction", "observation_window", int, 32, "queries", "the window policies' observation window: "
        "snapkv and expected_attention use the attention / statistics of the most recent queries, "
        "at most this many (after a prompt: its last ones, usually the question; in decode: those "
        "since the last update); tova always takes 1; predicted_kvzip, where the model's map asks for "
        "query peaks: the last this many queries of each prompt chunk add their attention peaks to the "
        "predicted scores", range=(1, 1 << 20)),
    Key("eviction", "head_floor_share", float, 0.0, "fraction", "with per_head_budget (AdaKV): each kv head "
        "keeps at least this share of the per-head budget (its floors count towards it) before the "
        "rest of the layer's budget is chosen jointly over its heads; 0 = no minimum beyond the floors",
        range=(0.0, 1.0)),
    Key("eviction", "layer_budget", str, "global", "-", "how the evicting layers share the budget: uniform "
        "(the same keep ratio each), pyramid (PyramidKV: decreasing linearly with depth from 3/2 to 1/2 of "
        "the mean, same whole-model total, flatter where a layer would exceed everything or fall "
        "below its sink + recent floors) or global (KVzip: one budget, the uniform total, for every kv "
        "head of every evicting layer, their blocks ranked together by the policy's scores; the "
        "floors stay per head; per_head_budget is then implied)", choices=("uniform", "pyramid", "global")),
    Key("eviction", "reconstruction_softmax", str, "chunk", "-", "policy kvzip: whom the reconstruction "
        "pass's queries share their probability with when they score the context. chunk = the first 4 "
        "tokens, the chunk being repeated and the pass's own tokens, each chunk scoring its own tokens "
        "only (KVzip's and kvpress's; less work per pass step); all = every key a query sees (the whole "
        "context and the pass so far), every held token scored by every chunk",
        choices=("chunk", "all")),
    Key("eviction", "prompt_end_share", float, -1.0, "fraction", "policies with token scores (kvzip, "
        "predicted_kvzip): this share of each evicting kv head's budget goes first to the tokens the "
        "prompt's last observation_window queries attend to most (SnapKV's choice: what the text goes on "
        "from), the rest by the policy's scores; once per prompt, from its last chunk's attention "
        "(docs/eviction.md 'The prompt's end'); 0 = off; -1 (any negative) = the model's choice: the "
        "share its predicted_kvzip map was chosen with on the dev split, 0 for kvzip and without a map",
        range=(-1.0, 1.0)),
    Key("lossless", "mode", str, "off", "-", "lossless Gear compression of cold KV blocks, in any "
        "runtime.kv_dtype (quantised rows as Gear's Q8 / Q4 frames): off; probe (encode/verify a "
        "sample, KV untouched); full (encode and verify every cold chunk, KV stays raw); store (cold "
        "chunks held only compressed, read through the decode cache)",
        choices=("off", "probe", "full", "store")),
    Key("lossless", "scope", str, "front_n_and_kept", "-", "layers whose cold blocks are "
        "compressed: the first front_n layers, the evicting layers (the tokens eviction keeps), or both",
        choices=("front_n", "kept", "front_n_and_kept")),
    Key("lossless", "front_n", int, 2, "layers", "layers [0, front_n) are in the front_n scope",
        range=(0, 1 << 10)),
    Key("lossless", "hot_sink_tokens", int, 16, "tokens", "first tokens of a head that always stay "
        "raw (read every step)", range=(0, 1 << 20)),
    Key("lossless", "hot_recent_tokens", int, 16, "tokens", "last tokens of a head that always stay "
        "raw (a block still being written stays raw in any case)", range=(0, 1 << 20)),
    Key("lossless", "chunk_tokens", int, 128, "tokens", "tokens per compressed chunk (K and V of one "
        "head in one frame; a multiple of runtime.block_tokens): bigger chunks compress better but "
        "are decoded whole to read any of their tokens", range=(16, 4096)),
    Key("lossless", "v_dedup_layers", int, 1, "layers", "store mode: layers [0, v_dedup_layers) hold "
        "each distinct V row once per kv head and chunks refer to it (layer 0's V depends on the "
        "token id only, so repeated tokens repeat rows exactly); 0 = off", range=(0, 1 << 10)),
    Key("lossless", "async_threads", int, 1, "threads", "worker threads that encode off the decode "
        "path and prefetch; 0 encodes on the calling thread", range=(0, 16)),
    Key("lossless", "max_queue", int, 64, "jobs", "bound of the worker queue; when full, work is "
        "deferred to a later step (never dropped)", range=(1, 1 << 16)),
    Key("lossless", "decode_cache_bytes", int, 0, "bytes", "budget of the cache of decoded chunks "
        "(store mode): memory traded for decode speed", range=(0, 1 << 40)),
    Key("lossless", "prefetch", bool, True, "-", "store mode: workers decode the next layer's chunks "
        "into the decode cache while MNN computes"),
    Key("lossless", "zstd_level", int, 1, "-", "zstd level of the Gear backend", range=(1, 19)),
    Key("lossless", "probe_every", int, 8, "chunks", "probe mode: encode and verify one chunk in "
        "every this many", range=(1, 1 << 20)),
    Key("serve", "kv_budget_bytes", int, 268435456, "bytes", "python -m mnn_h2o.serve: KV memory "
        "of all conversations held in memory together; over it, the least recently used idle "
        "conversation is saved to serve.session_store and freed, and restored on its next request (the "
        "conversation just answered stays in memory even alone over it)", range=(1, 1 << 50)),
    Key("serve", "max_sessions", int, 64, "sessions", "conversations kept in memory, and in a memory or "
        "disk session store; beyond it the least recently used is dropped (its next request prefills its "
        "history again); a Redis store is bounded by Redis (its maxmemory)",
        range=(1, 1 << 16)),
    Key("serve", "session_store", str, "disk:", "-", "where conversations wait that are not in memory "
        "(docs/serve.md 'Several replicas'): memory (this process; nothing outlives it); disk:PATH (files "
        "in PATH, one server at a time; every completed turn is written, so a restart or a crash "
        "continues them; disk: alone = a temporary directory removed when the server stops); "
        "redis://HOST:PORT/DB (a Redis database that several servers share: every completed turn is "
        "written, so any of them continues any conversation)"),
    Key("serve", "max_body_bytes", int, 4194304, "bytes", "largest request body accepted; a larger "
        "one is refused with HTTP 400", range=(1024, 1 << 30)),
    Key("serve", "max_tokens_limit", int, 2048, "tokens", "largest max_tokens a request may ask "
        "(a larger one is refused with HTTP 400); a chat request without max_tokens generates up to "
        "this or to the end of the context, whichever comes first", range=(1, 1 << 20)),
    Key("bench", "prompt_lengths", list, [512, 1024, 4096], "tokens", "runtime cases: prompt lengths "
        "of essay text", range=(16, 1 << 20), item=int),
    Key("bench", "decode_tokens", int, 128, "tokens", "runtime cases: teacher-forced decode tokens "
        "after each prompt", range=(1, 1 << 16)),
    Key("bench", "repetitions", int, 3, "runs", "interleaved repetitions of every runtime case "
        "(A B A B); medians and spread", range=(3, 100)),
    Key("bench", "cases", list, ["baseline", "evict", "probe", "full", "store", "q8", "q8_evict"], "-",
        "runtime cases: baseline = full cache (no eviction, no compression); evict = eviction "
        "(the eviction section's policy) alone, lossless off; probe/full/store = eviction plus that lossless "
        "mode; q8 = full cache of int8 K/V rows; q8_evict = eviction over int8 rows",
        choices=("baseline", "evict", "probe", "full", "store", "q8", "q8_evict"), item=str),
    Key("bench", "demo_cases", list, ["full", "store"], "-", "demo cases: eviction alone (evict) or plus "
        "that lossless mode, generating from real prompts (baseline runs too, as reference)",
        choices=("evict", "probe", "full", "store"), item=str),
    Key("bench", "demo_buckets", list, [128, 512, 2048, 4096], "tokens", "demo prompt lengths",
        range=(16, 1 << 20), item=int),
    Key("bench", "demo_new_tokens", int, 64, "tokens", "demo: tokens generated per prompt",
        range=(1, 1 << 16)),
    Key("bench", "output_dir", str, "bench_runs", "-", "where run folders are written"),
    # Targets: reported met or missed; they fail a round only under --strict.
    Key("gates", "min_lossy_ratio", float, 3.0, "x", "target: evicting cases at the longest prompt: "
        "whole-model bytes an uncompressed cache would hold / bytes held by the block pool", range=(0.0, None)),
    Key("gates", "min_lossless_ratio", float, 1.2, "x", "target: store case at the longest prompt: raw / "
        "compressed bytes of the chunks in scope", range=(0.0, None)),
    Key("gates", "min_top1_agreement", float, 0.9, "fraction", "target: every candidate case and prompt "
        "length: teacher-forced top-1 agreement with the baseline", range=(0.0, 1.0)),
    Key("gates", "speed_cases", list, ["evict", "probe"], "-", "target: cases whose decode tokens/s must not "
        "fall below the baseline's beyond the measured noise, at every prompt length",
        choices=("evict", "probe", "full", "store", "q8", "q8_evict"), item=str),
    Key("gates", "max_store_slowdown", float, 3.0, "x", "target: store case: baseline decode tokens/s / "
        "store decode tokens/s at every prompt length may not exceed this (inconclusive beyond "
        "max_speed_noise, like the speed gates)", range=(1.0, None)),
    # Both kinds.
    Key("gates", "max_speed_noise", float, 0.1, "fraction", "speed gates: a case's decode speed relative "
        "to the baseline is measured on steps interleaved token by token with the baseline's; its noise is "
        "the relative half-width of that ratio's 95-percent interval (from blocks of 16 steps). The allowance "
        "is the noise; a noise above this makes the gate inconclusive (exit status 3), never a pass",
        range=(0.0, 1.0)),
    # Regression guards against the reference round: they fail a round (exit status 1).
    Key("gates", "speed_tolerance", float, 0.1, "fraction", "regression guards: a case's decode speed "
        "relative to the baseline may be this much below the reference round's, beyond the noise of the "
        "two, before the round fails; what a busy machine shifts in such a ratio (the cases differ in how "
        "much of a step is memory-bound) though both sides of it saw the same load", range=(0.0, 1.0)),
    Key("gates", "guard_tolerance", float, 0.05, "fraction", "regression guards: KV bytes held, lossy "
        "and lossless ratios and the divergence from the baseline (kl) may be this much worse than the reference round's (relative) "
        "before the round fails; the figures are deterministic on one machine, so this is what "
        "another CPU's kernels may change", range=(0.0, 1.0)),
    Key("gates", "guard_kl_slack", float, 0.0005, "nats", "regression guards: absolute allowance on the divergence "
        "(kl), added to guard_tolerance's (a small divergence moves by more than a fraction "
        "across CPUs)",
        range=(0.0, None)),
    Key("gates", "guard_top1_drop", float, 0.02, "fraction", "regression guards: top-1 agreement may "
        "fall this far (absolute) below the reference round's", range=(0.0, 1.0)),
)

_BY_PATH = {k.path: k for k in SCHEMA}
SECTIONS = tuple(dict.fromkeys(k.section for k in SCHEMA))


def key(path: str) -> Key:
    """The schema entry of ``section.name`` (its choices are the one list of allowed values)."""
    return _BY_PATH[path]


def defaults() -> Dict[str, Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {s: {} for s in SECTIONS}
    for k in SCHEMA:
        out[k.section][k.name] = copy.deepcopy(k.default)
    return out


def validate(raw: Any, base: Any = None, notify: bool = True) -> Dict[str, Dict[str, Any]]:
    """Merge ``raw`` (a nested mapping, e.g. parsed YAML) over ``base`` over the defaults. ``base``
    (e.g. a config from an earlier ``validate``) is checked exactly as ``raw`` is, so
    ``validate(None, cfg)`` is how to check a config of unknown origin. Old names
    (:data:`RENAMED_SECTIONS`, :data:`RENAMED_VALUES`) are read as their new ones; ``notify``:
    say so on stderr, once per name and process."""
    cfg = defaults()
    for layer in (base, raw):
        _merge(cfg, layer, notify)
    _check_together(cfg)
    return cfg


# Names a config may still use from before they were renamed: read as the new ones, each reported
# once per process by ``validate`` (a saved session reads its own old names without a word).
RENAMED_SECTIONS = {"h2o": "eviction"}
RENAMED_VALUES = {
    "lossless.scope": {"h2o_kept": "kept", "front_n_and_h2o_kept": "front_n_and_kept"},
    "bench.cases": {"h2o": "evict", "q8_h2o": "q8_evict"},
    "bench.demo_cases": {"h2o": "evict"},
    "gates.speed_cases": {"h2o": "evict", "q8_h2o": "q8_evict"},
}
# Keys that became a value of another key: the old key's value X reads as the new key's prefix + X.
RENAMED_KEYS = {"serve.session_dir": ("serve.session_store", "disk:")}
_reported = set()


def renamed() -> Dict[str, str]:
    """Every old name a config may use, with its new one (old key path or key=value: new)."""
    out = {f"{old}.{k.name}": k.path for old, new in RENAMED_SECTIONS.items() for k in SCHEMA if k.section == new}
    for path, values in RENAMED_VALUES.items():
        out.update({f"{path}={old}": f"{path}={new}" for old, new in values.items()})
    out.update({f"{old}=X": f"{new}={prefix}X" for old, (new, prefix) in RENAMED_KEYS.items()})
    return out


def _report(old: str, new: str, notify: bool) -> None:
    if notify and old not in _reported:
        _reported.add(old)
        print(f"config: {old} is now {new} (the old name still works)", file=sys.stderr)


def _new_value(path: str, value: Any, notify: bool) -> Any:
    """``value`` of key ``path`` with a renamed value (or list item) replaced by its new name."""
    names = RENAMED_VALUES.get(path)
    if not names:
        return value

    def one(v):
        if isinstance(v, str) and v in names:
            _report(f"{path}={v}", f"{path}={names[v]}", notify)
            return names[v]
        return v
    return [one(v) for v in value] if isinstance(value, list) else one(value)


def _merge(cfg: Dict[str, Dict[str, Any]], raw: Any, notify: bool = True) -> None:
    """Check every key of ``raw`` and write it into ``cfg``."""
    if raw is None:
        return
    if not isinstance(raw, dict):
        raise ConfigError(f"config must be a mapping of sections ({', '.join(SECTIONS)}), "
                          f"got {type(raw).__name__}")
    for old, new in RENAMED_SECTIONS.items():
        if old in raw and new in raw:
            raise ConfigError(f"sections {old} and {new} are both given: {old} is the old name of {new}; "
                              f"keep {new} alone")
    for section, values in raw.items():
        if section in RENAMED_SECTIONS:
            new = RENAMED_SECTIONS[section]
            for name in (values or {}) if isinstance(values, dict) else ():
                _report(f"{section}.{name}", f"{new}.{name}", notify)
            section = new
        if section not in SECTIONS:
            raise ConfigError(f"unknown section {section!r} (allowed: {', '.join(SECTIONS)})")
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"{section}: expected a mapping of keys, got {type(values).__name__}")
        for name, value in values.items():
            path = f"{section}.{name}"
            if path in RENAMED_KEYS:
                new_path, prefix = RENAMED_KEYS[path]
                if not isinstance(value, str):
                    raise ConfigError(f"{path}: expected a str, got {type(value).__name__} {value!r}")
                _report(f"{path}={value}", f"{new_path}={prefix}{value}", notify)
                path, value = new_path, prefix + value
            key = _BY_PATH.get(path)
            if key is None:
                known = ", ".join(k.name for k in SCHEMA if k.section == section)
                raise ConfigError(f"unknown key {section}.{name!s} (keys of {section}: {known})")
            cfg[key.section][key.name] = key.check(_new_value(key.path, value, notify))


# The sections whose keys reach the native core: runtime's through the KvCache constructor (the
# C API's mnn_h2o_kv_config, KvCacheConfig), eviction's through KvCache.enable_eviction (EvictionConfig),
# lossless's through enable_store (StoreConfig); each under its own name but those of NATIVE_NAMES.
# ENGINE_KEYS stay with the engine (or MNN, which the engine configures).
NATIVE_SECTIONS = ("runtime", "eviction", "lossless")
ENGINE_KEYS = ("runtime.memory", "runtime.dynamic_quant", "runtime.lm_head", "runtime.tail",
               "runtime.decode_layers", "runtime.prompt_layers", "runtime.prefill_chunk", "runtime.max_context", "eviction.enabled", "eviction.prefill_eviction",
               "eviction.reconstruction_softmax", "eviction.prompt_end_share")
NATIVE_NAMES = {"runtime.kv_dtype": "dtype"}
# Values of native keys that the engine resolves per model before the core sees them, each with
# what it means to the core alone (the C API, which knows no model): the native header's choices
# and default leave them out, validation asks the core about their meaning.
ENGINE_VALUES = {"eviction.policy": {"auto": "kvzip"}}
# Native keys whose C++ field is an enum of the core's, matched to the key's choices by name (each
# enum's table of names, e.g. kv_dtype.h); the C API holds the enum's value as an int32.
NATIVE_ENUMS = {"runtime.kv_dtype": "KvDtype", "lossless.mode": "StoreMode", "lossless.scope": "StoreScope"}


def native_keys(section: str) -> Tuple[Key, ...]:
    """The keys of ``section`` that the native core takes (the keyword arguments of the
    ``KvCache`` constructor for runtime, ``KvCache.enable_eviction`` for eviction, ``enable_store`` for
    lossless)."""
    return tuple(k for k in SCHEMA if k.section == section and k.path not in ENGINE_KEYS)


def core_value(k: Key, value: Any) -> Any:
    """``value`` of key ``k`` as the core alone takes it (ENGINE_VALUES mapped, others as they are)."""
    return ENGINE_VALUES.get(k.path, {}).get(value, value)


def native_args(section: str, values: Dict[str, Any]) -> Dict[str, Any]:
    """The native keyword arguments of a validated section: its values, those of ENGINE_VALUES
    as the core alone would take them."""
    return {NATIVE_NAMES.get(k.path, k.name): core_value(k, values[k.name]) for k in native_keys(section)}


def native_choices(k: Key) -> Sequence[Any]:
    """The values of a native key that the core itself takes (its choices but ENGINE_VALUES)."""
    return tuple(c for c in k.choices if c not in ENGINE_VALUES.get(k.path, {}))


def check_prefill_eviction(eviction: Dict[str, Any]) -> None:
    """ConfigError when an eviction section's policy cannot evict in prompt chunks as it asks."""
    if eviction["enabled"] and eviction["policy"] == "kvzip" and eviction["prefill_eviction"] == "chunk":
        raise ConfigError("eviction.prefill_eviction chunk cannot be used with eviction.policy kvzip: its scores come "
                          "from a reconstruction pass over the whole prompt, so the prompt is evicted once, "
                          "after it (prefill_eviction end)")


QUANTISED_KV = ("q8", "q4", "q4r", "q8r")
INT8_KV = ("q8", "q8r")  # the quantised types of int8 codes (tests/test_config.py checks both against the core)


def _check_together(cfg) -> None:
    """Rules that involve more than one key. Those among the native keys are the native core's
    validation (eviction_config.cpp, store_config.cpp), asked through the binding so that each is
    written once; its messages start with the field they name. The engine's own rule is here."""
    h = cfg["eviction"]
    check_prefill_eviction(h)  # for auto, once the engine knows which policy it is
    from . import _core  # here, not at the top: importing this module needs no built native module

    ll = cfg["lossless"]
    for section, error, others in (
            ("eviction", _core.eviction_config_error(**native_args("eviction", h)), {}),
            ("lossless", _core.store_config_error(block_tokens=cfg["runtime"]["block_tokens"],
                                                  **native_args("lossless", ll)),
             {"block_tokens": "runtime.block_tokens"})):
        if error:
            raise ConfigError(_with_paths(error, section, others))


def _with_paths(message: str, section: str, others: Dict[str, str]) -> str:
    """A native validation message (which names fields as the binding's arguments) with each field
    written as its config path; quoted values stay as they are."""
    paths = {NATIVE_NAMES.get(k.path, k.name): k.path for k in native_keys(section)}
    paths.update(others)
    return re.sub(r"'[^']*'|\w+", lambda m: paths.get(m.group(), m.group()), message)


def load(path: Optional[str] = None, overrides: Optional[Dict[str, Any]] = None):
    """Defaults, then the YAML file, then ``{"section.key": value}`` overrides."""
    import yaml

    cfg = defaults()
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                raw = yaml.safe_load(f)
        except OSError as e:
            raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path} is not UTF-8 text: {e.reason} at byte {e.start}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path} is not valid YAML: {e}") from None
        except RecursionError:
            raise ConfigError(f"{path} is nested too deeply to be a config") from None
        cfg = validate(raw, cfg)
    if overrides:
        # All at once: a set of overrides is checked as a whole against the cross-key rules.
        raw: Dict[str, Dict[str, Any]] = {}
        for dotted, value in overrides.items():
            section, _, name = dotted.partition(".")
            raw.setdefault(section, {})[name] = value
        cfg = validate(raw, cfg)
    return cfg


def parse_assignment(text: str) -> Tuple[str, Any]:
    """``section.key=value`` from a command line; the value is read as YAML (so 3, 2.5, true,
    [512, 4096] and "off" mean what they do in a config file)."""
    import yaml

    path, sep, value = text.partition("=")
    if not sep or "." not in path:
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    try:
        return path.strip(), yaml.safe_load(value)
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {path}: the value is not valid YAML: {e}") from None


def markdown() -> str:
    lines = ["# Configuration keys", "",
             "Generated from `mnn_h2o/config.py` by `python -m mnn_h2o.config --markdown`; "
             "a test fails when this file and the code disagree.", "",
             "| key | type | default | unit | allowed | meaning |",
             "|---|---|---|---|---|---|"]
    for k in SCHEMA:
        # A bare '|' inside a cell would end it: the choices are written 'a \| b'.
        cells = [f"`{k.path}`", k.type_name, f"`{k.default}`", k.unit, k.allowed(), k.meaning]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", "## Renamed", "",
              "Old names still read as the new ones; the first use of each in a process says so on "
              "stderr (`python -m mnn_h2o.config --check FILE` shows them for a config file).", "",
              "| old | new |", "|---|---|"]
    lines += [f"| `{old}` | `{new}` |" for old, new in renamed().items()]
    return "\n".join(lines) + "\n"


def _cpp_text(x: Any) -> str:
    return '"' + str(x).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _cpp_value(k: Key, x: Any) -> str:
    if k.type is bool:
        return "true" if x else "false"
    if k.type is str:
        return _cpp_text(x)
    return repr(float(x)) if k.type is float else str(int(x))


def _native_types(k: Key) -> Tuple[str, str]:
    """The C and the C++ type of a native key's field: an int is 32 bits when its allowed values
    fit, else 64."""
    if k.path in NATIVE_ENUMS:
        return "int32_t", "mnn_h2o::" + NATIVE_ENUMS[k.path]
    if k.type is bool:
        return "int32_t", "bool"
    if k.type is float:
        return "double", "double"
    if k.type is str:
        return "const char*", "std::string"
    values = k.choices if k.choices is not None else k.range
    return ("int32_t", "int") if all(-(1 << 31) <= v < (1 << 31) for v in values) else ("int64_t", "int64_t")


def _native_key(k: Key) -> list:
    """One key's struct in the native header: a comment line and a line of members, so that the
    keys read as a table."""
    t = {bool: "bool", int: "int64_t", float: "double", str: "const char*"}[k.type]
    members = [f"static constexpr const char* kName = {_cpp_text(k.name)};",
               f"static constexpr {t} kDefault = {_cpp_value(k, core_value(k, k.default))};"]
    if k.choices is not None:
        choices = native_choices(k)
        members += ["static constexpr Check kCheck = Check::kChoices;",
                    f"static constexpr {t} kChoices[] = {{{', '.join(_cpp_value(k, c) for c in choices)}}};",
                    f"static constexpr int kChoiceCount = {len(choices)};",
                    f"static constexpr const char* kAllowed = {_cpp_text('one of ' + ', '.join(repr(c) for c in choices))};"]
    elif k.type in (int, float):
        if k.range is None or None in k.range:
            raise ValueError(f"{k.path}: a native number needs choices or both bounds")
        lo, hi = k.range
        show = (lambda x: f"{x:g}") if k.type is float else str
        allowed = f"in [{show(lo)}, {show(hi)}{')' if k.hi_open else ']'}"
        members += ["static constexpr Check kCheck = Check::kBounds;",
                    f"static constexpr {t} kLo = {_cpp_value(k, lo)};",
                    f"static constexpr {t} kHi = {_cpp_value(k, hi)};",
                    f"static constexpr bool kHiOpen = {'true' if k.hi_open else 'false'};",
                    f"static constexpr const char* kAllowed = {_cpp_text(allowed)};"]
    else:
        members.append("static constexpr Check kCheck = Check::kNone;")
    comment = f"// {k.path}: {k.type_name}, {k.unit}"
    if k.path == "eviction.target_lossy_ratio":
        members.append(f"static constexpr double kInUseMin = {_cpp_value(k, LOSSY_RATIO_IN_USE_MIN)};")
        comment += "; kInUseMin: its least value when it is the budget"
    return [comment, f"struct {k.name} {{ " + " ".join(members) + " };"]


def _native_fields(section: str) -> list:
    """The X-macro of a native section's fields: X(field, key, CType, CppType) per key."""
    rows = []
    for k in native_keys(section):
        c_type, cpp_type = _native_types(k)
        rows.append(f"    X({NATIVE_NAMES.get(k.path, k.name)}, {k.name}, {c_type}, {cpp_type})")
    return [f"#define MNN_H2O_{section.upper()}_FIELDS(X) \\"] + [r + " \\" for r in rows[:-1]] + [rows[-1], ""]


NATIVE_HEADER = "native/include/mnn_h2o/config_schema.h"


def native_header() -> str:
    """``native/include/mnn_h2o/config_schema.h``: the field lists of the native config structs
    (plain C, for the C API's header too), then each native key's default and bounds (C++)."""
    out = ["// Generated from mnn_h2o/config.py by `python -m mnn_h2o.config --native-header`: do not edit.",
           "// The config keys that reach the native core (docs/config.md): the fields of the native",
           "// config structs, and each key's default and allowed values, so KvCacheConfig, EvictionConfig,",
           "// StoreConfig, their validation, the C API, the saved-session config bytes and the Python",
           "// binding follow the schema; tests/test_config.py fails when this file and the schema disagree.",
           "#pragma once", "",
           "// The fields of each native config struct, one X(field, key, CType, CppType) per config key",
           "// in the schema's order: field is the member and the Python keyword argument, key the",
           "// key's struct in namespace schema::<section> below, CType the field's type in the C API's",
           "// structs, CppType in the C++ ones (config_field.h: what each type means). Plain C.", ""]
    for section in NATIVE_SECTIONS:
        out += _native_fields(section)
    out += ["#ifdef __cplusplus", "", "#include <cstdint>", "#include <string_view>", "#include <type_traits>", "",
            "namespace mnn_h2o {", "namespace schema {", "",
            "// How a key's values are checked: against kChoices, against [kLo, kHi], or not at all (a bool).",
            "enum class Check { kNone, kChoices, kBounds };", ""]
    for section in NATIVE_SECTIONS:
        out.append(f"namespace {section} {{")
        for k in native_keys(section):
            out += _native_key(k)
        out += [f"}}  // namespace {section}", ""]
    out += ["// x is within K's bounds (NaN is not): K::kLo <= x <= K::kHi, or x < K::kHi when K::kHiOpen.",
            "template <class K, class T>",
            "constexpr bool in_bounds(T x) {",
            "    const double v = static_cast<double>(x);",
            "    return v >= static_cast<double>(K::kLo) &&",
            "           (K::kHiOpen ? v < static_cast<double>(K::kHi) : v <= static_cast<double>(K::kHi));",
            "}", "",
            "// The index of x in K::kChoices (names or numbers), or -1.",
            "template <class K>",
            "constexpr int choice_index(",
            "    std::conditional_t<std::is_arithmetic_v<decltype(K::kDefault)>, int64_t, std::string_view> x) {",
            "    for (int i = 0; i < K::kChoiceCount; ++i)",
            "        if (x == K::kChoices[i]) return i;",
            "    return -1;",
            "}", "",
            "}  // namespace schema", "}  // namespace mnn_h2o", "", "#endif  // __cplusplus"]
    return "\n".join(out) + "\n"


_USAGE = """usage: python -m mnn_h2o.config --check FILE | --renamed | --markdown | --native-header
  --check FILE     validate a YAML config (old names reported with their new ones); exit 1 if invalid
  --renamed        every old key or value still read, with its new name
  --markdown       docs/config.md
  --native-header  native/include/mnn_h2o/config_schema.h"""

if __name__ == "__main__":
    if sys.argv[1:] == ["--markdown"]:
        sys.stdout.write(markdown())
    elif sys.argv[1:] == ["--native-header"]:
        sys.stdout.write(native_header())
    elif sys.argv[1:] == ["--renamed"]:
        for old, new in renamed().items():
            print(f"{old} -> {new}")
    elif len(sys.argv) == 3 and sys.argv[1] == "--check":
        try:
            load(sys.argv[2])
        except ConfigError as e:
            print(f"{sys.argv[2]}: {e}", file=sys.stderr)
            sys.exit(1)
        print(f"{sys.argv[2]}: valid")
    else:
        print(_USAGE, file=sys.stderr)
        sys.exit(2)
