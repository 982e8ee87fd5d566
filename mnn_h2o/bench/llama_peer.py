"""llama.cpp (through ``llama-cpp-python``) as a peer of ``bench speed``: the same GGUF file, the
same thread count and the very token ids our tokenizer made, timed the same way as our engine.

An optional extra (``pip install '.[llama]'``, which builds llama.cpp from source), never a
runtime dependency: nothing outside ``bench speed --llama`` imports this module's llama_cpp parts.

Configs (``CONFIGS``): f16 KV; f16 KV + flash attention; q8_0 K and V + flash attention (llama.cpp
needs flash attention for a quantised V). KV bytes are the size of the context's KV buffer, which
llama.cpp allocates whole for ``n_ctx`` cells when the context is made (n_ctx = the run's tokens,
rounded up to a multiple of 256 by llama.cpp); we read it from llama.cpp's own log line
``KV buffer size = X MiB`` (``ggml_backend_buffer_get_size``, printed to 0.01 MiB) and check it
against the arithmetic cells x layers x KV heads x head dim x bytes per element (q8_0: 34 bytes per
32 values), which is what is reported. A sliding-window model (Gemma 3) gets llama.cpp's SWA cache
(``swa_full`` off): its window layers hold the window and a ubatch of cells.
"""
from __future__ import annotations

import ctypes
import hashlib
import re
from typing import Dict, List, Optional, Sequence

import numpy as np

PIN = "0.3.36"
INSTALL_HINT = (f"install the optional extra: CMAKE_ARGS=\"-DGGML_NATIVE=ON\" pip install '.[llama]' "
                f"(or pip install llama-cpp-python=={PIN}); it builds llama.cpp from source with cmake, "
                "which takes 15-30 minutes on 2 cores")
# llama.cpp 0.3.36 built with GGML_NATIVE on a Xeon that reports AMX (Sapphire Rapids VM) died with
# SIGSEGV in ggml_backend_amx_mul_mat on its first batch (2026-11-26). Its AMX kernels are compiled
# whenever the compiler targets AMX, and -march=native does (GGML_AMX_* options do not turn them off);
# -mno-amx-* does, and then it runs.
_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
NO_AMX_HINT = ("if the CPU has AMX (lscpu lists amx_tile), rebuild llama.cpp without its AMX kernels: "
               f"CMAKE_ARGS=\"-DGGML_NATIVE=ON -DCMAKE_C_FLAGS='{_NO_AMX}' -DCMAKE_CXX_FLAGS='{_NO_AMX}'\" "
               f"pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python=={PIN}")

# name -> (flash attention, K type, V type); types are ggml type names.
CONFIGS: Dict[str, tuple] = {
    "llama_f16": (False, "f16", "f16"),
    "llama_f16_fa": (True, "f16", "f16"),
    "llama_q8_fa": (True, "q8_0", "q8_0"),
}
# Quality pairs (row, reference), untimed: each config against llama.cpp's own full-precision
# cache (f16, no flash attention), and q8_0 also against f16 with the same flash-attention kernel,
# which isolates what quantising the cache costs from what the other kernel's rounding does.
REFERENCE = "llama_f16"
QUALITY_PAIRS = (("llama_f16_fa", REFERENCE), ("llama_q8_fa", REFERENCE), ("llama_q8_fa", "llama_f16_fa"))
# bytes per value of each KV type: (bytes per block, values per block)
_TYPE_BYTES = {"f16": (2, 1), "q8_0": (34, 32), "q4_0": (18, 32)}


class LlamaUnavailable(ValueError):
    """llama_cpp is missing or does not load; a usage problem (exit 2), with the install hint."""


# What OMP_WAIT_POLICY llama.cpp's libgomp saw when it loaded (it reads it once, then).
omp_wait_policy_at_load: Optional[str] = None


def check():
    """The llama_cpp module, or :class:`LlamaUnavailable` with an install hint.

    llama.cpp's CPU backend synchronises its threads with ``#pragma omp barrier`` (GOMP_barrier) at
    every op of the graph. The bench sets OMP_WAIT_POLICY=passive for MNN and BLAS, which turns each
    of those barriers into a futex sleep and wake-up; so llama_cpp (whose system libgomp reads the
    variable when it loads, apart from the copy MNN's wheel bundles) is imported with the variable
    removed: libgomp's default, spin a while and then sleep, as llama.cpp runs on its own. On an
    oversubscribed machine spinning collapses (0.4 tok/s seen at load 6 on 2 cores):
    MNN_H2O_LLAMA_OMP_WAIT_POLICY=passive (or any policy) sets llama.cpp's own.
    """
    global omp_wait_policy_at_load
    import os
    import sys

    first = "llama_cpp" not in sys.modules
    saved = os.environ.pop("OMP_WAIT_POLICY", None) if first else None
    if first and os.environ.get("MNN_H2O_LLAMA_OMP_WAIT_POLICY"):  # e.g. passive, on a busy machine
        os.environ["OMP_WAIT_POLICY"] = os.environ["MNN_H2O_LLAMA_OMP_WAIT_POLICY"]
    try:
        import llama_cpp
    except ImportError as e:
        raise LlamaUnavailable(f"bench speed --llama needs llama-cpp-python ({e}): {INSTALL_HINT}") from None
    except (OSError, RuntimeError) as e:  # llama_cpp raises RuntimeError when libllama.so does not load
        raise LlamaUnavailable(f"bench speed --llama: llama-cpp-python does not load ({e}): {INSTALL_HINT}") from None
    finally:
        if first:
            omp_wait_policy_at_load = os.environ.get("OMP_WAIT_POLICY") or "unset (libgomp default)"
        if saved is not None:
            os.environ["OMP_WAIT_POLICY"] = saved
    return llama_cpp


# A crash inside llama.cpp would take the whole bench with it, so each config first evaluates a
# few tokens of the GGUF in a child process.
_PREFLIGHT = """
import sys, llama_cpp
gguf, threads = sys.argv[1], int(sys.argv[2])
for fa, tk, tv in %r:
    ggml = lambda t: getattr(llama_cpp, "GGML_TYPE_" + t.upper())
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=64, n_batch=64, n_ubatch=64, n_threads=threads,
                          n_threads_batch=threads, flash_attn=fa, type_k=ggml(tk), type_v=ggml(tv), verbose=False)
    llm.eval([1, 2, 3, 4, 5, 6, 7, 8])
    llm.close()
"""


# (gguf, threads, configs) that evaluated cleanly in this process: preflight runs each once.
_flown: set = set()


def preflight(gguf: str, threads: int, configs: Sequence[tuple] = tuple(CONFIGS.values()),
              timeout_s: float = 300.0) -> None:
    """Evaluate 8 tokens in each config in a child process; :class:`LlamaUnavailable` (with what
    to do) if llama.cpp crashes or fails there. Call :func:`check` first: a missing llama_cpp is
    its install hint, not a failed test run. :func:`make_peers` calls it too; once per process."""
    import signal
    import subprocess
    import sys

    key = (gguf, threads, tuple(configs))
    if key in _flown:
        return
    try:
        r = subprocess.run([sys.executable, "-c", _PREFLIGHT % (list(configs),), gguf, str(threads)],
                           capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise LlamaUnavailable(f"bench speed --llama: llama.cpp did not evaluate 8 tokens of {gguf} "
                               f"within {timeout_s:.0f} s") from None
    if r.returncode < 0:
        sig = signal.Signals(-r.returncode).name
        raise LlamaUnavailable(f"bench speed --llama: llama.cpp crashed ({sig}) evaluating 8 tokens of {gguf}; "
                               f"{NO_AMX_HINT}")
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no message"])[-1]
        raise LlamaUnavailable(f"bench speed --llama: llama.cpp failed on a test run of {gguf}: {last}")
    _flown.add(key)


# --- llama.cpp's log: captured (for the KV buffer size), never printed ----------------------------
_captured: Optional[List[str]] = None
_callback = None  # keep the ctypes callback alive


def _install_log_capture(llama_cpp) -> None:
    global _callback
    if _callback is not None:
        return

    @llama_cpp.llama_log_callback
    def cb(level, text, user_data):
        if _captured is not None and text:
            _captured.append(text.decode("utf-8", "replace"))

    _callback = cb
    llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))


def system_info() -> dict:
    llama_cpp = check()
    return {"llama_cpp_python": getattr(llama_cpp, "__version__", "?"),
            "omp_wait_policy_at_load": omp_wait_policy_at_load,
            "system_info": llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()}


class LlamaPeer:
    """A llama.cpp context with the engine interface ``bench speed`` times: ``reset()``,
    ``prefill(ids) -> logits[vocab]``, ``decode(token) -> logits[vocab]``."""

    def __init__(self, gguf: str, n_ctx: int, threads: int, flash_attn: bool, type_k: str = "f16",
                 type_v: str = "f16", n_batch: int = 512):
        global _captured
        llama_cpp = check()
        _install_log_capture(llama_cpp)
        for t in (type_k, type_v):
            if t not in _TYPE_BYTES:
                raise ValueError(f"unsupported KV type {t!r}: use one of {', '.join(_TYPE_BYTES)}")
        self.flash_attn, self.type_k, self.type_v = flash_attn, type_k, type_v
        ggml = lambda t: getattr(llama_cpp, f"GGML_TYPE_{t.upper()}")
        _captured = []
        try:
            # swa_full False: a sliding-window model (Gemma 3) gets llama.cpp's SWA cache, whose
            # window layers hold their window (llama-cpp-python's default keeps every token there).
            self._llm = llama_cpp.Llama(model_path=gguf, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                                        n_threads=threads, n_threads_batch=threads, flash_attn=flash_attn,
                                        type_k=ggml(type_k), type_v=ggml(type_v), logits_all=False,
                                        swa_full=False, verbose=False)
            log = "".join(_captured)
        finally:
            _captured = None
        self._lib = llama_cpp
        self.threads = threads
        self.n_ctx = int(llama_cpp.llama_n_ctx(self._llm.ctx))
        self.vocab = int(self._llm.n_vocab())
        model = self._llm.model
        self.n_layer = int(llama_cpp.llama_model_n_layer(model))
        n_head = int(llama_cpp.llama_model_n_head(model))
        self.n_head_kv = int(llama_cpp.llama_model_n_head_kv(model))
        meta = self._llm.metadata
        key_length = meta.get(f"{meta.get('general.architecture')}.attention.key_length")
        self.head_dim = int(key_length) if key_length else int(llama_cpp.llama_model_n_embd(model)) // n_head
        self.n_batch = n_batch
        # The sliding-window layers' cells (llama.cpp's SWA cache: the window and a ubatch, padded
        # to 256) and how many layers are such (ours as architecture.py describes them: llama.cpp's
        # pattern for gemma3 is the same, checked by the logged buffer sizes below).
        self.n_swa = int(llama_cpp.llama_model_n_swa(model))
        self.n_layer_swa = 0
        if self.n_swa:
            from ..architecture import is_local
            from ..gguf_model import GgufModel

            cfg = GgufModel(gguf).config
            self.n_layer_swa = sum(is_local(cfg, i) for i in range(cfg.n_layers))
        logged = [float(m) for m in re.findall(r"KV buffer size\s*=\s*([0-9.]+)\s*MiB", log)]
        self.kv_buffer_logged_mib = sum(logged) if logged else None
        self.kv_buffer_bytes = self._kv_bytes_arithmetic()
        if self.kv_buffer_logged_mib is not None and \
                abs(self.kv_buffer_logged_mib - self.kv_buffer_bytes / 2**20) > 0.02:
            raise RuntimeError(f"llama.cpp logged a KV buffer of {self.kv_buffer_logged_mib} MiB, the arithmetic "
                               f"gives {self.kv_buffer_bytes / 2**20:.2f} MiB: the layout assumed here is stale")
        self.pos = 0

    def _kv_bytes_arithmetic(self) -> int:
        per_cell = 0
        for t in (self.type_k, self.type_v):
            block, per = _TYPE_BYTES[t]
            per_cell += self.n_head_kv * self.head_dim // per * block
        swa_cells = min(self.n_ctx, -(-(self.n_swa + self.n_batch) // 256) * 256)
        return (self.n_ctx * (self.n_layer - self.n_layer_swa) + swa_cells * self.n_layer_swa) * per_cell

    def _logits_last(self) -> np.ndarray:
        p = self._lib.llama_get_logits_ith(self._llm.ctx, -1)
        return np.ctypeslib.as_array(p, shape=(self.vocab,)).copy()

    def reset(self) -> None:
        self._llm.reset()  # the next eval removes every cell from position 0 on
        self.pos = 0

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError("prefill needs at least one token")
        if self.pos + len(ids) > self.n_ctx:
            raise ValueError(f"{self.pos} + {len(ids)} tokens exceed llama.cpp's context of {self.n_ctx}")
        self._llm.eval(ids)  # batches of n_batch, logits of the last token only
        self.pos += len(ids)
        return self._logits_last()

    def decode(self, token: int) -> np.ndarray:
        return self.prefill([token])

    def tokens_in(self) -> List[int]:
        """The token ids llama.cpp evaluated in this context, as it recorded them."""
        return [int(t) for t in self._llm.input_ids[:self._llm.n_tokens]]

    @property
    def closed(self) -> bool:
        return self._llm is None

    def close(self) -> None:
        if self._llm is not None:
            self._llm.close()  # frees the context (and its KV buffer) and the model now, not at GC
            self._llm = None


def ids_digest(ids: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(ids, np.int64).tobytes()).hexdigest()


def make_peers(gguf: str, n_ctx: int, threads: int, names: Sequence[str] = tuple(CONFIGS)) -> Dict[str, LlamaPeer]:
    """The named configs' peers, after :func:`preflight` (a llama.cpp that crashes, as one built
    with AMX kernels on a VM without AMX does, is an error with its fix, not a dead process)."""
    check()
    preflight(gguf, threads, [CONFIGS[n] for n in names])
    peers = {}
    for name in names:
        fa, tk, tv = CONFIGS[name]
        peers[name] = LlamaPeer(gguf, n_ctx, threads, fa, tk, tv)
    return peers
