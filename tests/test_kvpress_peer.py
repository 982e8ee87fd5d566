"""The kvpress peer (optional extra): the shared-prefill path equals kvpress's own, and the
extra's absence is reported with an install hint."""
import numpy as np
import pytest

from mnn_h2o.eval import kvpress_peer as K


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
    ours = peer.teacher_forced(prompt, cont, press, ratio, grid_ratios=(2.0, 3.0), grid_presses=("snapkv", "keydiff", press))
    ref, held_layers = _kvpress_own(peer, prompt, cont, press, K.compression_ratio(ratio, len(prompt), len(cont)))
    # Same computation up to float reordering; eager vs eager and sdpa vs sdpa.
    assert np.abs(ours["logp"] - ref).max() < 1e-3
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
    assert held == full == peer.entry_bytes(len(ctx) + len(q) + 4)
    ids, held, full = peer.generate(ctx, q, "tova", 4.0, question_inside=True, max_new_tokens=5)
    assert len(ids) == 5 and full / held == pytest.approx(4.0, rel=0.05)
