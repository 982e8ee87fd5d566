"""The lossless store through the engine on the real SmolLM2 model, with the default config's KV
rows (q8) and eviction (h2o): every lossless mode gives the logits of mode off, bit for bit, and
store mode holds the cold chunks compressed."""
import numpy as np
import pytest

pytestmark = pytest.mark.model

PROMPT, DECODE = 400, 16


@pytest.fixture(scope="module")
def llm():
    from mnn_h2o import config
    from mnn_h2o.engine import Llm

    cfg = config.defaults()
    assert cfg["runtime"]["kv_dtype"] == "q8r" and cfg["eviction"]["enabled"]
    # Eviction from a few hundred tokens on, so that it happens within seconds (the default waits
    # for 3072 tokens); everything else as the default config has it.
    cfg["eviction"].update(trigger_min_tokens=256, update_interval=8)
    return Llm.load("smollm2", cfg, progress=False)


def _run(llm, ids):
    logits = [llm.prefill(ids[:PROMPT])] + [llm.decode(t) for t in ids[PROMPT:]]
    return np.stack(logits), llm.store_stats()


def test_every_lossless_mode_is_bit_identical_on_q8_rows(llm, tokenizer):
    from mnn_h2o import config
    from mnn_h2o.essays import essay_tokens

    ids = essay_tokens(tokenizer, PROMPT + DECODE)
    llm.configure_lossless(None)
    want, _ = _run(llm, ids)
    assert llm.stats.evictions > 0
    for mode in ("probe", "full", "store"):
        llm.configure_lossless(dict(config.defaults()["lossless"], mode=mode))
        got, s = _run(llm, ids)
        np.testing.assert_array_equal(got, want, err_msg=f"lossless.mode {mode} changed the logits")
        assert s["chunks_encoded"] > 0 and s["verify_mismatches"] == 0, (mode, s)
        # (A chunk that does not shrink stays raw, "incompressible": allowed; no other fallback.)
        assert all(n == 0 for why, n in s["fallbacks"].items() if why != "incompressible"), (mode, s["fallbacks"])
        assert s["lossless_ratio"] > 1.0, (mode, s["lossless_ratio"])
        if mode == "store":
            assert s["chunks_held"] > 0 and s["blob_bytes"] < s["stored_raw_bytes"]
        print(f"{llm.kv_dtype} rows, lossless.mode {mode}: lossless ratio {s['lossless_ratio']:.3f} "
              f"({s['chunks_encoded']} chunks encoded)")
    llm.configure_lossless(None)


def test_store_without_eviction_compresses(llm, tokenizer):
    """With eviction off the engine still ends each forward in the cache, where the store makes
    its frames (the front_n layers are in scope without h2o)."""
    from mnn_h2o import config
    from mnn_h2o.essays import essay_tokens

    ids = essay_tokens(tokenizer, PROMPT + DECODE)
    llm.configure_eviction(None)
    want, _ = _run(llm, ids)
    llm.configure_lossless(dict(config.defaults()["lossless"], mode="store"))
    try:
        got, s = _run(llm, ids)
        np.testing.assert_array_equal(got, want)
        assert s["chunks_stored"] > 0 and s["chunks_held"] > 0, s
    finally:
        llm.configure_lossless(None)
        llm.configure_eviction(llm.cfg["eviction"])
