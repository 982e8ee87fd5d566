"""`bench speed`'s time split: where a phase's time goes (MNN / native cache step / glue) is read
from the engine's counters of that phase only."""
from types import SimpleNamespace

import numpy as np
import pytest


class CountingEngine:
    """Advances its counters by known amounts: prefill 0.5 s in MNN and 0.2 s in the cache step,
    each decode step 0.01 s and 0.004 s, plus 0.001 s of copies and 0.002 s of policy and one
    Module.forward call (no real time passes)."""

    def __init__(self):
        self.stats = SimpleNamespace(mnn_s=0.0, attention_s=0.0, kv_bytes_held=123, convert_s=0.0, policy_s=0.0,
                                     mnn_calls=0)

    def reset(self):
        pass

    def prefill(self, ids):
        self.stats.mnn_s += 0.5
        self.stats.attention_s += 0.2
        return np.zeros(8, np.float32)

    def decode(self, tok):
        self.stats.mnn_s += 0.01
        self.stats.attention_s += 0.004
        self.stats.convert_s += 0.001
        self.stats.policy_s += 0.002
        self.stats.mnn_calls += 1
        return np.zeros(8, np.float32)


def test_prefill_and_decode_time_are_split_by_phase():
    from mnn_h2o.measure import time_run

    r = time_run(CountingEngine(), list(range(100)), n_decode=10)
    assert np.isclose(r["prefill_ms"]["mnn"], 5.0) and np.isclose(r["prefill_ms"]["attention"], 2.0)
    assert np.isclose(r["decode_ms"]["mnn"], 10.0) and np.isclose(r["decode_ms"]["attention"], 4.0)
    assert np.isclose(r["decode_ms"]["convert"], 1.0) and np.isclose(r["decode_ms"]["policy"], 2.0)
    assert r["decode_ms"]["mnn_calls"] == 1 and r["prefill_ms"]["mnn_calls"] == 0
    for phase in ("prefill_ms", "decode_ms"):
        d = r[phase]
        assert np.isclose(d["total"], d["mnn"] + d["convert"] + d["attention"] + d["policy"] + d["glue"])
    assert r["kv_bytes_held"] == 123


def test_speed_table_shows_the_prefill_split():
    from mnn_h2o.bench.speed import format_table

    s = lambda m: {"median": m, "min": m, "max": m, "spread": 0.0}
    split = lambda total, mnn, att, pol, conv, glue: {"total": total, "mnn": mnn, "attention": att, "policy": pol,
                                                      "convert": conv, "glue": glue}
    row = {"context": 512, "ours": {"prefill_tps": s(400), "decode_tps": s(80),
                                    "prefill_ms": split(2.5, 2.0, 0.3, 0.1, 0.05, 0.05),
                                    "decode_ms": split(12.5, 10.0, 1.5, 0.5, 0.25, 0.25)},
           "stock": {"prefill_tps": s(450), "decode_tps": s(84)}}
    t = format_table({"512": row}).splitlines()
    assert "prefill ms/token: layers / cache step / glue" in t[0]
    assert "| 2.00 / 0.40 / 0.10 | 10.00 / 2.00 / 0.50 |" in [x for x in t if "| ours |" in x][0]


class EvictingCountingEngine(CountingEngine):
    def configure_eviction(self, section):
        self.eviction = section


def test_speed_runs_without_the_stock_row(tokenizer):
    """--engines without stock (or without ours): no such run, no ratio against it, the table still prints."""
    from mnn_h2o.bench.speed import format_table, run_speed

    res = run_speed(EvictingCountingEngine(), None, tokenizer, contexts=[32], n_decode=2, repetitions=3,
                    eviction={"enabled": True}, progress=False)
    row = res["32"]
    assert {"ours", "ours_evict"} <= set(row) and "stock" not in row
    assert "decode_ratio_ours_evict_vs_ours" in row
    assert not [k for k in row if k.endswith("_vs_stock")]
    assert "| ours_evict |" in format_table(res)
    row = run_speed(EvictingCountingEngine(), None, tokenizer, contexts=[32], n_decode=2, repetitions=3,
                    eviction={"enabled": True}, progress=False, ours_full=False)["32"]
    assert "ours_evict" in row and "ours" not in row and "decode_ratio_ours_evict_vs_ours" not in row


def test_engine_list_names_rows_and_rejects_unknown_ones():
    import argparse

    import pytest

    from mnn_h2o.bench.__main__ import _engine_list

    assert _engine_list("ours_evict, llama_f16") == ["ours_evict", "llama_f16"]
    for bad in ("ours_evict,llama", ",", "stock,f16"):
        with pytest.raises(argparse.ArgumentTypeError, match="unknown engine"):
            _engine_list(bad)


def test_paired_ratio_takes_uneven_work_for_work_and_load_for_noise():
    import numpy as np

    from mnn_h2o.measure import paired_ratio

    rng = np.random.default_rng(0)
    steps = 64
    # The candidate is 1.25x faster, but one step in 32 costs it four (a chunk it encodes), at the
    # same steps in every repetition; the machine's load multiplies both sides of a pair.
    work = np.where(np.arange(steps) % 32 == 5, 4.0, 1.0) * 0.8
    load = lambda: rng.lognormal(0.0, 0.3, steps)
    base, cand = [], []
    for _ in range(3):
        l = load()
        base.append(list(l * (1 + 0.01 * rng.standard_normal(steps))))
        cand.append(list(l * work * (1 + 0.01 * rng.standard_normal(steps))))
    r = paired_ratio(base, cand, block=16)
    assert r["ratio"] == pytest.approx(sum(map(sum, base)) / sum(map(sum, cand)))
    assert r["blocks"] == 12 and r["noise"] < 0.04  # uneven work, heavy load: still a tight interval
    # One repetition cannot tell the encoding steps from noise: a wide interval, never a narrow one.
    assert paired_ratio(base[:1], cand[:1], block=16)["noise"] > 4 * r["noise"]
    # Noise in the pairs themselves (what interleaving cannot cancel) widens it.
    noisy = [list(np.array(c) * rng.lognormal(0.0, 0.3, steps)) for c in cand]
    assert paired_ratio(base, noisy, block=16)["noise"] > 1.3 * r["noise"]
    assert paired_ratio([[1.0] * 8], [[1.0] * 8], block=16)["noise"] == float("inf")
    with pytest.raises(ValueError):
        paired_ratio([[1.0] * 8], [[1.0] * 7])
