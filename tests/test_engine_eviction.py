"""H2O eviction through the engine, on the real SmolLM2 model."""
import numpy as np
import pytest

from conftest import make_llm

pytestmark = pytest.mark.model


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.fixture(scope="module")
def llm():
    return make_llm(8)


def test_scores_collected_but_nothing_evicted_is_bit_identical(llm, tokenizer):
    from mnn_h2o.essays import essay_tokens

    ids = essay_tokens(tokenizer, 700)
    llm.configure_eviction(None)
    off = [llm.prefill(ids[:600])] + [llm.decode(t) for t in ids[600:640]]
    llm.configure_eviction({"trigger_min_tokens": 100000})   # on, collecting scores, never evicting
    on = [llm.prefill(ids[:600])] + [llm.decode(t) for t in ids[600:640]]
    assert llm.stats.evictions == 0
    np.testing.assert_array_equal(np.stack(off), np.stack(on))
    llm.configure_eviction(None)


def test_eviction_frees_memory_and_reaches_the_target(llm, tokenizer):
    from mnn_h2o.essays import essay_tokens

    ids = essay_tokens(tokenizer, 1024 + 64)
    llm.configure_eviction(None)
    llm.prefill(ids[:1024])
    full_held = llm.stats.kv_bytes_held
    llm.configure_eviction({"policy": "h2o", "layer_budget": "uniform", "target_lossy_ratio": 2.5, "update_interval": 16,
                       "layer_start": 2, "prefill_eviction": "chunk", "trigger_min_tokens": 256})
    rss0 = _rss()
    logits = llm.prefill(ids[:1024])
    held_after_prefill = llm.stats.kv_bytes_held
    for t in ids[1024:]:
        logits = llm.decode(t)
    s = llm.stats
    stats = llm.cache.eviction_stats()
    print(f"full {full_held / 2**20:.1f} MiB, H2O {s.kv_bytes_held / 2**20:.1f} MiB, lossy ratio "
          f"{s.lossy_ratio:.2f} (decode avg {s.lossy_ratio_decode_avg:.2f}), RSS change {(_rss() - rss0) / 2**20:+.1f} MiB")
    assert held_after_prefill < full_held / 2
    assert 2.2 < s.lossy_ratio <= 2.6 and s.lossy_ratio_decode_avg > 2.2
    assert stats["bytes_held"] == s.kv_bytes_held
    assert s.evictions >= 2                            # after prefill and during decode
    assert all(l["evictions"] == 0 for l in stats["layers"][:2])   # layers 0-1 keep everything
    assert np.isfinite(logits).all()
    # the freed blocks went back to the OS: the H2O run's prefill did not grow RSS by a full cache
    assert _rss() - rss0 < full_held * 0.75
    llm.configure_eviction(None)


def test_generation_stays_coherent_under_eviction(llm):
    text = ("Paris is the capital and largest city of France. " * 3 +
            "Here is a long story about the history of the city. ") * 20
    llm.configure_eviction({"target_lossy_ratio": 2.0, "trigger_min_tokens": 256})
    g = llm.generate(text + "\nQuestion: What is the capital of France?\nAnswer:", max_new_tokens=6, chat=False)
    assert llm.stats.evictions >= 1 and llm.stats.lossy_ratio > 1.5
    assert "Paris" in g.text, g.text
    llm.configure_eviction(None)


def test_prefill_eviction_end_cuts_the_prompt_once(llm, tokenizer):
    from mnn_h2o.essays import essay_tokens

    ids = essay_tokens(tokenizer, 1024)  # 4 prefill chunks of 256
    held = {}
    for mode in ("chunk", "end"):
        llm.configure_eviction({"policy": "h2o", "target_lossy_ratio": 2.5, "trigger_min_tokens": 256,
                           "prefill_eviction": mode})
        llm.prefill(ids)
        held[mode] = (llm.stats.evictions, llm.stats.lossy_ratio, llm.stats.kv_bytes_peak)
    assert held["chunk"][0] >= 2 and held["end"][0] == 1      # forwards that evicted
    assert 2.2 < held["end"][1] <= 2.6                           # the same target at the end
    assert held["end"][2] > held["chunk"][2]                     # but the whole prompt at the peak
    llm.configure_eviction(None)
