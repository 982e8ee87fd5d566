"""Export a GGUF Llama-family model as a *stock* ``MNN.llm`` model directory.

This is the baseline "what a user would run instead" of our engine: the whole model as one
fused MNN graph using MNN's own ``Attention`` op (with MNN's internal KV cache), loadable with
``MNN.llm.create(<out_dir>/config.json)``.

The graph follows the interface ``MNN.llm`` 3.6.1 drives (the same one MNN's ``llmexport``
produces):

========================  ==================  =============================================
input                     dtype / shape       meaning
========================  ==================  =============================================
``input_ids``             float [S, 1, H]     token *embeddings* (MNN.llm looks them up in
                                              the embedding file itself)
``attention_mask``        float []            on CPU with ``attention_mask: "float"`` a
                                              scalar 0 meaning "causal"
``position_ids``          int [1, S] or [S]   absolute positions
``logits_index``          int [1]             -1: logits of the last position only,
                                              0: logits of every position
========================  ==================  =============================================

Output ``logits``: float [1, S', vocab] with S' = 1 or S.

Per layer: RMSNorm, Q/K/V projections, rotate-half RoPE, ``Attention`` (kv_cache=true, GQA
handled by the op), output projection, RMSNorm, SwiGLU MLP. The ``Attention`` op is written
as a ``jsonop`` (an ``Extra`` op carrying JSON) and turned into a real op by a first
conversion at the default optimize level; a second conversion at ``--optimizeLevel 2``
quantises the weights (``--weightQuantBits N --weightQuantBlock B``) and turns the constant
MatMuls into 1x1 convolutions.

Directory produced::

    out_dir/
      config.json            runtime config (thread_num, memory, precision, sampler...)
      llm_config.json        model description (hidden_size, layer_nums, attention_mask,
                             tie_embeddings, jinja chat template)
      llm.mnn                the fused graph (weights inside)
      embeddings_int8.bin    token embeddings (exact copy of a Q8_0 GGUF embedding), or
      embeddings_bf16.bin    (bf16, for other embedding types)
      tokenizer.txt          MNN tokenizer file (HUGGINGFACE/byte-level BPE format)
      mnn_h2o_tokenizer.json our tokenizer (exact pre-tokenizer) for mnn_h2o.stock.StockLlm
      export_info.json       what was exported from what (source digest, bits, block)
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Callable, Optional, Union

import numpy as np

from .decoder_layer import BASIC, check_form, finish_layer, start_layer
from .errors import ModelFileError
from .gguf_model import GgufModel, ModelConfig, file_digest
from .mnn_runtime import import_mnn, redirect_fds
from .model_source import cache_root

EXPORT_FORMAT_VERSION = 1
SUPPORTED_BITS = (0, 4, 8)
# Stop tokens MNN.llm should end generation on when they exist in the vocabulary.
_STOP_TOKEN_NAMES = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>",
                     "<|eom_id|>", "<EOT>")
# Tokenizer file constants of MNN.llm (tokenizer.txt): magic number and type HUGGINGFACE.
_TOKENIZER_MAGIC = 430
_TOKENIZER_HUGGINGFACE = 3

ProgressArg = Union[None, bool, Callable[[str, int, int], None]]


# ----------------------------------------------------------------------------------------------
# progress reporting
# ----------------------------------------------------------------------------------------------
class _Progress:
    """tqdm bar (progress None/True), silence (False) or a callback(stage, done, total)."""

    def __init__(self, progress: ProgressArg, total: int):
        self.total = total
        self.done = 0
        self.callback = progress if callable(progress) else None
        self.bar = None
        if not callable(progress) and progress is not False:
            from tqdm import tqdm

            # progress=None: tqdm decides (disabled when stderr is not a terminal)
            self.bar = tqdm(total=total, desc="stock export", unit="step",
                            disable=None if progress is None else False)

    def step(self, stage: str, n: int = 1):
        self.done += n
        if self.bar is not None:
            self.bar.set_postfix_str(stage, refresh=False)
            self.bar.update(n)
        if self.callback is not None:
            self.callback(stage, self.done, self.total)

    def close(self):
        if self.bar is not None:
            self.bar.close()


# ----------------------------------------------------------------------------------------------
# converter
# ----------------------------------------------------------------------------------------------
def _mnnconvert(args, log_path: str, expect: str):
    """Run MNN's converter in-process (never via MNN.tools, which pip-installs and phones home)."""
    import_mnn()
    import _tools

    if os.path.exists(expect):
        os.remove(expect)
    with redirect_fds(log_path, (1, 2)):
        rc = _tools.mnnconvert(["mnnconvert"] + list(args))
    if not os.path.isfile(expect) or os.path.getsize(expect) == 0:
        tail = ""
        try:
            with open(log_path, "r", errors="replace") as f:
                tail = "".join(f.readlines()[-20:])
        except OSError:
            pass
        raise RuntimeError(f"MNN converter failed (rc={rc}) for {' '.join(args)}\n{tail}")


# ----------------------------------------------------------------------------------------------
# graph
# ----------------------------------------------------------------------------------------------
def _const(a: np.ndarray):
    from MNN.expr import _F

    a = np.ascontiguousarray(a)
    dt = _F.int if a.dtype == np.int32 else _F.float
    if dt is _F.float:
        a = a.astype(np.float32, copy=False)
    return _F.const(a, list(a.shape), _F.NCHW, dt)


def _attention_json(name: str) -> str:
    return json.dumps({"type": "Attention", "name": name, "main_type": "AttentionParam",
                       "main": {"kv_cache": True}})


class _StockOps:
    """decoder_layer's ops in MNN.llm's layout: rows [S, width] in, [1, S, heads, head_dim] to the
    Attention op; one epsilon constant and one pair of RoPE tables ([1, S, 1, hd]) for all layers.

    Not shared with export._ModuleOps although the math is the same: the two record different
    ops for it (square vs x * x, one epsilon vs one per norm, NCHW constants), and one set of
    primitives would change the bytes of one of the two exports."""

    def __init__(self, F, c: ModelConfig, cos, sin):
        self.F, self.head_dim, self.cos, self.sin = F, c.head_dim, cos, sin
        self.eps = _const(np.array(c.rms_eps, dtype=np.float32))

    def rms_norm(self, x, w):
        F = self.F
        ms = F.reduce_mean(F.square(x), [-1], True)
        return F.multiply(F.multiply(x, F.rsqrt(F.add(ms, self.eps))), _const(w))

    def linear(self, x, w, b=None):
        F = self.F
        y = F.matmul(x, _const(w), False, True)
        return y if b is None else F.add(y, _const(b))

    def heads(self, x, n_heads):
        return self.F.reshape(x, [1, -1, n_heads, self.head_dim], self.F.NCHW)

    def rope(self, x, n_heads):
        F, hd = self.F, self.head_dim
        x = self.heads(x, n_heads)
        lo, hi = F.split(x, [hd // 2, hd // 2], 3)
        rot = F.concat([F.negative(hi), lo], 3)
        return F.add(F.multiply(x, self.cos), F.multiply(rot, self.sin))

    def silu(self, x):
        return self.F.multiply(x, self.F.sigmoid(x))


def build_graph(model: GgufModel, progress: Optional[_Progress] = None, n_layers: Optional[int] = None):
    """Build the whole-model MNN.expr graph; returns the ``logits`` Var (inputs are named)."""
    from MNN.expr import _F

    c: ModelConfig = model.config
    H, nh, hd = c.hidden, c.n_heads, c.head_dim
    n_layers = c.n_layers if n_layers is None else n_layers

    input_ids = _F.placeholder([-1, 1, H], _F.NCHW, _F.float)
    input_ids.name = "input_ids"
    attention_mask = _F.placeholder([1, 1, -1, -1], _F.NCHW, _F.float)
    attention_mask.name = "attention_mask"
    position_ids = _F.placeholder([1, -1], _F.NCHW, _F.int)
    position_ids.name = "position_ids"
    logits_index = _F.placeholder([1], _F.NCHW, _F.int)
    logits_index.name = "logits_index"

    # RoPE tables from position_ids (shared by all layers): [1, S, 1, hd]
    inv_freq = 1.0 / (c.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    pos = _F.cast(_F.reshape(position_ids, [-1, 1], _F.NCHW), _F.float)
    freqs = _F.multiply(pos, _const(inv_freq.astype(np.float32).reshape(1, -1)))
    emb = _F.concat([freqs, freqs], 1)
    cos = _F.reshape(_F.cos(emb), [1, -1, 1, hd], _F.NCHW)
    sin = _F.reshape(_F.sin(emb), [1, -1, 1, hd], _F.NCHW)
    ops = _StockOps(_F, c, cos, sin)

    x = _F.reshape(input_ids, [-1, H], _F.NCHW)
    for i in range(n_layers):
        w = model.layer(i)
        q, k, v = start_layer(ops, c, w, x)
        a = _F.jsonop([q, k, v, attention_mask], _attention_json(f"/layers.{i}/self_attn/attn"), 1)[0]
        x = finish_layer(ops, c, w, x, _F.reshape(a, [-1, nh * hd], _F.NCHW))
        del w
        if progress is not None:
            progress.step(f"layer {i}")

    # hidden_states[:, logits_index:, :]
    x = _F.reshape(x, [1, -1, H], _F.NCHW)
    zero = _const(np.zeros(1, np.int32))
    begin = _F.concat([zero, logits_index, zero], 0)
    x = _F.strided_slice(x, begin, _const(np.array([1, 0, 0], np.int32)),
                         _const(np.array([1, 1, 1], np.int32)), 0, 6, 0, 0, 0)
    x = _F.reshape(x, [-1, H], _F.NCHW)
    x = ops.rms_norm(x, model.output_norm())
    logits = _F.reshape(ops.linear(x, model.lm_head()), [1, -1, c.vocab], _F.NCHW)
    logits.name = "logits"
    return logits


# ----------------------------------------------------------------------------------------------
# embedding file
# ----------------------------------------------------------------------------------------------
def write_embedding(model: GgufModel, out_dir: str) -> dict:
    """Write the embedding file MNN.llm's DiskEmbedding reads; returns the config entries.

    A Q8_0 GGUF embedding (blocks of 32 int8 with one fp16 scale) is stored exactly in MNN's
    symmetric int8 block format: bytes ``q + 128`` per token row followed by the fp32 block
    scales; MNN dequantises ``byte * s - 128 * s``, which is exact in fp32. Other types are
    written as bf16 (MNN.llm's default embedding format).
    """
    import gguf

    c = model.config
    t = model.tensors["token_embd.weight"]
    if t.tensor_type == gguf.GGMLQuantizationType.Q8_0 and c.hidden % 32 == 0:
        raw = np.asarray(t.data).reshape(-1, 34)  # per block: fp16 scale + 32 int8
        n_blocks = c.vocab * c.hidden // 32
        if raw.shape[0] != n_blocks:
            raise ModelFileError(f"{model.path}: token_embd.weight has {raw.shape[0]} Q8_0 blocks, "
                                 f"expected {n_blocks}")
        scale = raw[:, :2].copy().view(np.float16).astype(np.float32).reshape(-1)
        q = raw[:, 2:].copy().view(np.int8).astype(np.int16) + 128
        path = os.path.join(out_dir, "embeddings_int8.bin")
        with open(path, "wb") as f:
            wsize = f.write(q.astype(np.uint8).tobytes())
            asize = f.write(scale.tobytes())
        return {"embedding_file": "embeddings_int8.bin",
                "tie_embeddings": [0, wsize, asize, 8, 32]}
    emb = model.embedding()
    bf16 = (emb.astype(np.float32).view(np.uint32) + 0x8000) >> 16  # round to nearest
    path = os.path.join(out_dir, "embeddings_bf16.bin")
    bf16.astype(np.uint16).tofile(path)
    return {"embedding_file": "embeddings_bf16.bin"}


# ----------------------------------------------------------------------------------------------
# tokenizer.txt
# ----------------------------------------------------------------------------------------------
def write_tokenizer(model: GgufModel, path: str) -> dict:
    """Write MNN's ``tokenizer.txt`` (type HUGGINGFACE = byte-level BPE) from the GGUF vocab.

    Format (text, one item per line)::

        430 3                                  magic, tokenizer type
        <n_special> <n_stop> <n_prefix>
        <special ids...> <stop ids...> <prefix ids...>
        <n_vocab> <n_merges>
        <token 0>  ...  <token n_vocab-1>      byte-level unicode strings (e.g. "Ġthe")
        <merge 0>  ...                         "left right", in rank order
    """
    meta = model.tokenizer_metadata()
    tokens, types, merges = meta["tokens"], meta["token_type"], meta["merges"]
    for i, tok in enumerate(tokens):
        if "\n" in tok or "\r" in tok or tok == "":
            raise ModelFileError(f"{model.path}: token {i} ({tok!r}) cannot be stored in tokenizer.txt")
    for m in merges:
        if "\n" in m or len(m.split(" ")) != 2:
            raise ModelFileError(f"{model.path}: BPE merge {m!r} cannot be stored in tokenizer.txt")
    special = [i for i, t in enumerate(types) if t in (3, 4)]  # CONTROL, USER_DEFINED
    stops = []
    if 0 <= meta["eos_token_id"] < len(tokens):
        stops.append(meta["eos_token_id"])
    for i, tok in enumerate(tokens):
        if tok in _STOP_TOKEN_NAMES and i not in stops:
            stops.append(i)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(f"{_TOKENIZER_MAGIC} {_TOKENIZER_HUGGINGFACE}\n")
        f.write(f"{len(special)} {len(stops)} 0\n")
        f.write(" ".join(str(i) for i in special + stops) + "\n")
        f.write(f"{len(tokens)} {len(merges)}\n")
        for tok in tokens:
            f.write(tok + "\n")
        for m in merges:
            f.write(m + "\n")
    return {"special": special, "stop": stops}


# ----------------------------------------------------------------------------------------------
# configs
# ----------------------------------------------------------------------------------------------
def _llm_config(model: GgufModel, emb_cfg: dict) -> dict:
    c = model.config
    meta = model.tokenizer_metadata()
    tokens = meta["tokens"]
    d = {
        "model_type": c.arch,
        "hidden_size": c.hidden,
        "layer_nums": c.n_layers,
        "attention_mask": "float",
        "attention_type": "full",
        "is_mrope": False,
        "key_value_shape": [2, 1, 0, c.n_kv_heads, c.head_dim],
        "is_single": True,
        "attention_fused": True,
    }
    if "tie_embeddings" in emb_cfg:
        d["tie_embeddings"] = emb_cfg["tie_embeddings"]
    if meta.get("chat_template"):
        jinja = {"chat_template": meta["chat_template"]}
        if 0 <= meta["bos_token_id"] < len(tokens):
            jinja["bos"] = tokens[meta["bos_token_id"]]
        if 0 <= meta["eos_token_id"] < len(tokens):
            jinja["eos"] = tokens[meta["eos_token_id"]]
        d["jinja"] = jinja
    return d


def runtime_config(weight_bits: int, threads: int = 2, memory: Optional[str] = None,
                   precision: str = "normal", context: int = 8192, embedding_file: str = "") -> dict:
    """The ``config.json`` runtime options.

    ``memory`` defaults to "low" for quantised weights (MNN's fast int8/int4 kernels only run
    with Memory_Low; it also quantises activations on the fly) and "normal" for float weights.
    """
    if memory is None:
        memory = "low" if weight_bits else "normal"
    d = {
        "llm_model": "llm.mnn",
        "llm_weight": "llm.mnn.weight",
        "backend_type": "cpu",
        "thread_num": int(threads),
        "precision": precision,
        "memory": memory,
        "power": "normal",
        "sampler_type": "greedy",
        "max_all_tokens": int(context),
        "max_new_tokens": 512,
        "reuse_kv": False,
        "use_mmap": False,
    }
    if embedding_file:
        d["embedding_file"] = embedding_file
    return d


# ----------------------------------------------------------------------------------------------
# entry point
# ----------------------------------------------------------------------------------------------
def export_stock(gguf_path: str, out_dir: str, weight_bits: int = 8, progress: ProgressArg = None,
                 *, quant_block: int = 32, threads: int = 2, memory: Optional[str] = None,
                 precision: str = "normal", _n_layers: Optional[int] = None) -> str:
    """Export ``gguf_path`` as a stock MNN.llm model directory ``out_dir``; returns config.json.

    ``weight_bits``: 8 or 4 (weights re-quantised by MNN's converter, blocks of
    ``quant_block`` input channels), or 0 for float32 weights. ``progress``: None (tqdm bar if
    stderr is a terminal), True (always a bar), False (silent) or a callable
    ``(stage, done, total)``. ``threads``/``memory``/``precision`` go to config.json (they can
    be changed there or with ``Llm.set_config`` later).
    """
    if not isinstance(gguf_path, (str, os.PathLike)) or not str(gguf_path):
        raise ValueError(f"gguf_path must be a path, got {gguf_path!r}")
    if not isinstance(out_dir, (str, os.PathLike)) or not str(out_dir):
        raise ValueError(f"out_dir must be a path, got {out_dir!r}")
    if isinstance(weight_bits, bool) or weight_bits not in SUPPORTED_BITS:
        raise ValueError(f"weight_bits must be one of {SUPPORTED_BITS} (0 = float weights), got {weight_bits!r}")
    if weight_bits and (isinstance(quant_block, bool) or not isinstance(quant_block, int) or quant_block < 0):
        raise ValueError(f"quant_block must be a non-negative int (0 = per channel), got {quant_block!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    if memory not in (None, "low", "normal", "high"):
        raise ValueError(f"memory must be 'low', 'normal' or 'high', got {memory!r}")
    if precision not in ("low", "normal", "high"):
        raise ValueError(f"precision must be 'low', 'normal' or 'high', got {precision!r}")
    if progress is not None and not isinstance(progress, bool) and not callable(progress):
        raise ValueError(f"progress must be None, a bool or a callable, got {progress!r}")
    gguf_path, out_dir = os.fspath(gguf_path), os.fspath(out_dir)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"out_dir {out_dir!r} exists and is not a directory")

    model = GgufModel(gguf_path)  # raises ModelFileError (a ValueError) for bad files
    check_form(model.config, BASIC, "the stock MNN export")
    c = model.config
    if weight_bits and quant_block and any(n % quant_block for n in (c.hidden, c.ffn, c.n_heads * c.head_dim)):
        raise ValueError(f"quant_block {quant_block} does not divide the model's input widths "
                         f"({c.hidden}, {c.ffn}); MNN would silently fall back to per-channel")
    model.tokenizer_metadata()  # fail early (before the slow part) on an unsupported tokenizer
    n_layers = c.n_layers if _n_layers is None else _n_layers

    os.makedirs(out_dir, exist_ok=True)
    prog = _Progress(progress, total=n_layers + 6)
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix=".stock_export_", dir=out_dir)
    log_path = os.path.join(tmp, "convert.log")
    try:
        F = import_mnn().expr
        logits = build_graph(model, prog, n_layers)
        raw = os.path.join(tmp, "raw.mnn")
        F.save([logits], raw)
        del logits
        prog.step("graph saved")

        # 1) default optimize level, no quantisation: jsonop -> real Attention op
        fused = os.path.join(tmp, "fused.mnn")
        _mnnconvert(["-f", "MNN", "--modelFile", raw, "--MNNModel", fused], log_path, fused)
        os.remove(raw)
        prog.step("converted (attention)")

        # 2) level 2 (+ weight quantisation): MatMul -> 1x1 conv, int8/int4 weights
        final = os.path.join(tmp, "llm.mnn")
        args = ["-f", "MNN", "--modelFile", fused, "--MNNModel", final, "--optimizeLevel", "2",
                "--saveExternalData"]
        if weight_bits:
            args += ["--weightQuantBits", str(weight_bits), "--weightQuantBlock", str(quant_block)]
        _mnnconvert(args, log_path, final)
        os.remove(fused)
        prog.step(f"converted ({'int%d' % weight_bits if weight_bits else 'float'})")

        emb_cfg = write_embedding(model, tmp)
        prog.step("embedding")
        tok_info = write_tokenizer(model, os.path.join(tmp, "tokenizer.txt"))
        from .tokenizer import load_tokenizer

        # our tokenizer (exact SmolLM2 pre-tokenizer) for StockLlm; MNN.llm ignores this file
        load_tokenizer(model).save(os.path.join(tmp, "mnn_h2o_tokenizer.json"))
        prog.step("tokenizer")

        with open(os.path.join(tmp, "llm_config.json"), "w", encoding="utf-8") as f:
            json.dump(_llm_config(model, emb_cfg), f, ensure_ascii=False, indent=2)
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(runtime_config(weight_bits, threads, memory, precision, c.context,
                                     emb_cfg["embedding_file"]), f, indent=2)
        info = {
            "format_version": EXPORT_FORMAT_VERSION,
            "kind": "stock-mnn-llm",
            "source": os.path.abspath(gguf_path),
            "source_sha256": file_digest(gguf_path),
            "weight_bits": weight_bits,
            "quant_block": quant_block if weight_bits else None,
            "n_layers": n_layers,
            "config": c.to_dict(),
            "stop_token_ids": tok_info["stop"],
            "mnn_version": _mnn_version(),
            "export_seconds": round(time.time() - t0, 1),
        }
        with open(os.path.join(tmp, "export_info.json"), "w", encoding="utf-8") as f:
            json.dump(info, f, indent=2)

        # move into place (replace an older export of the same directory)
        # export_info.json last: a directory with it is complete
        produced = sorted(set(os.listdir(tmp)) - {"convert.log"}, key=lambda n: n == "export_info.json")
        info_path = os.path.join(out_dir, "export_info.json")
        if os.path.exists(info_path):
            os.remove(info_path)
        for name in produced:
            os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
        for stale in ("llm.mnn.weight", "embeddings_bf16.bin", "embeddings_int8.bin"):
            p = os.path.join(out_dir, stale)
            if stale not in produced and os.path.exists(p):
                os.remove(p)
        prog.step("done")
    finally:
        prog.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return os.path.join(out_dir, "config.json")


def stock_dir_for(gguf_path: str, weight_bits: int, sha: Optional[str] = None) -> str:
    """Cache folder of the stock export of ``gguf_path`` (keyed on the file's sha256)."""
    sha = sha or file_digest(gguf_path)
    stem = os.path.splitext(os.path.basename(gguf_path))[0]
    return os.path.join(cache_root(), "stock", f"{stem}-{sha[:12]}-w{weight_bits}-v{EXPORT_FORMAT_VERSION}")


def is_stock_complete(out_dir: str, sha: Optional[str] = None, weight_bits: Optional[int] = None) -> bool:
    """True when ``out_dir`` holds a finished stock export (of that source / bit width)."""
    try:
        with open(os.path.join(out_dir, "export_info.json")) as f:
            info = json.load(f)
        with open(os.path.join(out_dir, "config.json")) as f:
            rt = json.load(f)
    except (OSError, ValueError):
        return False
    if info.get("format_version") != EXPORT_FORMAT_VERSION or info.get("kind") != "stock-mnn-llm":
        return False
    if sha is not None and info.get("source_sha256") != sha:
        return False
    if weight_bits is not None and info.get("weight_bits") != weight_bits:
        return False
    if info.get("n_layers") != info.get("config", {}).get("n_layers"):
        return False
    files = ("llm.mnn", "llm.mnn.weight", "llm_config.json", "tokenizer.txt", "mnn_h2o_tokenizer.json",
             rt.get("embedding_file", ""))
    return all(f and os.path.isfile(os.path.join(out_dir, f)) for f in files)


def ensure_stock(gguf_path: str, weight_bits: int = 8, out_dir: Optional[str] = None,
                 force: bool = False, progress: ProgressArg = None) -> str:
    """config.json of a stock export of ``gguf_path``, exporting only when no matching export
    exists (default folder: :func:`stock_dir_for`, under ``$MNN_H2O_CACHE``)."""
    if not os.path.isfile(os.fspath(gguf_path)):
        raise ModelFileError(f"model file not found: {gguf_path}")
    sha = file_digest(gguf_path)
    out_dir = out_dir or stock_dir_for(gguf_path, weight_bits, sha)
    if not force and is_stock_complete(out_dir, sha, weight_bits):
        return os.path.join(out_dir, "config.json")
    return export_stock(gguf_path, out_dir, weight_bits, progress)


def _mnn_version() -> str:
    try:
        import importlib.metadata as md

        return md.version("MNN")
    except Exception:
        return "unknown"
