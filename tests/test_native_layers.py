"""The native decode layers (runtime.decode_layers): the GGUF's blocks read exactly, one
layer call against decoder_layer.py in float64, the engine's decode against the exact model and
against MNN's layer modules, the counters, bad files refused."""
import numpy as np
import pytest

from conftest import make_llm

pytestmark = pytest.mark.model


def _kl(p, q):
    return np.sum(np.exp(p) * (p - q), axis=-1)


def test_gguf_weight_blocks_are_the_stored_values(smollm2_gguf):
    """GgufModel.weight_blocks: the file's own bytes, which the core's dequantiser turns into
    exactly the values gguf's does, Q and K rows un-permuted as layer() does; a type the core does
    not read is refused by name."""
    from mnn_h2o import native
    from mnn_h2o.errors import ModelFileError

    c = smollm2_gguf.config
    w = smollm2_gguf.layer(2)
    for tensor, name, heads in (("attn_q", "wq", c.n_heads), ("attn_k", "wk", c.n_kv_heads),
                                ("ffn_down", "w_down", None)):
        kind, raw = smollm2_gguf.weight_blocks(f"blk.2.{tensor}.weight", heads)
        assert kind == "Q4_1" and raw.dtype == np.uint8 and raw.shape == (w[name].shape[0], w[name].shape[1] // 32 * 20)
        values = native.dequantize_blocks(kind, raw).reshape(w[name].shape)
        assert np.array_equal(values, w[name]), tensor
    kind, raw = smollm2_gguf.weight_blocks("token_embd.weight")
    assert kind == "Q8_0"
    assert np.array_equal(native.dequantize_blocks(kind, raw[:7]), smollm2_gguf.embedding()[:7].reshape(-1))
    with pytest.raises(ModelFileError, match="attn_norm.weight.* is F32"):
        smollm2_gguf.weight_blocks("blk.0.attn_norm.weight")


def test_every_weight_type_decodes_as_gguf_does():
    """The core's table against gguf's own dequantisers on random blocks (finite fp16 scales),
    for every type, those no model here is stored in (Q5_K) included."""
    import gguf
    from gguf.quants import dequantize

    from mnn_h2o import native

    rng = np.random.default_rng(5)
    for t in native.weight_types():
        qtype = gguf.GGMLQuantizationType[t["name"]]
        raw = rng.integers(0, 256, (16, t["block_bytes"]), dtype=np.uint8)
        for off in t["half_offsets"]:
            if off >= 0:  # small finite scales: random bytes would make NaNs and infinities
                raw[:, off:off + 2] = (rng.standard_normal(16) * 0.01).astype(np.float16).view(np.uint8).reshape(16, 2)
        want = dequantize(raw.reshape(-1), qtype).reshape(-1)
        assert np.array_equal(native.dequantize_blocks(t["name"], raw), want), t["name"]


def test_one_layer_call_is_decoder_layer(smollm2_gguf):
    """forward(i): finish layer i - 1, start layer i, as decoder_layer.py states them; against
    float64 over the GGUF's values, the only difference the activations' two int8 roundings per
    block (~1e-4 of each output's norm; one rounding alone was ~2e-2)."""
    from mnn_h2o.decoder_layer import finish_layer, start_layer
    from mnn_h2o.export import decode_layer_arrays
    from mnn_h2o.native_layers import decode_layers_from_arrays
    from mnn_h2o.numpy_ops import NumpyOps, rope_tables

    c = smollm2_gguf.config
    arrays, why_not = decode_layer_arrays(smollm2_gguf)
    assert why_not is None and list(arrays["0.qkv.types"]) == ["Q4_1"] * 3
    layers = decode_layers_from_arrays(arrays, c, threads=2)
    single = decode_layers_from_arrays(arrays, c, threads=1)
    rng = np.random.default_rng(0)
    pos = 37
    cos, sin = rope_tables(c, np.array([pos]), np.float64)
    ops = NumpyOps(c, cos, sin)
    h0 = smollm2_gguf.embedding()[123].astype(np.float64)[None] + rng.standard_normal((1, c.hidden))
    attn = rng.standard_normal((1, c.n_heads * c.head_dim))
    for i in (0, 5, 29):
        w_prev, w = (smollm2_gguf.layer(i - 1) if i else None), smollm2_gguf.layer(i)
        h_ref = finish_layer(ops, c, w_prev, h0, attn) if i else h0
        q_ref, k_ref, v_ref = (x.reshape(1, -1) for x in start_layer(ops, c, w, h_ref))
        outs = []
        for engine, isa, rest in ((layers, None, True), (layers, "scalar", True), (single, None, True),
                                  (layers, None, False)):
            h = h0[0].astype(np.float32)
            q = np.empty(c.n_heads * c.head_dim, np.float32)
            k, v = (np.empty(c.n_kv_heads * c.head_dim, np.float32) for _ in range(2))
            engine.forward(i, h, attn[0].astype(np.float32) if i else None, cos[0].astype(np.float32),
                           sin[0].astype(np.float32), q, k, v, isa=isa, rest=rest)
            outs.append((h, q, k, v))
            for got, ref, name in ((h, h_ref, "h"), (q, q_ref, "q"), (k, k_ref, "k"), (v, v_ref, "v")):
                err = np.linalg.norm(got - ref[0]) / np.linalg.norm(ref[0])
                assert err < 1e-3, f"layer {i} {name}: relative error {err:.2e}"
        for other in (outs[2], outs[3]):  # rows are split between threads, never summed across
            for a, b in zip(outs[0], other):
                assert np.array_equal(a, b), f"layer {i}: 1 and 2 threads (or the workers resting) differ"
        for a, b in zip(outs[0], outs[1]):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max())
    with pytest.raises(ValueError, match="layer 0"):
        layers.forward(0, h0[0].astype(np.float32), attn[0].astype(np.float32), cos[0].astype(np.float32),
                       sin[0].astype(np.float32), q, k, v)
    with pytest.raises(IndexError):
        layers.forward(c.n_layers, h0[0].astype(np.float32), None, cos[0].astype(np.float32),
                       sin[0].astype(np.float32), q, k, v)
    with pytest.raises(ValueError, match="q must be"):
        layers.forward(0, h0[0].astype(np.float32), None, cos[0].astype(np.float32), sin[0].astype(np.float32),
                       q[:-1], k, v)


def embed_row(g, token: int) -> np.ndarray:
    return g.embedding()[token].astype(np.float32)


def test_decode_token_is_the_layers_one_by_one(smollm2_gguf):
    """native.decode_token (every layer and its cache step in one call, the attention on the
    layers' threads, and the logits where asked for) against forward and KvCache.step layer by
    layer and then logits, on the real weights and their Q8_0 head: h, the attention output, the
    logits and the cache equal bit for bit; an observer sees every layer's h and its scores reach
    a predicted_kvzip cache; bad arguments refused before anything runs."""
    from mnn_h2o import native
    from mnn_h2o.export import decode_layer_arrays
    from mnn_h2o.native_layers import decode_layers_from_arrays
    from mnn_h2o.numpy_ops import rope_tables

    c = smollm2_gguf.config
    arrays, _ = decode_layer_arrays(smollm2_gguf)
    codes, scales, _ = smollm2_gguf.blocks("token_embd.weight")  # the tied Q8_0 head
    head = native.Q8Matrix(codes, scales.view(np.uint16))
    layers = decode_layers_from_arrays(arrays, c, threads=2, q8_head=head)
    assert layers.has_head and layers.vocab == c.vocab
    with pytest.raises(ValueError, match="no output matrix"):
        native.decode_token(decode_layers_from_arrays(arrays, c, threads=2), native.KvCache(
            c.n_layers, c.n_kv_heads, c.head_dim, c.n_heads, max_tokens=16), embed_row(smollm2_gguf, 0),
            np.ones(c.head_dim, np.float32), np.zeros(c.head_dim, np.float32), np.empty(c.n_heads * c.head_dim, np.float32),
            *(np.empty(c.n_kv_heads * c.head_dim, np.float32) for _ in range(2)),
            np.empty(c.n_heads * c.head_dim, np.float32), logits=np.empty(c.vocab, np.float32))
    nq, nk = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim

    def cache():
        kv = native.KvCache(c.n_layers, c.n_kv_heads, c.head_dim, c.n_heads, dtype="q8", block_tokens=16,
                            max_tokens=256, threads=2)
        kv.enable_eviction(policy="predicted_kvzip", trigger_min_tokens=1 << 20)
        return kv

    own, lent = cache(), cache()
    cos, sin = (t.astype(np.float32) for t in rope_tables(c, np.arange(24), np.float64))
    embed = smollm2_gguf.embedding()
    q, k, v = np.empty(nq, np.float32), np.empty(nk, np.float32), np.empty(nk, np.float32)
    attn_a, attn_b = np.empty(nq, np.float32), np.empty(nq, np.float32)
    seen = []

    def observe(i, h):
        seen.append((i, h.copy()))
        return np.full(c.n_kv_heads, (i + 1) / 64, np.float32)

    for pos, token in enumerate(range(100, 124)):
        ha = embed[token].astype(np.float32)
        hb = ha.copy()
        seen.clear()
        for i in range(c.n_layers):
            layers.forward(i, ha, attn_a if i else None, cos[pos], sin[pos], q, k, v)
            own.step(i, q[None], k[None], v[None], attn_a[None])
            if i == 3:
                h3 = ha.copy()
            own.set_token_scores(i, np.full((c.n_kv_heads, 1), (i + 1) / 64, np.float32))
        want = np.empty(c.vocab, np.float32)
        layers.logits(ha.copy(), attn_a, want)  # it finishes the last layer in its h
        got = np.empty(c.vocab, np.float32) if pos % 2 else None  # every other token asks for them
        times = native.decode_token(layers, lent, hb, cos[pos], sin[pos], q, k, v, attn_b, observe, logits=got)
        assert np.array_equal(ha, hb) and np.array_equal(attn_a, attn_b), pos
        assert got is None or np.array_equal(got, want), pos
        assert [i for i, _ in seen] == list(range(c.n_layers)) and np.array_equal(seen[3][1], h3)
        assert len(times) == 4 and all(t >= 0 for t in times) and (times[3] > 0) == (got is not None)
    for i in (0, c.n_layers - 1):
        assert np.array_equal(own.token_scores(i), lent.token_scores(i))
        assert np.allclose(lent.token_scores(i), (i + 1) / 64)
    h = embed[7].astype(np.float32)
    with pytest.raises(ValueError, match="attn must be"):
        native.decode_token(layers, lent, h, cos[0], sin[0], q, k, v, attn_b[:-1])
    with pytest.raises(ValueError, match="None or 3 scores"):
        native.decode_token(layers, lent, h, cos[0], sin[0], q, k, v, attn_b, lambda i, h: np.zeros(5, np.float32))
    with pytest.raises(ZeroDivisionError):
        native.decode_token(layers, lent, h, cos[0], sin[0], q, k, v, attn_b, lambda i, h: 1 / 0)
    other = native.KvCache(2, c.n_kv_heads, c.head_dim, c.n_heads, dtype="q8", block_tokens=16, max_tokens=64)
    with pytest.raises(ValueError, match="layers"):
        native.decode_token(layers, other, h, cos[0], sin[0], q, k, v, attn_b)


def test_prompt_rows_are_decoder_layer(smollm2_gguf):
    """forward_rows: a chunk of 20 rows (batched products: the weights' integers, each activation
    row rounded twice to int8 per block) against decoder_layer.py in float64, as close as forward's
    one-row products are (1e-3 of each output's norm), 1 and 2 threads bit for bit; a chunk of 3
    rows (below the batched products' 16) is forward's one-row path, bit for bit."""
    from mnn_h2o.decoder_layer import finish_layer, start_layer
    from mnn_h2o.export import decode_layer_arrays
    from mnn_h2o.native_layers import decode_layers_from_arrays
    from mnn_h2o.numpy_ops import NumpyOps, rope_tables

    c = smollm2_gguf.config
    arrays, _ = decode_layer_arrays(smollm2_gguf)
    layers = decode_layers_from_arrays(arrays, c, threads=2)
    single = decode_layers_from_arrays(arrays, c, threads=1)
    rng = np.random.default_rng(1)
    nq, nk = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    for n in (20, 3):
        pos = np.arange(40, 40 + n)
        cos, sin = rope_tables(c, pos, np.float64)
        ops = NumpyOps(c, cos, sin)
        h0 = smollm2_gguf.embedding()[rng.integers(0, c.vocab, n)].astype(np.float64) + rng.standard_normal((n, c.hidden))
        attn = rng.standard_normal((n, nq))
        for i in (0, 7):
            w_prev, w = (smollm2_gguf.layer(i - 1) if i else None), smollm2_gguf.layer(i)
            h_ref = finish_layer(ops, c, w_prev, h0, attn) if i else h0
            refs = [h_ref] + [x.reshape(n, -1) for x in start_layer(ops, c, w, h_ref)]
            outs = []
            for engine in (layers, single):
                h = h0.astype(np.float32)
                q, k, v = np.empty((n, nq), np.float32), np.empty((n, nk), np.float32), np.empty((n, nk), np.float32)
                engine.forward_rows(i, h, attn.astype(np.float32) if i else None, cos.astype(np.float32),
                                    sin.astype(np.float32), q, k, v)
                outs.append((h, q, k, v))
            for a, b in zip(*outs):
                assert np.array_equal(a, b), f"n {n} layer {i}: 1 and 2 threads differ"
            if n >= 16:
                for got, ref, name in zip(outs[0], refs, "hqkv"):
                    err = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
                    assert err.max() < 1e-3, f"layer {i} {name}: {err.max():.2e} from float64"
            else:  # the one-row path, row by row
                for r in range(n):
                    h = h0[r].astype(np.float32)
                    q, k, v = np.empty(nq, np.float32), np.empty(nk, np.float32), np.empty(nk, np.float32)
                    layers.forward(i, h, attn[r].astype(np.float32) if i else None, cos[r].astype(np.float32),
                                   sin[r].astype(np.float32), q, k, v)
                    for a, b in zip(outs[0], (h, q, k, v)):
                        assert np.array_equal(a[r], b), f"layer {i} row {r}: not forward's"
    with pytest.raises(ValueError, match="whole rows"):
        layers.forward_rows(0, np.zeros((2, c.hidden + 1), np.float32), None, cos, sin, q, k, v)


def test_engine_prompt_native_is_exact(reference, tokenizer):
    """runtime.prompt_layers native: a prompt's layers and its logits in our core (no MNN module
    loaded, none called), within 1e-4 KL of the exact model over 300 teacher-forced prompt tokens
    (measured ~6e-7; one rounding alone: 0.0097); native without the native decode layers is
    refused. MNN's modules against the same yardstick: the slow test below."""
    from mnn_h2o.config import ConfigError
    from mnn_h2o.essays import essay_tokens
    from mnn_h2o.measure import log_softmax

    ids = essay_tokens(tokenizer, 300)
    exact = log_softmax(reference.forward(ids, all_logits=True))
    native = make_llm(4, head_bits=8)
    assert native.prompt_layers == "native" and not native._modules
    got = log_softmax(native.logits(ids))
    kl = _kl(exact, got).mean()
    print(f"KL to the exact model over {len(ids)} prompt tokens: native {kl:.2e}")
    assert native.stats.mnn_calls == 0 and native.stats.dense_s > 0
    assert np.mean(got.argmax(-1) == exact.argmax(-1)) > 0.99
    assert kl < 1e-4
    with pytest.raises(ConfigError, match="prompt_layers native"):
        make_llm(4, head_bits=8, prompt_layers="native", decode_layers="mnn")


def _teacher_forced(llm, prompt, cont):
    """Log-probabilities of a prefill and the decode steps over ``cont`` (the last token's
    prediction is not needed), and whether a decode step called MNN."""
    from mnn_h2o.measure import log_softmax

    llm.reset()
    rows = [llm.prefill(prompt)]
    calls = llm.stats.mnn_calls
    rows += [llm.decode(t) for t in cont[:-1]]
    return log_softmax(np.stack(rows).reshape(len(cont), -1)), llm.stats.mnn_calls != calls


def test_engine_decode_native_is_close_to_the_exact_model(reference, tokenizer):
    """Teacher-forced decode through the native layers, the tail and the Q8_0 head theirs (in each
    token's own call): within 1e-4 KL of the exact model on 64 essay tokens after a 192-token
    prompt (measured 6e-7), no MNN call per token."""
    from mnn_h2o.essays import essay_tokens
    from mnn_h2o.forward_paths import LayersHead
    from mnn_h2o.measure import log_softmax

    native = make_llm(4, head_bits=8)
    assert native._decode_layers is not None and isinstance(native._head_path, LayersHead)
    assert native._native_tail is None and native._decode_layers.vocab == native.config.vocab
    ids = essay_tokens(tokenizer, 256)
    prompt, cont = ids[:192], ids[192:]
    exact = log_softmax(reference.forward(ids, all_logits=True)[191:-1])
    got, called_mnn = _teacher_forced(native, prompt, cont)
    assert not called_mnn, "a native decode step called MNN"
    assert native.stats.dense_s > 0 and native.stats.head_s > 0
    kl = _kl(exact, got).mean()
    print(f"KL to the exact model over {len(cont)} decode tokens: native layers {kl:.2e}")
    assert kl < 1e-4
    assert np.mean(got.argmax(-1) == exact.argmax(-1)) > 0.9


@pytest.mark.slow
def test_mnn_modules_are_further_from_the_exact_model_than_the_native_layers(reference, tokenizer):
    """runtime.prompt_layers / decode_layers / tail mnn (MNN's int8 modules, built on first use):
    the same yardsticks as the two tests above; MNN's modules round activations to int8 per
    block, so they sit further from the exact model (measured: prompt ~6e-4 against the native
    ~6e-7; decode 0.0013 against 6e-7). Slow: MNN's modules are a non-default path and their
    decode is ~0.2 s a token on a busy 2-core machine."""
    from mnn_h2o.essays import essay_tokens
    from mnn_h2o.measure import log_softmax

    ids = essay_tokens(tokenizer, 256)
    prompt, cont = ids[:192], ids[192:]
    exact_all = log_softmax(reference.forward(ids, all_logits=True))
    native = make_llm(4, head_bits=8)
    mnn = make_llm(4, head_bits=8, decode_layers="mnn", prompt_layers="mnn")
    assert mnn._decode_layers is None and mnn.prompt_layers == "mnn"
    kl_prompt = {name: _kl(exact_all, log_softmax(llm.logits(ids))).mean() for name, llm in
                 (("native", native), ("mnn", mnn))}
    assert "layer0" in mnn._modules
    print(f"prompt KL to the exact model: native {kl_prompt['native']:.2e}, MNN's {kl_prompt['mnn']:.2e}")
    assert kl_prompt["native"] < 0.1 * kl_prompt["mnn"]
    exact = exact_all[191:-1]
    runs = {name: _teacher_forced(llm, prompt, cont)[0] for name, llm in (("native", native), ("mnn", mnn))}
    kl_native, kl_mnn = _kl(exact, runs["native"]).mean(), _kl(exact, runs["mnn"]).mean()
    print(f"decode KL to the exact model: native layers {kl_native:.2e}, MNN's {kl_mnn:.2e}")
    assert kl_native < 1.2 * kl_mnn
    assert np.mean(runs["mnn"].argmax(-1) == exact.argmax(-1)) > 0.9

    # The native layers with MNN's tail module (runtime.tail mnn): its inputs written from numpy.
    mixed = make_llm(4, head_bits=8, tail="mnn")
    assert mixed._native_tail is None and mixed._decode_layers is not None
    mixed.prefill(prompt)
    got = log_softmax(np.stack([mixed.decode(t) for t in cont[:8]]).reshape(8, -1))
    assert _kl(runs["native"][1:9], got).max() < 0.05


def test_decode_layers_refuse_a_file_of_another_model(tmp_path, smollm2_gguf):
    from mnn_h2o.export import decode_layer_arrays
    from mnn_h2o.native_layers import load_decode_layers

    c = smollm2_gguf.config
    arrays, _ = decode_layer_arrays(smollm2_gguf)
    arrays["7.down.0"] = arrays["7.down.0"][:, :-20]  # one block short
    np.savez(tmp_path / "decode_layers.npz", **arrays)
    with pytest.raises(ValueError, match="layer 7 down"):
        load_decode_layers(str(tmp_path / "decode_layers.npz"), c, threads=1)
    arrays, _ = decode_layer_arrays(smollm2_gguf)
    arrays["4.wo.types"] = np.array(["Q8_0"])  # a type the decode layers do not hold
    np.savez(tmp_path / "decode_layers.npz", **arrays)
    with pytest.raises(ValueError, match="layer 4 wo.*Q8_0"):
        load_decode_layers(str(tmp_path / "decode_layers.npz"), c, threads=1)
    del arrays["3.qkv.types"]
    np.savez(tmp_path / "decode_layers.npz", **arrays)
    with pytest.raises(KeyError, match="3.qkv.types"):
        load_decode_layers(str(tmp_path / "decode_layers.npz"), c, threads=1)


def test_stored_blocks_are_read_into_the_core_as_stored(tmp_path, smollm2_gguf):
    """load_decode_layers reads each matrix's blocks from the npz straight into the core
    (StoredBlocks: the uncompressed members' byte ranges, checked against the zip's directory):
    the layers it makes compute what layers made from the arrays compute, bit for bit; a file
    cut short is an error naming it, not a matrix of zeros."""
    from mnn_h2o.export import NpzWriter, decode_layer_arrays
    from mnn_h2o.native_layers import decode_layers_from_arrays, load_decode_layers
    from mnn_h2o.stored_arrays import stored_members

    c = smollm2_gguf.config
    arrays, _ = decode_layer_arrays(smollm2_gguf)
    path = tmp_path / "decode_layers.npz"
    with NpzWriter(str(path)) as npz:
        for name, a in arrays.items():
            npz.add(name, a)
    stored = stored_members(str(path))
    blocks = {k for k, a in arrays.items() if a.dtype == np.uint8 and a.ndim == 2}
    assert set(stored) == blocks and blocks  # the blocks, not the norms or type names
    s = stored["5.gate.0"]
    buf = bytearray(s.rows * s.row_bytes)
    s.read_into(buf)
    assert bytes(buf) == arrays["5.gate.0"].tobytes()
    with pytest.raises(ValueError, match="bytes asked"):
        s.read_into(bytearray(10))

    rng = np.random.default_rng(0)
    h0 = rng.standard_normal(c.hidden).astype(np.float32)
    attn = rng.standard_normal(c.n_heads * c.head_dim).astype(np.float32)
    cos, sin = np.ones(c.head_dim, np.float32), np.zeros(c.head_dim, np.float32)
    outs = []
    for layers in (load_decode_layers(str(path), c, threads=1), decode_layers_from_arrays(arrays, c, threads=1)):
        h = h0.copy()
        q, k, v = (np.empty(n * c.head_dim, np.float32) for n in (c.n_heads, c.n_kv_heads, c.n_kv_heads))
        layers.forward(c.n_layers - 1, h, attn, cos, sin, q, k, v)
        outs.append((h, q, k, v))
    assert all(np.array_equal(a, b) for a, b in zip(*outs))

    cut = tmp_path / "cut.npz"
    cut.write_bytes(path.read_bytes())
    s = stored_members(str(cut))["29.down.0"]
    with open(cut, "r+b") as f:
        f.truncate(s.offset + 100)  # the zip's directory is gone too: reading it fails first
    import zipfile

    with pytest.raises(zipfile.BadZipFile):
        load_decode_layers(str(cut), c, threads=1)
    with pytest.raises(ValueError, match="ends inside an array"):
        s.read_into(bytearray(s.rows * s.row_bytes))


def test_native_decode_layers_are_never_a_silent_fallback(tmp_path):
    """An export whose layers the core cannot run (no decode_layers.npz) is refused under
    runtime.decode_layers native with the export's reason, never decoded by MNN's modules."""
    import json

    from mnn_h2o import config
    from mnn_h2o.engine import Llm
    from mnn_h2o.errors import ModelFileError
    from mnn_h2o.export import ensure_exported

    src = ensure_exported(config.defaults()["model"], progress=False)
    with open(f"{src}/model.json") as f:
        meta = json.load(f)
    meta["decode_layers"] = None
    meta["no_decode_layers"] = "blk.3.attn_v.weight is Q5_0; the native decode layers run Q4_0, Q4_1, Q4_K, Q6_K"
    meta["tokenizer"] = f"{src}/{meta['tokenizer']}"
    (tmp_path / "model.json").write_text(json.dumps(meta))
    with pytest.raises(ModelFileError, match="blk.3.attn_v.weight is Q5_0.*runtime.decode_layers=mnn"):
        Llm(str(tmp_path), config.defaults())
