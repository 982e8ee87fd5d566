"""The frontier suite: metrics, needle scoring, domains and splits, method names, aggregation,
and one `eval frontier --quick` run on the real model."""
import json
import math

import numpy as np
import pytest

from mnn_h2o.eval import domains as D
from mnn_h2o.eval import frontier as F
from mnn_h2o.eval import needle as N
from mnn_h2o.eval.quality import metrics


def test_metrics_by_hand():
    # Two positions over a 3-token vocabulary.
    p = np.array([[0.5, 0.25, 0.25], [0.1, 0.6, 0.3]])
    q = np.array([[0.25, 0.5, 0.25], [0.1, 0.3, 0.6]])
    cont = [1, 2]  # the true next tokens
    m = metrics(np.log(p), np.log(q), cont)
    kl0 = 0.5 * math.log(0.5 / 0.25) + 0.25 * math.log(0.25 / 0.5)  # third term is 0
    kl1 = 0.6 * math.log(0.6 / 0.3) + 0.3 * math.log(0.3 / 0.6)
    assert m["kl"] == pytest.approx((kl0 + kl1) / 2, rel=1e-12)
    assert m["top1"] == 0.0  # argmax 0 vs 1, then 1 vs 2
    assert m["ppl"] == pytest.approx(math.exp(-(math.log(0.5) + math.log(0.6)) / 2))
    assert m["ppl_full"] == pytest.approx(math.exp(-(math.log(0.25) + math.log(0.3)) / 2))
    assert m["ppl_delta"] == pytest.approx(m["ppl"] - m["ppl_full"])
    same = metrics(np.log(p), np.log(p), cont)
    assert same["kl"] == 0.0 and same["top1"] == 1.0 and same["ppl_delta"] == 0.0


@pytest.mark.parametrize("answer,value,hit", [
    (" 4821. Remember it", "4821", True),
    (" 4 8 2 1", "4821", True),
    (" 4812", "4821", False),
    (" Lisbon, the capital", "Lisbon", True),
    (" lisbon", "Lisbon", True),
    (" the city of Lisb", "Lisbon", False),
    ("", "Lisbon", False),
    ("anything", "", False),
])
def test_needle_scorer(answer, value, hit):
    assert N.is_hit(answer, value) is hit


def test_domain_windows_split_and_are_fixed(tokenizer):
    for d in D.DOMAINS:
        ids = D.stream(tokenizer, d)
        w = D.window_offsets(len(ids))
        assert len(w["test"]) == len(w["dev"]) == D.SPLIT_WINDOWS
        assert not set(w["test"]) & set(w["dev"])
        assert all(o % D.WINDOW_TOKENS == 0 and o + D.WINDOW_TOKENS <= len(ids) for o in w["test"] + w["dev"])
        assert w == D.window_offsets(len(ids))
        segs = D.segments(tokenizer, d, "test", 4096, 256, 2)
        assert [len(s.prompt) for s in segs] == [4096, 4096]
        assert [len(s.continuation) for s in segs] == [256, 256]
        assert segs[0].prompt + segs[0].continuation == ids[segs[0].offset:segs[0].offset + 4352]
    with pytest.raises(ValueError, match="exceed a window"):
        D.segments(tokenizer, "essays", "test", 8000, 256, 1)
    with pytest.raises(ValueError, match="unknown domain"):
        D.segments(tokenizer, "poetry", "test", 100, 10, 1)


def test_needle_trials(tokenizer):
    ts = N.trials(tokenizer, "test")
    assert len(ts) == len(N.NEEDLES) * len(N.DEPTHS) * len(N.LENGTHS) == 30
    assert sorted({t.domain for t in ts}) == sorted(N.HAYSTACK_DOMAINS)
    assert abs(sum(t.domain == "essays" for t in ts) - 15) <= 3
    for t in ts:
        assert len(t.context) + len(t.question) == t.length
        text = tokenizer.decode(list(t.context))
        assert t.value in text
        # The needle sits at its relative depth (within the fact's own length).
        at = text.index(t.value) / len(text)
        assert abs(at - t.depth) < 0.05
    again = N.trials(tokenizer, "test")
    assert [t.value for t in again] == [t.value for t in ts]
    dev = N.trials(tokenizer, "dev")
    assert dev[0].context != ts[0].context


def test_method_names_come_from_the_config_schema():
    ms = F.parse_methods("ours", ["snapkv"])
    assert [m.name for m in ms] == ["ours:none"] + [f"ours:{p}" for p in F.our_policies()]
    assert F.parse_methods("kvpress:snapkv,ours:none@f32", ["snapkv"])[1].name == "ours:none@f32"
    assert [m.name for m in F.parse_methods("kvpress@q8,kvpress:kvzip", ["snapkv", "kvzip"])] == [
        "kvpress:none@q8", "kvpress:snapkv@q8", "kvpress:kvzip@q8", "kvpress:kvzip"]
    for bad, msg in (("ours:lru", "unknown policy"), ("kvpress:foo", "unknown press"), ("kvpress:snapkv@q4", "f16, q8"),
                     ("vllm:h2o", "unknown engine"), ("ours:h2o@q3", "unknown kv dtype"), ("", "no methods")):
        with pytest.raises(ValueError, match=msg):
            F.parse_methods(bad, ["snapkv"])


def test_methods_help_lists_every_kv_dtype_of_the_schema():
    """The --methods help is written from the schema's list, so it names every type there is."""
    import re

    from mnn_h2o import config
    from mnn_h2o.eval.__main__ import _parser

    frontier_cli = next(a for a in _parser()._actions if a.dest == "command").choices["frontier"]
    help_text = next(a for a in frontier_cli._actions if a.dest == "methods").help
    listed = re.search(r"kv_dtype: ours ([^;]+);", help_text).group(1).split(", ")
    assert listed == list(config.key("runtime.kv_dtype").choices)


def test_aggregate_rows():
    def run(method, policy, seg, kl, target=2.0, engine="ours"):
        return {"kind": "kl", "method": method, "engine": engine, "kv_dtype": "f16", "policy": policy,
                "target_ratio": target, "split": "test", "domain": "prose", "segment": seg,
                "prompt_tokens": 4096, "bytes_held": 100 + seg, "ratio": 2.0 + seg, "kl": kl,
                "kl_exact": 2 * kl, "top1": 0.5, "ppl_delta": 1.0}

    def trial(method, policy, i, hit, target=2.0):
        return {"kind": "needle", "method": method, "engine": "ours", "kv_dtype": "f16", "policy": policy,
                "target_ratio": target, "split": "test", "placement": "inside", "needle": "n", "depth": 0.5,
                "length": 100 * i, "value": "v",
                "domain": "essays" if i % 2 else "prose", "hit": hit, "bytes_held": 0, "ratio": None}

    runs = [run("ours:h2o", "h2o", 0, 0.1), run("ours:h2o", "h2o", 1, 0.3),
            trial("ours:none", "none", 0, True, None), trial("ours:none", "none", 1, True, None),
            trial("ours:h2o", "h2o", 0, True), trial("ours:h2o", "h2o", 1, False)]
    rows = F.aggregate(runs)
    kl = [r for r in rows if r["kind"] == "kl"]
    assert len(kl) == 1 and kl[0]["kl"] == pytest.approx(0.2) and kl[0]["segments"] == 2
    assert kl[0]["kl_exact"] == pytest.approx(0.4)
    assert kl[0]["ratio"] == pytest.approx(2.5) and kl[0]["bytes_held"] == pytest.approx(100.5)
    nd = {r["method"]: r for r in rows if r["kind"] == "needle"}
    assert (nd["ours:h2o"]["needle_hits"], nd["ours:h2o"]["needle_trials"]) == (1, 2)
    assert nd["ours:h2o"]["needle_hits_full"] == 2 and nd["ours:h2o"]["domain"] == "essays+prose"
    for r in rows:
        assert set(F.ROW_KEYS) <= set(r)


@pytest.mark.model
@pytest.mark.slow  # every policy over three domains: minutes on 2 cores
def test_frontier_quick_runs(tmp_path):
    from mnn_h2o.eval.__main__ import main

    out = tmp_path / "f.json"
    methods = "ours,ours:none@q8,ours:h2o@q8"
    assert main(["frontier", "--quick", "--methods", methods, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = data["rows"]
    kl = [r for r in rows if r["kind"] == "kl"]
    assert {r["domain"] for r in kl} == set(D.DOMAINS)
    # Every policy, but predicted_kvzip only where its scorer is fitted (a bare `ours` skips it
    # with a note otherwise; fitting takes minutes).
    every = {"ours:none", "ours:none@q8", "ours:h2o@q8"} | {f"ours:{p}" for p in F.our_policies()}
    assert every - {"ours:predicted_kvzip"} <= {r["method"] for r in kl} <= every
    for r in kl:
        assert r["bytes_held"] > 0 and r["kl"] >= 0 and 0 <= r["top1"] <= 1
        if r["method"] == "ours:none":
            assert r["kl"] == 0 and r["ratio"] < 1.01
        elif r["method"] == "ours:none@q8":  # rows of 68 bytes instead of 128, blocks rounded to 64
            assert 1.8 < r["ratio"] < 1.89 and 0 < r["kl"] < 0.01 and r["kv_dtype"] == "q8", r
        else:  # really evicted: the measured ratio is near the target of 2
            assert 1.6 < r["ratio"] < 2.3, r
    nd = [r for r in rows if r["kind"] == "needle"]
    assert {r["placement"] for r in nd if r["policy"] != "none"} == set(N.PLACEMENTS)
    assert all(r["needle_trials"] == 1 for r in nd)
    assert data["meta"]["domains"]["prose"]["sources"][0].startswith("pydoc_data/topics.py")
    for suffix in ("_kl.png", "_top1.png", "_needle.png", ".md"):
        assert (tmp_path / ("f" + suffix)).stat().st_size > 0
    n_runs = len(data["runs"])
    with pytest.raises(ValueError, match="exists: pass --resume"):  # never overwritten silently
        F.Results(str(out), data["meta"], resume=False)
    # --resume with nothing left to do runs nothing and keeps every run.
    assert main(["frontier", "--quick", "--methods", methods, "--json", str(out), "--resume"]) == 0
    assert len(json.loads(out.read_text())["runs"]) == n_runs


@pytest.mark.model
@pytest.mark.slow
def test_frontier_quick_with_the_kvpress_peer(tmp_path):
    """Both engines side by side: each against its own full cache, a comparison table written."""
    from mnn_h2o.eval import kvpress_peer

    try:
        kvpress_peer.check()
    except kvpress_peer.PeerUnavailable as e:
        pytest.skip(str(e))
    from mnn_h2o.eval.__main__ import main

    out = tmp_path / "p.json"
    assert main(["frontier", "--quick", "--methods", "ours:h2o,kvpress:snapkv,kvpress:observed",
                 "--domains", "essays", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    kl = {r["method"]: r for r in rows if r["kind"] == "kl"}
    assert set(kl) == {"ours:none", "ours:h2o", "kvpress:none", "kvpress:snapkv", "kvpress:observed"}
    assert kl["kvpress:none"]["kl"] == 0 and kl["kvpress:none"]["ratio"] == 1
    for m in ("kvpress:snapkv", "kvpress:observed"):
        assert kl[m]["kl"] > 0 and abs(kl[m]["ratio"] - 2) < 0.05
    nd = [r for r in rows if r["kind"] == "needle" and r["engine"] == "kvpress" and r["policy"] != "none"]
    assert {r["placement"] for r in nd} == set(N.PLACEMENTS) and all(r["bytes_held"] > 0 for r in nd)
    assert "press KL / ours" in (tmp_path / "p.md").read_text()


def test_peer_comparison_is_at_equal_measured_memory():
    def kl_row(engine, policy, ratio, kl):
        return {"kind": "kl", "engine": engine, "policy": policy, "kv_dtype": "f16", "ratio": ratio, "kl": kl,
                "domain": "prose", "prompt_tokens": 4096, "target_ratio": None, "method": f"{engine}:{policy}"}

    rows = [kl_row("ours", "none", 1.0, 0.0), kl_row("ours", "h2o", 2.0, 0.02), kl_row("ours", "h2o", 4.0, 0.06),
            kl_row("ours", "random", 2.0, 0.001),  # a control, never "our best"
            kl_row("kvpress", "none", 1.0, 0.0),
            kl_row("kvpress", "snapkv", 2 ** 1.5, 0.02),  # halfway in log ratio between 2 and 4: ours 0.04
            kl_row("kvpress", "snapkv", 6.0, 0.01),       # past our last point: not compared
            kl_row("kvpress", "tova", 4.04, 0.03)]        # 1% past it: the same target, compared there
    text = F.peer_comparison(rows)
    assert "| prose | 4096 | snapkv | 2.83 | 0.02 | h2o | 0.04 | 0.50 |" in text
    assert "| snapkv | 1 | 1 | 0.50 | 0.50-0.50 | 1 |" in text
    assert "| prose | 4096 | tova | 4.04 | 0.03 | h2o | 0.06 | 0.50 |" in text
    assert F.peer_comparison([r for r in rows if r["engine"] == "ours"]) == ""


def test_factor_variants_and_keep_for_end():
    from mnn_h2o import config
    from mnn_h2o.eval import factors

    # The end state of a cache that cuts only the prompt meets the target.
    keep = factors.keep_for_end(30, 28, 4096, 255, 3.2)
    assert 30 * 4351 / (2 * 4351 + 28 * (keep * 4096 + 255)) == pytest.approx(3.2)
    v = factors.combine("layers0+floors16")
    assert v.overrides == {"eviction.layer_start": 0, "eviction.sink_tokens": 16, "eviction.recent_tokens": 16}
    assert factors.combine("prefill_end+no_decode").keep_for_end
    with pytest.raises(ValueError, match="unknown variant"):
        factors.parse_variants("base,layers9")
    for name, var in factors.VARIANTS.items():  # every variant is a valid config
        config.load(None, dict(var.overrides))
    runs = [dict(variant="base", target_ratio=3.2, domain=d, prompt_tokens=n, segment=0, kl=kl, top1=0.9,
                 ratio=3.1) for d, n, kl in [("essays", 4096, 0.01), ("code", 4096, 0.03)]]
    t = factors.table(runs)
    assert "| base | 3.2 | 0.0300 | 0.0100 | 0.0200 | 0.0200 | 0.900 | 3.10 |" in t


def test_q8_split_is_one_rule_for_ours_and_the_peer():
    """A whole-model target on q8: the type pays 64/34 (ours and llama.cpp's q8_0 count the same
    bytes), eviction the rest; tests/test_eviction.py checks the native cache keeps what this says."""
    from mnn_h2o.eval.quality import eviction_target

    assert F.dtype_gain("ours", "q8") == F.dtype_gain("kvpress", "q8") == 64 / 34
    assert eviction_target(3.2, F.dtype_gain("kvpress", "q8")) == pytest.approx(1.7)
    assert eviction_target(1.5, F.dtype_gain("ours", "q8")) == 1.0
    assert F._targets(F.Method("kvpress", "snapkv", "q8"), [1.5, 3.2]) == [3.2]
    assert F._targets(F.Method("ours", "h2o", "q8"), [1.5, 3.2]) == [3.2]


@pytest.fixture(scope="module")
def exact_model(smollm2_path):
    from mnn_h2o.gguf_model import GgufModel
    from mnn_h2o.reference import ReferenceModel

    return ReferenceModel(GgufModel(smollm2_path), np.float32)


@pytest.mark.model
def test_exact_model_in_float32_is_float64s(smollm2_path, exact_model, tokenizer):
    from mnn_h2o.gguf_model import GgufModel
    from mnn_h2o.reference import ReferenceModel

    seg = D.segments(tokenizer, "essays", "dev", 40, 8, 1)[0]
    f32 = F.exact_logp(exact_model, seg.prompt, seg.continuation)
    f64 = F.exact_logp(ReferenceModel(GgufModel(smollm2_path), np.float64), seg.prompt, seg.continuation)
    assert f32.shape == (8, exact_model.cfg.vocab)
    m = metrics(f64, f32, seg.continuation)
    assert m["kl"] < 1e-6 and m["top1"] == 1.0
    # Row i predicts continuation[i]: the exact model puts far more than chance mass on it.
    assert m["ppl"] < 1000


@pytest.mark.model
def test_kl_exact_is_computed_once_per_segment(tokenizer, exact_model, monkeypatch):
    """ours:none is our full cache (KL 0) but not the exact model (kl_exact > 0, small); q8 moves
    it further; the exact model runs once for the segment, whatever the number of methods."""
    from mnn_h2o import config

    seg = D.segments(tokenizer, "prose", "dev", 160, 12, 1)[0]
    eng = F.OursEngine(config.load(None, {}))
    eng._exact = exact_model
    calls = []
    real = F.exact_logp
    monkeypatch.setattr(F, "exact_logp", lambda *a: calls.append(1) or real(*a))
    res = F.Results(None, {"settings": {}}, resume=False)
    methods = [F.Method("ours", "none"), F.Method("ours", "none", "q8"), F.Method("ours", "none", "f32")]
    F.kl_sweep({"ours": eng}, methods, [2.0], [seg], res, lambda: None)
    assert len(calls) == 1
    runs = {r["method"]: r for r in res.runs}
    assert runs["ours:none"]["kl"] == 0 and 0 < runs["ours:none"]["kl_exact"] < 0.1
    assert runs["ours:none@q8"]["kl"] > 0 and runs["ours:none@q8"]["kl_exact"] > 0
    rows = F.aggregate(res.runs)
    assert all(r["kl_exact"] == runs[r["method"]]["kl_exact"] for r in rows)
    assert "| KL exact |" in F.table(rows)


@pytest.mark.model
def test_both_engines_exact_models_agree(tokenizer, exact_model, smollm2_path):
    """The peer's exact model (its float32 full cache) and ours (the numpy reference) are the
    same model: KL ~0 between them; the peer's full cache has kl_exact 0 by construction."""
    from mnn_h2o.eval import kvpress_peer

    try:
        kvpress_peer.check()
    except kvpress_peer.PeerUnavailable as e:
        pytest.skip(str(e))
    seg = D.segments(tokenizer, "code", "dev", 160, 12, 1)[0]
    peer = F.PeerEngine(smollm2_path, 2, tokenizer, [], [2.0])
    full = peer.teacher_forced(F.Method("kvpress", "none"), None, seg.prompt, seg.continuation)["logp"]
    assert peer.exact_logp(seg.prompt, seg.continuation, full) is full
    m = metrics(F.exact_logp(exact_model, seg.prompt, seg.continuation), full, seg.continuation)
    assert m["kl"] < 1e-5 and m["top1"] == 1.0
