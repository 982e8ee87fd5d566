"""decode_profile: a decode token's split per engine, with medians and spread over the runs, from
bench speed's runs (model-free: an engine whose counters advance by known amounts)."""
import numpy as np
import pytest

from test_bench_speed import EvictingCountingEngine


def test_profile_splits_each_engine_by_its_counters(tokenizer):
    from mnn_h2o.bench.speed import run_speed
    from mnn_h2o.tools.decode_profile import format_profile, profile_rows

    res = run_speed(EvictingCountingEngine(), None, tokenizer, contexts=[32], n_decode=4, repetitions=3,
                    eviction={"enabled": True}, progress=False, measure_quality=False)
    prof = profile_rows(res)["32"]
    assert set(prof) == {"ours", "ours_evict"}
    for p in prof.values():
        assert p["mnn_calls"]["median"] == 1
        assert np.isclose(p["mnn"]["median"], 10.0) and np.isclose(p["attention"]["median"], 4.0)
        assert np.isclose(p["convert"]["median"], 1.0) and np.isclose(p["policy"]["median"], 2.0)
        assert p["total"]["n"] == 3 and p["total"]["min"] <= p["total"]["median"] <= p["total"]["max"]
    table = format_profile({"32": prof})
    assert "| 32 | ours_evict |" in table and "1 / 10.00 (10.00-10.00)" in table


def test_llama_rows_option():
    from mnn_h2o.tools.decode_profile import _llama_rows

    assert _llama_rows("off") == []
    with pytest.raises(SystemExit, match="unknown config"):
        _llama_rows("llama_f32")
