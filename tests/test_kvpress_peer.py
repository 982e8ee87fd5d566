"""The kvpress peer (optional extra): the shared-prefill path equals kvpress's own (KVzip
included), the q8 cache is llama.cpp's q8_0 applied after the press, and the extra's absence is
reported with an install hint."""
import numpy as np
import pytest

from mnn_h2o.eval import kvpress_peer as K
from mnn_h2o import q8_0


def test_q8_0_blocks_by_hand():
    x = np.zeros(96, np.float32)
    # Block 0: max |x| = 127 (negative), so d = 1 exactly: codes are x rounded, ties away from zero.
    x[:8] = [-127, 0.5, -0.5, 1.5, 2.5, -2.5, 126.4, 0.49]
    # Block 1: all zero. Block 2: d = 1/127, stored as fp16 0.00787353515625 (2^-7 + 8 * 2^-17).
    x[64:68] = [1.0, -0.25, 0.1, 0.0]
    codes, scales = q8_0.quantize(x)
    assert codes.dtype == np.int8 and scales.dtype == np.float16 and scales.shape == (3,)
    assert codes[:8].tolist() == [-127, 1, -1, 2, 3, -3, 126, 0]
    assert not codes[8:64].any() and scales[1] == 0
    assert codes[64:68].tolist() == [127, -32, 13, 0]  # -31.75 -> -32, 12.7 -> 13
    assert scales.astype(np.float64).tolist() == [1.0, 0.0, 0.00787353515625]
    back = q8_0.fake(x).astype(np.float64)
    assert back[:8].tolist() == [-127, 1, -1, 2, 3, -3, 126, 0]
    assert back[64:67].tolist() == [127 * 0.00787353515625, -32 * 0.00787353515625, 13 * 0.00787353515625]
    # A negative max with an inexact scale: d = 3/127 -> fp16 2^-6 + 524 * 2^-16; 1.0 -> 42.33 -> 42.
    y = np.zeros(32, np.float32)
    y[:2] = [-3.0, 1.0]
    c, d = q8_0.quantize(y)
    assert c[:2].tolist() == [-127, 42] and float(d[0]) == 0.02362060546875
    assert q8_0.fake(y)[:2].astype(np.float64).tolist() == [-127 * 0.02362060546875, 42 * 0.02362060546875]
    # Bytes: 32 int8 codes + a 2-byte scale per 32 values, 34/64 of f16.
    assert q8_0.row_bytes(64) == 68 and q8_0.gain() == 64 / 34 == K.dtype_gain("q8")
    with pytest.raises(ValueError, match="multiple of 32"):
        q8_0.quantize(np.zeros(48, np.float32))


def test_q8_press_ratio_pays_the_dtype_part_first():
    # 3.2x whole-model on q8_0: the type makes 64/34, eviction 3.2 * 34/64 = 1.7.
    cr = K.press_ratio(3.2, "q8", 4096, 256)
    assert cr == pytest.approx(K.compression_ratio(1.7, 4096, 256))
    assert K.press_ratio(1.5, "q8", 4096, 256) == 0.0  # q8 alone already exceeds 1.5x
    assert K.press_ratio(3.2, "f16", 4096, 256) == K.compression_ratio(3.2, 4096, 256)
    with pytest.raises(ValueError, match="f16, q8"):
        K.press_ratio(3.2, "q4", 4096, 256)


def test_compression_ratio_meets_the_whole_model_target():
    # 4096 prompt + 256 later tokens at 8x: 4352/8 = 544 held, 288 of them from the prompt.
    cr = K.compression_ratio(8.0, 4096, 256)
    assert abs((4096 * (1 - cr) + 256) - 4352 / 8) < 1e-9
    assert K.compression_ratio(1.0, 4096, 256) == 0.0
    assert K.compression_ratio(2.0, 100, 0) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="out of reach"):
        K.compression_ratio(8.0, 100, 256)


def test_missing_extra_names_what_to_install(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_kvpress(name, *a, **kw):
        if name == "kvpress":
            raise ImportError("no kvpress")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_kvpress)
    with pytest.raises(K.PeerUnavailable, match=r"cannot import .*kvpress \(no kvpress\).*pip install '\.\[compare\]'"):
        K.check()


def test_unknown_press_is_refused():
    with pytest.raises(ValueError, match="unknown kvpress press"):
        K.make_press("h2o", 0.5)


@pytest.fixture(scope="module")
def peer():
    try:
        K.check()
    except K.PeerUnavailable as e:
        pytest.skip(str(e))
    from mnn_h2o.model_source import resolve_gguf

    return K.KvpressPeer(resolve_gguf("smollm2"), threads=2)  # a fresh model for this module


def _kvpress_own(peer, prompt, cont, press_name, cr):
    """kvpress's documented path: prefill under ``with press(model)``, then the continuation."""
    import torch
    from transformers import DynamicCache

    press = K.make_press(press_name, cr)
    model = peer._model("eager" if K.PRESSES[press_name][1] else "sdpa")
    cache = DynamicCache()
    with torch.inference_mode():
        with press(model):
            model.model(input_ids=torch.tensor([prompt]), past_key_values=cache)
        held = sum(cache.layers[i].keys.shape[2] for i in range(len(cache.layers)))
        pos = torch.arange(len(prompt), len(prompt) + len(cont))[None]
        logits = model(input_ids=torch.tensor([cont]), past_key_values=cache, position_ids=pos).logits[0]
    return torch.log_softmax(logits.float(), -1).numpy(), held


# adakv_expected first: on a fresh model, before kvpress's own path has set anything up.
@pytest.mark.slow
@pytest.mark.parametrize("press", ["adakv_expected", "snapkv", "observed"])
def test_shared_prefill_equals_kvpress_own_path(peer, press):
    rng = np.random.default_rng(0)
    prompt = [int(x) for x in rng.integers(200, 20000, 384)]
    cont = [int(x) for x in rng.integers(200, 20000, 16)]
    ratio = 3.0
    grid = [(p, "f16") for p in ("snapkv", "keydiff", press)]
    ours = peer.teacher_forced(prompt, cont, press, ratio, grid_ratios=(2.0, 3.0), grid_methods=grid)
    ref, held_layers = _kvpress_own(peer, prompt, cont, press, K.compression_ratio(ratio, len(prompt), len(cont)))
    # Same computation up to float reordering; eager vs eager and sdpa vs sdpa. Our row i
    # predicts cont[i] (row 0 from the prefill), kvpress's row i cont[i + 1].
    assert np.abs(ours["logp"][1:] - ref[:-1]).max() < 1e-3
    assert ours["ratio"] == pytest.approx(ratio, rel=0.02)
    if press != "adakv_expected":  # AdaKV masks instead of dropping: kvpress still holds every entry
        assert held_layers == ours["bytes_held"] // (2 * peer.head_dim * 2 * peer.n_kv_heads) - peer.n_layers * len(cont)
    full = peer.teacher_forced(prompt, cont, None, 1.0)
    assert full["bytes_held"] == full["bytes_full"]
    assert np.abs(full["logp"] - ours["logp"]).max() > 1e-3  # compression changed something


@pytest.mark.slow
def test_generate_places_the_question_inside_or_after(peer):
    rng = np.random.default_rng(1)
    ctx = [int(x) for x in rng.integers(200, 20000, 300)]
    q = [int(x) for x in rng.integers(200, 20000, 12)]
    full_in, held, full = peer.generate(ctx, q, None, 1.0, question_inside=True, max_new_tokens=5)
    full_after, _, _ = peer.generate(ctx, q, None, 1.0, question_inside=False, max_new_tokens=5)
    assert full_in == full_after  # without compression the placement cannot matter
    assert held == full == peer.token_bytes(len(ctx) + len(q) + 4)
    ids, held, full = peer.generate(ctx, q, "tova", 4.0, question_inside=True, max_new_tokens=5)
    assert len(ids) == 5 and full / held == pytest.approx(4.0, rel=0.05)


class _DecodeQ8Cache:
    """The test's own q8_0 cache for token-by-token decoding: entries quantised as written."""

    @staticmethod
    def make():
        import torch
        from transformers import DynamicCache

        class Q8(DynamicCache):
            def update(self, k, v, layer_idx, cache_kwargs=None):
                def q(t):
                    return torch.from_numpy(q8_0.fake(t.numpy()))

                return super().update(q(k), q(v), layer_idx, cache_kwargs)

        return Q8()


@pytest.mark.slow
def test_q8_is_press_then_quantise(peer):
    """snapkv@q8 = kvpress's own snapkv prefill, every kept entry then stored as q8_0, the
    continuation decoded token by token with its entries quantised as written."""
    import torch
    from transformers import DynamicCache

    rng = np.random.default_rng(2)
    prompt = [int(x) for x in rng.integers(200, 20000, 384)]
    cont = [int(x) for x in rng.integers(200, 20000, 12)]
    ours = peer.teacher_forced(prompt, cont, "snapkv", 3.2, kv_dtype="q8",
                               grid_ratios=(3.2,), grid_methods=[("snapkv", "q8"), ("snapkv", "f16")])
    cr = K.press_ratio(3.2, "q8", len(prompt), len(cont))
    model = peer._model("sdpa")
    cache = DynamicCache()
    with torch.inference_mode():
        with K.make_press("snapkv", cr)(model):
            first = model(input_ids=torch.tensor([prompt]), past_key_values=cache).logits[0, -1]
        q8 = _DecodeQ8Cache.make()
        for i in range(len(cache.layers)):
            q8.update(cache.layers[i].keys, cache.layers[i].values, i)
        rows = [first]
        for i, t in enumerate(cont[:-1]):
            rows.append(model(input_ids=torch.tensor([[t]]), past_key_values=q8,
                              position_ids=torch.tensor([[len(prompt) + i]])).logits[0, -1])
    ref = torch.log_softmax(torch.stack(rows).float(), -1).numpy()
    # One batch and token by token compute the continuation's K/V with another float order
    # (~1e-6 apart): now and then a value crosses a q8_0 rounding boundary, a one-code step
    # (measured: max |d logp| 0.01 but KL < 3e-6; without q8 the two agree to 3e-5).
    kl = np.sum(np.exp(ref) * (ref - ours["logp"]), -1)
    assert np.abs(ours["logp"][0] - ref[0]).max() < 1e-3 and kl.max() < 1e-4
    # Bytes at q8_0 size: 68 bytes per 64-value row, K and V; whole-model ratio ~3.2 against f16.
    # (+ 1: the last continuation token, written at the end but not fed here)
    entries = sum(q8.layers[i].keys.shape[1] * (q8.layers[i].keys.shape[2] + 1) for i in range(len(q8.layers)))
    assert ours["bytes_held"] == entries * 2 * 68
    assert ours["ratio"] == pytest.approx(3.2, rel=0.02)
    f16 = peer.teacher_forced(prompt, cont, "snapkv", 3.2 / q8_0.gain(), kv_dtype="f16",
                              grid_ratios=(3.2,), grid_methods=[("snapkv", "q8"), ("snapkv", "f16")])
    assert f16["bytes_held"] == pytest.approx(ours["bytes_held"] * 64 / 34, rel=1e-9)  # same entries kept
    kl_q8 = np.sum(np.exp(f16["logp"]) * (f16["logp"] - ours["logp"]), -1)
    assert kl_q8.mean() > 10 * kl.max()  # and quantising them changed more than float order does
    full_q8 = peer.teacher_forced(prompt, cont, None, 1.0, kv_dtype="q8")
    assert full_q8["bytes_full"] / full_q8["bytes_held"] == pytest.approx(64 / 34)


@pytest.mark.slow
def test_kvzip_equals_kvpress_own_path(peer):
    """KVzip at two ratios from one reconstruction equals kvpress's own ``with press(model)``
    run at each (same pruned entries, same log-probabilities); and its @q8 is the same cut."""
    import torch
    from transformers import DynamicCache

    rng = np.random.default_rng(3)
    prompt = [int(x) for x in rng.integers(200, 20000, 384)]
    cont = [int(x) for x in rng.integers(200, 20000, 12)]
    grid = dict(grid_ratios=(2.0, 3.0), grid_methods=[("kvzip", "f16"), ("kvzip", "q8"), ("snapkv", "f16")])
    model = peer._model("sdpa")
    for ratio in (2.0, 3.0):
        ours = peer.teacher_forced(prompt, cont, "kvzip", ratio, **grid)
        press = K.make_press("kvzip", K.compression_ratio(ratio, len(prompt), len(cont)))
        cache = DynamicCache()
        with torch.inference_mode():
            with K.kvzip_tokenizer(peer.tokenizer), press(model):  # kvpress's own path; our tokenizer
                model.model(input_ids=torch.tensor([prompt]), past_key_values=cache)
            masked = [layer.self_attn.masked_key_indices for layer in model.model.layers]
            pos = torch.arange(len(prompt), len(prompt) + len(cont) - 1)[None]
            logits = model(input_ids=torch.tensor([cont[:-1]]), past_key_values=cache, position_ids=pos).logits[0]
        for layer in model.model.layers:
            layer.self_attn.masked_key_indices = None
        ref = torch.log_softmax(logits.float(), -1).numpy()
        assert np.abs(ours["logp"][1:] - ref).max() < 1e-3
        pruned = sum(len(m[0]) for m in masked)
        entries = peer.n_layers * peer.n_kv_heads * (len(prompt) + len(cont))
        assert ours["bytes_held"] == peer.entry_bytes(entries - pruned)
        assert ours["ratio"] == pytest.approx(ratio, rel=0.02)
        mine = peer._caches[("kvzip", K.compression_ratio(ratio, len(prompt), len(cont)))]
        assert all(torch.equal(torch.stack(a), torch.stack(b)) for (_, _, a), b in zip(mine, masked))
    q8 = peer.teacher_forced(prompt, cont, "kvzip", 3.0, kv_dtype="q8", **grid)
    assert q8["ratio"] == pytest.approx(3.0, rel=0.02)


def test_kvzip_structure_cuts_scores_like_our_cache():
    torch = pytest.importorskip("torch")
    from mnn_h2o.eval.kvzip_structure import cut_scores

    s = torch.arange(40, dtype=torch.float32).reshape(1, 1, 1, 40) % 7  # [layers, batch, heads, tokens]
    assert torch.equal(cut_scores(s, "token", 40, 16, 4, 8), s)
    blocks = cut_scores(s, "block", 40, 16, 4, 8)[0, 0, 0]
    for b0 in (0, 16, 32):  # every token carries its block's peak; the last block is partial
        assert torch.all(blocks[b0:b0 + 16] == s[0, 0, 0, b0:b0 + 16].max())
    floors = cut_scores(s, "token_floors", 40, 16, 4, 8)[0, 0, 0]
    top = floors.max()
    assert torch.all(floors[:4] == top) and torch.all(floors[-8:] == top) and top > s.max()
    assert torch.equal(floors[4:32], s[0, 0, 0, 4:32])
