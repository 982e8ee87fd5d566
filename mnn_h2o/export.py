"""Export a Llama-family GGUF model for the engine: the files the native core reads, and MNN's
per-layer modules when a runtime asks for them.

Always written: the embedding table as an fp16 ``.npy`` read through a memory map; with quantised
layers every layer's matrices as the GGUF stores them (``decode_layers.npz``: blocks of any type
in the core's table, native/include/mnn_h2o/dense/weight_types.h, any mix) for the native decode
and prompt layers (``runtime.decode_layers``, ``runtime.prompt_layers``; a file with another type
gets none, and the export says which tensor: ``no_decode_layers``), the tail's weights as the
GGUF's blocks of 32 (``tail_blocks.npz``) for the native tail (``runtime.tail``), and an 8-bit
head also as llama.cpp q8_0 rows (``lm_head_q8_*.npy``: int8 codes, fp16 scales per 32) for the
native head (``runtime.lm_head``), which multiplies them with the float activation.

MNN's modules (``ensure_modules``: built the first time a runtime loads one, or by ``--modules``;
always for float layers) cut the model at the attention op, which our native core runs. Module
``layer{i}`` takes the residual stream ``h`` and the attention output of layer i-1, finishes layer
i-1 (o_proj, residual, RMSNorm, SwiGLU MLP, residual) and starts layer i (RMSNorm, Q/K/V
projections, RoPE), returning ``h, q, k, v``. Module ``tail`` finishes the last layer and applies
the final norm; ``lm_head`` maps normed hidden states to logits (separate so a prefill computes
logits for one row only).

Weights are quantised by MNN's converter (``-f MNN --optimizeLevel 2 --weightQuantBits N
--weightQuantBlock 32``); block 32 is the GGUF Q4_1/Q8_0 block and reproduces their weights
exactly (block 128 does not divide 576-wide rows and silently falls back to per-channel int4).

    python -m mnn_h2o.export --model smollm2 [--weight-bits -1|8|4|0] [--head-bits -1|8|4|0] [--modules] [--out DIR]
    python -m mnn_h2o.export --gguf PATH.gguf
    python -m mnn_h2o.export --stock          # the stock MNN.llm baseline of the same weights
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Iterator

import numpy as np

from .cli_errors import run
from .decoder_layer import BASIC, check_form, finish_layer, start_layer
from .errors import ModelFileError
from .gguf_model import GgufModel, ModelConfig, file_digest, layer_vectors
from .mnn_runtime import import_mnn, redirect_fds
from . import q8_0
from .model_source import MODELS, cache_root, gguf_file, resolve_gguf

# Bump when the exported graphs or files change meaning: old caches are then re-exported.
# 7: the decode layers' file holds the final norm whatever the head (a Q8_0 head's rows are
#    lm_head_q8, which the layers multiply: one native call a decode token)
EXPORT_VERSION = 7
WEIGHT_BITS = (0, 4, 8)  # 0 = float weights (exactness checks), 4/8 = int4/int8 block 32
QUANT_BLOCK = 32


# --- graph building ---------------------------------------------------------------------------
class _ModuleOps:
    """decoder_layer's ops for the engine's modules: [n, width] rows in and out, as the native
    cache takes q/k/v; RoPE tables are inputs of the module (cos/sin [n, 1, head_dim])."""

    def __init__(self, F, cfg: ModelConfig, cos=None, sin=None):
        self.F, self.eps, self.head_dim, self.cos, self.sin = F, cfg.rms_eps, cfg.head_dim, cos, sin

    def linear(self, x, w, b=None):
        F = self.F
        y = F.matmul(x, F.const(np.ascontiguousarray(w, np.float32), list(w.shape)), False, True)
        if b is not None:
            y = y + F.const(b.astype(np.float32), list(b.shape))
        return y

    def rms_norm(self, x, w):
        F = self.F
        ms = F.reduce_mean(x * x, [-1], True)
        return x * F.rsqrt(ms + F.const(np.array([self.eps], np.float32), [1])) * F.const(w.astype(np.float32), list(w.shape))

    def rope(self, x, n_heads):
        F, hd = self.F, self.head_dim
        x = F.reshape(x, [-1, n_heads, hd])
        x1, x2 = F.split(x, [hd // 2, hd // 2], -1)
        rot = F.concat([F.negative(x2), x1], -1)
        return F.reshape(x * self.cos + rot * self.sin, [-1, n_heads * hd])

    def heads(self, x, n_heads):
        return x

    def silu(self, x):
        return x * self.F.sigmoid(x)


def build_layer(F, cfg: ModelConfig, prev_w, w):
    """Graph of module layer{i}: finish layer i-1 (``prev_w``, None for layer 0), start layer i."""
    H, hd = cfg.hidden, cfg.head_dim
    h = F.placeholder([-1, H]); h.name = "h"
    cos = F.placeholder([-1, 1, hd]); cos.name = "cos"
    sin = F.placeholder([-1, 1, hd]); sin.name = "sin"
    ops = _ModuleOps(F, cfg, cos, sin)
    if prev_w is not None:
        attn = F.placeholder([-1, H]); attn.name = "attn"
        h = finish_layer(ops, cfg, prev_w, h, attn)
    q, k, v = start_layer(ops, cfg, w, h)
    h_out = F.clone(h, True) if prev_w is None else h  # layer 0 passes h through unchanged
    outs = [h_out, q, k, v]
    for var, name in zip(outs, ("h_out", "q", "k", "v")):
        var.name = name
    return outs


def build_tail(F, cfg: ModelConfig, last_w, out_norm):
    ops = _ModuleOps(F, cfg)
    h = F.placeholder([-1, cfg.hidden]); h.name = "h"
    attn = F.placeholder([-1, cfg.hidden]); attn.name = "attn"
    y = ops.rms_norm(finish_layer(ops, cfg, last_w, h, attn), out_norm)
    y.name = "x"
    return [y]


# finish_layer's weights -> their GGUF tensors, for the native tail; and its vectors (those a
# model's layer has: GgufModel.layer)
TAIL_MATRICES = {"wo": "attn_output", "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down"}
TAIL_VECTORS = ("ffn_norm", "post_attn_norm", "post_ffn_norm")


def tail_arrays(g: GgufModel, last_w: dict) -> dict:
    """The native tail's arrays (mnn_h2o/native_tail.py) from ``g`` and its last layer's weights
    ``last_w`` (GgufModel.layer): per matrix of the layer's end its blocks of 32 as
    ``<name>.codes`` (int8), ``<name>.scales`` and ``<name>.mins`` (fp16; value = code * scale +
    min), then the norms of the layer's end (``ffn_norm``; Gemma's ``post_attn_norm`` and
    ``post_ffn_norm``) and ``out_norm`` in float32. Q8_0 / Q4_0 / Q4_1 / Q5_0 tensors are stored as
    the GGUF holds them, exactly; other types as q8_0 (mins 0)."""
    last, w = g.config.n_layers - 1, last_w
    out = {name: np.asarray(w[name], np.float32) for name in TAIL_VECTORS if name in w}
    out["out_norm"] = np.asarray(g.output_norm(), np.float32)
    for name, tensor in TAIL_MATRICES.items():
        blocks = g.blocks(f"blk.{last}.{tensor}.weight")
        if blocks is None:
            codes, scales = q8_0.quantize(w[name])
            blocks = codes, scales, np.zeros_like(scales)
        out[name + ".codes"], out[name + ".scales"], out[name + ".mins"] = blocks
    return out


# The decode layers' matrices (mnn_h2o/native_layers.py) -> their GGUF tensors; qkv is the three
# attention inputs' rows stacked (q, k, v), Q and K un-permuted as GgufModel.layer does.
DECODE_MATRICES = {"qkv": ("attn_q", "attn_k", "attn_v"), "wo": ("attn_output",), "gate": ("ffn_gate",),
                   "up": ("ffn_up",), "down": ("ffn_down",)}


def _core_types() -> list:
    """The GGUF weight types the native core reads (its traits table), by name."""
    from . import native

    return [w["name"] for w in native.weight_types()]


def decode_layers_refusal(g: GgufModel) -> str | None:
    """Why the native decode layers cannot run ``g`` (an option of its architecture they do not
    implement, or a tensor of a type they do not read, named), or None."""
    from . import native
    from .architecture import missing

    c = g.config
    lacks = missing(c, native.decode_layer_options())
    if lacks:
        return f"the native decode layers do not implement {', '.join(lacks)} (architecture {c.arch})"
    runs = _core_types()
    for i in range(c.n_layers):
        for tensors in DECODE_MATRICES.values():
            for t in tensors:
                name = f"blk.{i}.{t}.weight"
                kind = g.tensors[name].tensor_type.name
                if kind not in runs:
                    return f"{name} is {kind}; the native decode layers run {', '.join(runs)}"
    return None


def decode_layer_entries(g: GgufModel) -> Iterator[tuple[str, np.ndarray]]:
    """The native decode layers' arrays, one at a time (check decode_layers_refusal first). Per
    layer i, ``{i}.attn_norm``, ``{i}.ffn_norm`` (and ``{i}.qkv_bias``) in float32; per matrix
    ``{i}.<name>.types`` (the GGUF type name of each part) and ``{i}.<name>.<j>`` (part j's blocks
    as the GGUF stores them, GgufModel.weight_blocks: uint8 [rows, row bytes]), and the vectors
    of gguf_model.LAYER_VECTORS its form has (q_norm, ...); ``out_norm`` (the final norm), and
    where the output matrix is a type the layers hold but Q8_0, ``head.types`` / ``head.0``."""
    c = g.config
    vectors = layer_vectors(c)
    heads = {"attn_q": c.n_heads, "attn_k": c.n_kv_heads}
    for i in range(c.n_layers):
        for name, tensors in DECODE_MATRICES.items():
            parts = [g.weight_blocks(f"blk.{i}.{t}.weight", heads.get(t)) for t in tensors]
            yield f"{i}.{name}.types", np.array([kind for kind, _ in parts])
            for j, (_, blocks) in enumerate(parts):
                yield f"{i}.{name}.{j}", blocks
        for name, (tensor, _) in vectors.items():
            yield f"{i}.{name}", np.asarray(g.tensor(f"blk.{i}.{tensor}.weight"), np.float32)
        if c.qkv_bias:
            yield f"{i}.qkv_bias", np.concatenate(g.qkv_biases(i)).astype(np.float32)
    # The output end too. A Q8_0 output matrix is the export's q8 rows (lm_head_q8), which the
    # layers multiply with the float activation (DecodeLayers::set_head): at the head the
    # activation's rounding reaches the logits directly (docs/results.md, "The native tail and
    # lm_head"); the other types' blocks have no such kernel.
    yield "out_norm", np.asarray(g.output_norm(), np.float32)
    head = "token_embd.weight" if c.tied_embeddings else "output.weight"
    kind = g.tensors[head].tensor_type.name
    if kind in _core_types() and kind != "Q8_0":
        kind, blocks = g.weight_blocks(head)
        yield "head.types", np.array([kind])
        yield "head.0", blocks


def decode_layer_arrays(g: GgufModel) -> tuple[dict | None, str | None]:
    """The native decode layers' arrays (decode_layer_entries) as one dict and None, or None and
    why not (decode_layers_refusal)."""
    why = decode_layers_refusal(g)
    return (None, why) if why else (dict(decode_layer_entries(g)), None)


class NpzWriter:
    """An .npz (what np.savez writes: a zip of .npy members) written one array at a time, so
    that the export never holds every layer's blocks at once."""

    def __init__(self, path: str):
        import zipfile

        self._zip = zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True)

    def add(self, name: str, array: np.ndarray) -> None:
        with self._zip.open(name + ".npy", "w", force_zip64=True) as f:
            np.lib.format.write_array(f, np.asanyarray(array), allow_pickle=False)

    def __enter__(self) -> "NpzWriter":
        return self

    def __exit__(self, *exc) -> None:
        self._zip.close()


# Output rows per slice where a vocabulary-sized matrix is converted: the embedding and the head
# are the largest arrays of an export (151936 x 1536 on the 1.5B), written slice by slice into
# the memory-mapped file instead of held whole in float32.
_ROWS_PER_SLICE = 8192


def save_f16_rows(g: GgufModel, name: str, path: str) -> None:
    """Tensor ``name`` of ``g`` as a float16 .npy at ``path``."""
    rows, cols = (int(x) for x in reversed(g.tensors[name].shape))
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(rows, cols))
    for r in range(0, rows, _ROWS_PER_SLICE):
        out[r:r + _ROWS_PER_SLICE] = g.tensor_rows(name, r, min(rows, r + _ROWS_PER_SLICE))
    out.flush()
    del out


def save_q8_rows(g: GgufModel, name: str, codes_path: str, scales_path: str) -> None:
    """Tensor ``name`` of ``g`` as q8_0 codes (int8 .npy) and scales (float16 .npy, one per 32)."""
    rows, cols = (int(x) for x in reversed(g.tensors[name].shape))
    codes = np.lib.format.open_memmap(codes_path, mode="w+", dtype=np.int8, shape=(rows, cols))
    scales = np.lib.format.open_memmap(scales_path, mode="w+", dtype=np.float16, shape=(rows, cols // q8_0.BLOCK))
    for r in range(0, rows, _ROWS_PER_SLICE):
        codes[r:r + _ROWS_PER_SLICE], scales[r:r + _ROWS_PER_SLICE] = q8_0.quantize(
            g.tensor_rows(name, r, min(rows, r + _ROWS_PER_SLICE)))
    codes.flush()
    scales.flush()
    del codes, scales


def build_lm_head(F, cfg: ModelConfig, w):
    x = F.placeholder([-1, cfg.hidden]); x.name = "x"
    y = _ModuleOps(F, cfg).linear(x, w)
    y.name = "logits"
    return [y]


# Module name -> (input names, output names); the engine loads them from model.json.
def module_io(cfg: ModelConfig):
    io = {"layer0": (["h", "cos", "sin"], ["h_out", "q", "k", "v"])}
    for i in range(1, cfg.n_layers):
        io[f"layer{i}"] = (["h", "attn", "cos", "sin"], ["h_out", "q", "k", "v"])
    io["tail"] = (["h", "attn"], ["x"])
    io["lm_head"] = (["x"], ["logits"])
    return io


def _convert(src: str, dst: str, bits: int) -> None:
    args = ["mnnconvert", "-f", "MNN", "--modelFile", src, "--MNNModel", dst]
    if bits:
        args += ["--optimizeLevel", "2", "--weightQuantBits", str(bits),
                 "--weightQuantBlock", str(QUANT_BLOCK)]
    import_mnn()
    import _tools  # MNN's converter; never `import MNN.tools` (it pip-installs and phones home)

    with redirect_fds():
        _tools.mnnconvert(args)
    if not os.path.isfile(dst) or os.path.getsize(dst) == 0:
        raise RuntimeError(f"MNN converter produced no output for {src}")


def export_dir_for(gguf_path: str, weight_bits: int, sha: str | None = None,
                   head_bits: int | None = None) -> str:
    sha = sha or file_digest(gguf_path)
    stem = os.path.splitext(os.path.basename(gguf_path))[0]
    bits = f"w{weight_bits}" if head_bits in (None, -1, weight_bits) else f"w{weight_bits}h{head_bits}"
    return os.path.join(cache_root(), "exports", f"{stem}-{sha[:12]}-{bits}-v{EXPORT_VERSION}")


def resolve_bits(g: GgufModel, weight_bits: int, head_bits: int | None) -> tuple[int, int]:
    """The export bits of (layers, lm_head). -1 = as the GGUF stores them (GgufModel.stored_bits:
    4 for Q4_0/Q4_1 blocks, else 8), the head float when the layers are; head None = as the layers."""
    for name, bits in (("weight_bits", weight_bits), ("head_bits", head_bits)):
        if bits is not None and bits not in WEIGHT_BITS + (-1,):
            raise ValueError(f"{name} must be one of {WEIGHT_BITS} or -1 (as stored), got {bits!r}")
    stored = g.stored_bits() if -1 in (weight_bits, head_bits) else (8, 8)
    wb = stored[0] if weight_bits == -1 else weight_bits
    if head_bits is None:
        return wb, wb
    return wb, (stored[1] if wb else 0) if head_bits == -1 else head_bits


# What the check of a cached export needs of its GGUF (the digest that keys the export folder and
# the bits the file stores), remembered per file under its identity (path, size, mtime, inode): a
# run whose export is cached then opens no GGUF. Reading the metadata and hashing the bytes took
# 2.7 s of every start for SmolLM2 and 10 s for Qwen2.5-Coder-1.5B, against 0.3 s and 1.7 s to load
# the export. A file rewritten in place changes its size or mtime, and is read again.
SOURCES_FILE = "sources.json"


class KnownSource:
    """A GGUF's facts as remembered: its sha256 and ``stored_bits()`` (as GgufModel's)."""

    def __init__(self, sha256: str, stored: tuple[int, int]):
        self.sha256, self._stored = sha256, tuple(stored)

    def stored_bits(self) -> tuple[int, int]:
        return self._stored


def _identity(path: str) -> tuple[str, dict]:
    st = os.stat(path)
    return os.path.realpath(path), {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def _sources() -> dict:
    try:
        with open(os.path.join(cache_root(), SOURCES_FILE)) as f:
            known = json.load(f)
        return known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        return {}


def known_source(path: str) -> KnownSource | None:
    """The remembered facts of the GGUF at ``path``, or None (never seen, or changed since)."""
    key, ident = _identity(path)
    entry = _sources().get(key)
    try:
        if entry and all(entry.get(k) == v for k, v in ident.items()):
            return KnownSource(str(entry["sha256"]), tuple(int(b) for b in entry["stored_bits"]))
    except (KeyError, TypeError, ValueError):
        pass
    return None


def remember_source(path: str, sha256: str, stored: tuple[int, int]) -> None:
    """Remember a GGUF's facts (best effort: a cache that cannot be written is read again next time)."""
    key, ident = _identity(path)
    known = _sources()
    known[key] = dict(ident, sha256=sha256, stored_bits=list(stored))
    root = cache_root()
    try:
        os.makedirs(root, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".sources-", dir=root)
        with os.fdopen(fd, "w") as f:
            json.dump(known, f, indent=1)
        os.replace(tmp, os.path.join(root, SOURCES_FILE))  # readers see the old file or the new one
    except OSError:
        pass


def _cached_export(out_dir: str, sha: str, weight_bits: int, head_bits: int) -> bool:
    """Whether out_dir holds a complete export (this export version, every file it names) of the
    source with this digest at these bits."""
    try:
        with open(os.path.join(out_dir, "model.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return False
    return (meta.get("export_version") == EXPORT_VERSION and meta.get("source_sha256") == sha
            and meta.get("weight_bits") == weight_bits and meta.get("head_bits", weight_bits) == head_bits
            and all(os.path.isfile(os.path.join(out_dir, m["file"])) for m in meta["modules"].values()))


def export(gguf_path: str, out_dir: str | None = None, weight_bits: int = 8,
           progress: bool = True, force: bool = False, head_bits: int | None = None,
           modules: bool = False) -> str:
    """Export (or re-use a cached export of) ``gguf_path``; returns the export directory.
    ``weight_bits`` / ``head_bits``: the layers' and the lm_head module's bits (see resolve_bits).
    MNN's modules are built with ``modules`` True, or where the layers are float (no native
    layers to run them), else later by ensure_modules when a runtime first loads one: the default
    runtime (native layers, tail and head) uses none, and on a 1.5B they are most of the export's
    minutes and 1.6 GB of its disk."""
    from tqdm import tqdm

    known = None if force else known_source(gguf_path)
    if known is not None:
        wb, hb = resolve_bits(known, weight_bits, head_bits)
        cached = out_dir or export_dir_for(gguf_path, wb, known.sha256, hb)
        if _cached_export(cached, known.sha256, wb, hb):
            if modules or not wb:
                ensure_modules(cached, progress)
            return cached
    g = GgufModel(gguf_path)
    weight_bits, head_bits = resolve_bits(g, weight_bits, head_bits)
    sha = file_digest(gguf_path)
    remember_source(gguf_path, sha, g.stored_bits())
    out_dir = out_dir or export_dir_for(gguf_path, weight_bits, sha, head_bits)
    modules = modules or not weight_bits
    if not force and _cached_export(out_dir, sha, weight_bits, head_bits):
        if modules:
            ensure_modules(out_dir, progress)
        return out_dir
    cfg = g.config
    from .tokenizer import load_tokenizer

    tok = load_tokenizer(g)
    os.makedirs(os.path.dirname(os.path.abspath(out_dir)), exist_ok=True)
    # Build into a fresh sibling folder and rename at the end: an interrupted export never
    # leaves a folder that looks complete.
    work = tempfile.mkdtemp(prefix=".export-", dir=os.path.dirname(os.path.abspath(out_dir)))
    try:
        steps = tqdm(total=5, desc=f"export {os.path.basename(out_dir)}", disable=not progress, unit="step")
        embedding = "token_embd.weight"
        # A tied Q8_0 embedding is the head's q8 rows exactly (q8_0.quantize gives a Q8_0 block
        # back unchanged): the engine reads its rows from there (Q8Matrix.rows_of, rounded to
        # f16 as this copy was), one copy in memory and on disk (Gemma 3's 262,144 x 640 was 335
        # MB more as f16). Else an f16 copy.
        rows_from_head = cfg.tied_embeddings and head_bits == 8 and g.tensors[embedding].tensor_type.name == "Q8_0"
        embed_file = None if rows_from_head else "embed_f16.npy"
        if embed_file:
            save_f16_rows(g, embedding, os.path.join(work, embed_file))
        steps.update(1)
        tail_blocks = None
        if weight_bits:  # the native tail's weights (runtime.tail): the GGUF's blocks, norms in float32
            tail_blocks = "tail_blocks.npz"
            np.savez(os.path.join(work, tail_blocks), **tail_arrays(g, g.layer(cfg.n_layers - 1)))
        steps.update(1)
        decode_layers, no_decode_layers = None, "the export's layers are float (model.weight_bits 0)"
        if weight_bits:  # the native decode layers' weights (runtime.decode_layers)
            no_decode_layers = decode_layers_refusal(g)
            if no_decode_layers is None:
                decode_layers = "decode_layers.npz"
                with NpzWriter(os.path.join(work, decode_layers)) as npz:
                    for name, array in decode_layer_entries(g):
                        npz.add(name, array)
        steps.update(1)
        head_q8 = None
        if head_bits == 8:  # the native head's rows (runtime.lm_head): the same values as MNN's module
            head_q8 = {"codes": "lm_head_q8_codes.npy", "scales": "lm_head_q8_scales.npy"}
            save_q8_rows(g, embedding if cfg.tied_embeddings else "output.weight",
                         os.path.join(work, head_q8["codes"]), os.path.join(work, head_q8["scales"]))
        steps.update(1)
        tok.save(os.path.join(work, "tokenizer.json"))
        steps.update(1)
        steps.close()
        meta = {
            "export_version": EXPORT_VERSION,
            "config": cfg.to_dict(),
            "weight_bits": weight_bits,
            "head_bits": head_bits,
            "quant_block": QUANT_BLOCK if weight_bits or head_bits else 0,
            "source": os.path.abspath(gguf_path),
            "source_sha256": sha,
            "modules": {},  # MNN's, by name: written by ensure_modules
            "embedding": embed_file,  # None: the rows of lm_head_q8
            "lm_head_q8": head_q8,
            "tail_blocks": tail_blocks,
            "decode_layers": decode_layers,
            "no_decode_layers": no_decode_layers,  # why there are none (runtime.decode_layers native refuses)
            "tokenizer": "tokenizer.json",
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        if modules:
            meta["modules"] = _write_modules(g, work, weight_bits, head_bits, progress, os.path.basename(out_dir))
        _write_meta(work, meta)
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.replace(work, out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out_dir


def module_names(cfg: ModelConfig) -> list:
    """MNN's modules of an export, by name: every layer's, the tail and the head."""
    return [f"layer{i}" for i in range(cfg.n_layers)] + ["tail", "lm_head"]


def _write_modules(g: GgufModel, folder: str, weight_bits: int, head_bits: int, progress: bool, label: str) -> dict:
    """MNN's modules of ``g`` written into ``folder``: {name: {file, inputs, outputs}}.
    ModelFileError naming the options of its layer that MNN's modules' ops lack (Gemma 3's: its
    export has the native layers alone)."""
    from tqdm import tqdm

    check_form(g.config, BASIC, "the MNN export (its modules' ops)")
    MNN = import_mnn()
    F = MNN.expr
    cfg = g.config
    io = module_io(cfg)
    steps = tqdm(total=cfg.n_layers + 2, desc=f"MNN modules {label}", disable=not progress, unit="module")
    modules = {}

    def save(name, outs, bits=weight_bits):
        raw = os.path.join(folder, name + ".float.mnn")
        F.save(outs, raw)
        _convert(raw, os.path.join(folder, name + ".mnn"), bits)
        os.remove(raw)
        ins, outn = io[name]
        modules[name] = {"file": name + ".mnn", "inputs": ins, "outputs": outn}
        steps.update(1)

    prev = None
    for i in range(cfg.n_layers):
        w = g.layer(i)
        save(f"layer{i}", build_layer(F, cfg, prev, w))
        prev = w
    save("tail", build_tail(F, cfg, prev, g.output_norm()))
    save("lm_head", build_lm_head(F, cfg, g.embedding() if cfg.tied_embeddings else g.lm_head()), head_bits)
    steps.close()
    return modules


def _write_meta(folder: str, meta: dict) -> None:
    tmp = os.path.join(folder, "model.json.tmp")
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(tmp, os.path.join(folder, "model.json"))


def ensure_modules(export_dir: str, progress: bool = True) -> dict:
    """The export's metadata with MNN's modules, built now into ``export_dir`` from its source GGUF
    (digest checked) if it has not got them yet. Files go to a sibling folder first and are moved
    in before the metadata names them, so an interrupted build leaves an export without modules,
    never one that names a missing or partial file."""
    with open(os.path.join(export_dir, "model.json")) as f:
        meta = json.load(f)
    cfg = ModelConfig.from_dict(meta["config"])
    if set(meta["modules"]) >= set(module_names(cfg)):
        return meta
    src = meta["source"]
    if not os.path.isfile(src) or file_digest(src) != meta["source_sha256"]:
        raise ModelFileError(f"{export_dir}: MNN's modules are needed (a runtime.* setting is mnn) and the GGUF "
                             f"it was exported from ({src}) is gone or changed; export again "
                             "(python -m mnn_h2o.export --force with that model)")
    work = tempfile.mkdtemp(prefix=".modules-", dir=os.path.dirname(os.path.abspath(export_dir)))
    try:
        modules = _write_modules(GgufModel(src), work, meta["weight_bits"], meta.get("head_bits", meta["weight_bits"]),
                                 progress, os.path.basename(export_dir))
        for m in modules.values():
            os.replace(os.path.join(work, m["file"]), os.path.join(export_dir, m["file"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta["modules"] = modules
    _write_meta(export_dir, meta)
    return meta


def ensure_exported(model: dict, progress: bool = True) -> str:
    """The export folder of a config's ``model`` section (name: a named model or a GGUF path;
    weight_bits, head_bits): exported the first time, the cached export after (export_dir_for)."""
    return export(resolve_gguf(model["name"]), weight_bits=model["weight_bits"], progress=progress,
                  head_bits=model["head_bits"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mnn_h2o.export",
        description="Export a Llama-family GGUF model (Llama, SmolLM, Qwen2) as per-layer MNN "
                    "modules for the mnn_h2o engine, or as a stock MNN.llm model (--stock). "
                    "Exports are cached under $MNN_H2O_CACHE (default ~/.cache/mnn_h2o) and "
                    "re-used until the source file or an option changes (the file's digest is "
                    "remembered there, in sources.json, under its path, size and mtime, so a "
                    "cached export is found without reading the file again).")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", default="smollm2", help=f"named model: {', '.join(MODELS)} (default smollm2)")
    src.add_argument("--gguf", help="path to any Llama-family GGUF file instead of a named model")
    ap.add_argument("--weight-bits", type=int, default=-1, choices=WEIGHT_BITS + (-1,),
                    help="the layers' weights: 8 or 4 (block 32), 0 = float, -1 = the fewest bits that "
                         "hold the GGUF's own weights (4 for Q4_0/Q4_1, else 8; the default, as "
                         "model.weight_bits)")
    ap.add_argument("--head-bits", type=int, default=-1, choices=WEIGHT_BITS + (-1,),
                    help="the lm_head module alone, same values (default -1, as model.head_bits), "
                         "e.g. --weight-bits 4 --head-bits 8")
    ap.add_argument("--out", help="output folder (default: the cache folder, printed at the end)")
    ap.add_argument("--stock", action="store_true",
                    help="write a stock MNN.llm model directory (fused Attention op, MNN's own KV cache)")
    ap.add_argument("--modules", action="store_true",
                    help="also build MNN's modules now (else the first run with a runtime.* setting mnn builds them)")
    ap.add_argument("--force", action="store_true", help="re-export even if a cached export matches")
    args = ap.parse_args(argv)

    def body() -> int:
        path = gguf_file(args.gguf) if args.gguf else resolve_gguf(args.model)
        if args.stock:
            from .stock_export import export_stock, stock_dir_for

            out = args.out or stock_dir_for(path, args.weight_bits)
            print(export_stock(path, out, weight_bits=args.weight_bits))
        else:
            print(export(path, args.out, args.weight_bits, force=args.force, head_bits=args.head_bits,
                         modules=args.modules))
        return 0

    return run(body)


if __name__ == "__main__":
    sys.exit(main())
