"""The bench harness: gates can fail, and a small real round writes what docs/summary_schema.md
promises, with the lossless modes bit-identical to each other."""
import json
import os

import pytest
import yaml

from mnn_h2o import config
from mnn_h2o.bench import gates, report
from mnn_h2o.bench.__main__ import main

MICRO = {
    "eviction": {"sink_tokens": 16, "recent_tokens": 64, "trigger_min_tokens": 128, "update_interval": 4,
            "target_lossy_ratio": 2.0},
    "lossless": {"hot_sink_tokens": 16, "hot_recent_tokens": 32, "chunk_tokens": 64, "probe_every": 2},
    "bench": {"prompt_lengths": [256], "decode_tokens": 8, "repetitions": 3,
              "cases": ["baseline", "probe", "full", "store", "q8", "q8_evict"], "demo_cases": ["full", "store"],
              "demo_buckets": [160], "demo_new_tokens": 6},
    "gates": {"min_lossy_ratio": 1.5, "min_lossless_ratio": 1.01, "min_top1_agreement": 0.5,
              "speed_cases": ["probe"], "max_store_slowdown": 20.0},
}


def test_every_gate_can_fail():
    results = gates.self_test(config.defaults()["gates"])
    assert len(results) >= 10
    assert all(r["ok"] for r in results), [r for r in results if not r["ok"]]


def test_bad_config_is_exit_2(tmp_path, capsys):
    p = tmp_path / "bad.yaml"
    p.write_text("bench:\n  cases: [baseline, turbo]\n")
    assert main(["--config", str(p), "--out", str(tmp_path / "run")]) == 2
    assert "bench.cases[1]: 'turbo' is not allowed" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_missing_bench_extra_is_exit_2_before_measuring(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert main(["--out", str(tmp_path / "run")]) == 2
    assert "pip install '.[bench]'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def micro_round(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    cfg = d / "micro.yaml"
    cfg.write_text(yaml.safe_dump(MICRO))
    status = main(["--config", str(cfg), "--out", str(d / "run")])
    with open(d / "run" / "summary.json") as f:
        return status, json.load(f), d / "run"


def test_round_writes_the_documented_summary(micro_round):
    status, s, folder = micro_round
    assert s["schema_version"] == report.SCHEMA_VERSION
    assert status == gates.EXIT_STATUS[s["overall"]]
    guards = [g for g in s["gates"] if g["kind"] == "guard"]
    assert guards and {g["kind"] for g in s["gates"]} == {"guard", "target"}
    assert s["overall_pass"] == all(g["pass"] for g in guards) == (s["overall"] == "pass")
    assert "figure guards skipped" in s["reference"]  # no reference of the micro settings: invariants only
    for g in s["gates"]:
        assert set(g) == {"name", "kind", "value", "op", "threshold", "pass", "status"}
    assert {(r["case"], r["prompt_tokens"]) for r in s["cases"]} == \
        {(c, n) for c in MICRO["bench"]["cases"] for n in MICRO["bench"]["prompt_lengths"]}
    for r in s["cases"]:
        assert r["decode_tps"]["n"] == 3 and r["decode_tps"]["median"] > 0
        assert r["kv_bytes_held"] > 0 and r["kv_bytes_uncompressed"] > 0
    assert [(d["bucket"], d["case"]) for d in s["demo"]] == [(160, "baseline"), (160, "full"), (160, "store")]
    for d in s["demo"]:
        assert 0.0 <= d["token_f1"] <= 1.0 and 0.0 <= d["rouge_l"] <= 1.0
        assert (d["first_divergence"] is None) == d["identical_to_baseline"]
    assert s["demo"][0]["first_divergence"] is None and s["demo"][0]["rouge_l"] == 1.0
    for name in ("summary.md", "config.yaml", *s["plots"]):
        assert (folder / name).stat().st_size > 0
    assert len(s["plots"]) == 3
    assert config.validate(yaml.safe_load((folder / "config.yaml").read_text())) == s["config"]


def test_round_measures_what_it_claims(micro_round):
    _, s, _ = micro_round
    by = {(r["case"], r["prompt_tokens"]): r for r in s["cases"]}
    for n in MICRO["bench"]["prompt_lengths"]:
        base, store, full = by["baseline", n], by["store", n], by["full", n]
        assert base["kl"] == 0.0 and base["top1_agreement"] == 1.0
        # Lossless means bit-identical: every H2O case yields the same logits.
        assert store["logits_sha256"] == full["logits_sha256"] == by["probe", n]["logits_sha256"]
        assert store["logits_sha256"] != base["logits_sha256"]  # H2O evicted something
        assert full["store"]["mismatches"] == 0 and store["store"]["fallbacks"] == 0
        # The store holds fewer bytes than H2O alone, and says so consistently.
        assert store["kv_bytes_held"] < full["kv_bytes_held"]
        assert store["store"]["lossless_ratio"] > 1.0
        assert store["total_ratio"] == pytest.approx(store["kv_bytes_uncompressed"] / store["kv_bytes_held"])
        # int8 rows: 68 bytes per 64 values instead of 128 (1.88x, less block rounding), close
        # to the full cache.
        q8, q8_evict = by["q8", n], by["q8_evict", n]
        assert 1.8 < q8["whole_model_ratio"] < 1.89 and base["whole_model_ratio"] < 1.01
        assert q8["kl"] < 0.01 and q8["top1_agreement"] >= 0.9
        # eviction.target_lossy_ratio is whole-model: q8 pays 1.88x of the 2x, eviction the rest.
        assert q8_evict["whole_model_ratio"] >= 0.9 * MICRO["eviction"]["target_lossy_ratio"]
        assert q8_evict["whole_model_ratio"] == pytest.approx(q8_evict["lossy_ratio"] * 128 / 68, rel=0.02)
    demo = {d["case"]: d for d in s["demo"]}
    assert demo["store"]["token_ids"] == demo["full"]["token_ids"]
    names = [g["name"] for g in s["gates"]]
    assert any(n.startswith("identical logits probe/full/store") for n in names)
    assert all(g["pass"] for g in s["gates"] if g["name"].startswith(("identical", "full-mode", "fallbacks")))


def test_compare_flags_a_regression(micro_round, tmp_path):
    _, s, folder = micro_round
    worse = json.loads(json.dumps(s))
    for r in worse["cases"]:
        r["kv_bytes_held"] *= 2
    table = report.compare(s, worse)
    assert "KV held MiB" in table and "+100.0%" in table and "worse" in table
    with pytest.raises(ValueError, match="not a summary.json"):
        bad = tmp_path / "x.json"
        bad.write_text("{}")
        report.load(str(bad))


# --- fakes: a round without the model ----------------------------------------------------------

def _stats(median, spread):
    return {"median": median, "min": median * (1 - spread / 2), "max": median * (1 + spread / 2), "n": 3,
            "spread": spread, "values": [median] * 3}


def _vs(ratio, noise):
    return {"ratio": ratio, "noise": noise, "blocks": 24, "block_steps": 16}


def fake_row(case, n, decode=100.0, spread=0.05, prefill=1000.0, prefill_spread=0.02):
    eviction = case != "baseline"
    return {"case": case, "prompt_tokens": n, "decode_tokens": 8, "decode_tps": _stats(decode, spread),
            "decode_vs_baseline": _vs(decode / 100.0 if eviction else 1.0, spread if eviction else 0.0),
            "prefill_tps": _stats(prefill, prefill_spread), "kv_bytes_held": 1 << 20, "kv_bytes_pool": 1 << 20,
            "kv_bytes_kept": 1 << 20, "kv_bytes_peak": 1 << 20, "kv_bytes_uncompressed": 4 << 20,
            "lossy_ratio": 4.0 if eviction else 1.0, "total_ratio": 4.0 * n / 4096 + 1 if eviction else 1.0,
            "lossy_ratio_decode_avg": 1.0, "evictions": 0, "logits_sha256": "evict" if eviction else "base",
            "rss_delta_bytes": _stats(1 << 20, 0.0), "rss_bytes": 1 << 26, "kl": 0.01 if eviction else 0.0,
            "top1_agreement": 0.95 if eviction else 1.0, "ppl": 10.0, "ppl_baseline": 10.0,
            "store": {"lossless_ratio": 0.0, "fallbacks": 0, "fallback_reasons": {}, "mismatches": 0}}


def fake_summary(lengths, quick=False, **kw):
    rows = [fake_row(c, n, **kw) for n in lengths for c in ("baseline", "evict")]
    return {"schema_version": report.SCHEMA_VERSION, "cases": rows, "gates": [], "quick": quick,
            "config": config.defaults()}


class FakeLlm:
    max_context = 8192
    tokenizer = None
    weights = "int4 layers, int8 head"


@pytest.fixture
def fake_round(monkeypatch):
    """Runs main() on a round whose cases are ``rows`` (or whose run raises ``error``)."""
    from mnn_h2o import engine, export
    from mnn_h2o.bench import cases

    monkeypatch.setattr(export, "ensure_exported", lambda model, progress=True: "no export")
    monkeypatch.setattr(engine, "Llm", lambda export_dir, cfg: FakeLlm())

    def run(argv, rows=None, error=None, demo=()):
        def run_cases(llm, tok, cfg, progress=None):
            if error:
                raise error
            return rows
        monkeypatch.setattr(cases, "run_cases", run_cases)
        monkeypatch.setattr(cases, "run_demos", lambda llm, tok, cfg, progress=None: list(demo))
        return main(argv + ["--set", "bench.cases=[baseline, evict]", "--set", "gates.speed_cases=[evict]",
                            "--set", "gates.min_lossy_ratio=1.0"])
    return run


def test_speed_gate_is_inconclusive_not_pass_when_too_noisy():
    g = config.defaults()["gates"]
    # A busy machine's round: 317% spread, H2O at 0.38x the baseline, passed against >= -2.17.
    rows = [fake_row("baseline", 512, 100.0, 3.168), fake_row("evict", 512, 37.71, 3.168)]
    speed = [x for x in gates.evaluate(rows, [], g) if x["name"].startswith("decode_speed")]
    assert len(speed) == 1
    assert speed[0]["status"] == "inconclusive" and not speed[0]["pass"]
    assert speed[0]["threshold"] >= 1.0 - g["max_speed_noise"] > 0
    assert gates.outcome(speed, strict=True) == "inconclusive"
    assert gates.outcome(speed) == "pass"  # a target: it decides the round only under --strict
    # At the cap the gate still judges, with the capped allowance.
    rows = [fake_row("baseline", 512, 100.0, g["max_speed_noise"]), fake_row("evict", 512, 70.0, 0.01)]
    speed = [x for x in gates.evaluate(rows, [], g) if x["name"].startswith("decode_speed")]
    assert speed[0]["status"] == "fail"
    assert gates.outcome(speed + [gates.gate("x", 1, "==", 1, inconclusive=True)], strict=True) == "fail"


def test_selftest_covers_an_inconclusive_speed_gate(capsys):
    assert main(["selftest"]) == 0
    out = capsys.readouterr().out
    noisy = [line for line in out.splitlines() if "max_speed_noise" in line]
    assert len(noisy) == 1 and noisy[0].startswith("ok") and "inconclusive gates ['decode_speed" in noisy[0]



def test_selftest_notices_a_noisy_speed_gate_that_passes(monkeypatch):
    real = gates.gate
    monkeypatch.setattr(gates, "gate", lambda *a, inconclusive=False, **kw: real(*a, **kw))
    results = gates.self_test(config.defaults()["gates"])
    assert [r["breakage"] for r in results if not r["ok"]] == ["speed noise beyond gates.max_speed_noise",
                                                               "store slower on a noisy machine",
                                                               "slower than the reference on a noisy machine"]


def test_selftest_notices_a_target_that_fails_a_round_without_strict(monkeypatch):
    real = gates.gate
    monkeypatch.setattr(gates, "gate", lambda *a, kind=gates.GUARD, **kw: real(*a, **kw))
    results = gates.self_test(config.defaults()["gates"])
    assert [r for r in results if not r["ok"]] and \
        all("under --strict" in r["expect"] or r["breakage"] == "intact round" for r in results if not r["ok"])


def test_missed_targets_fail_a_round_only_under_strict(fake_round, tmp_path, capsys):
    noisy = [fake_row("baseline", 512, 100.0, 3.168), fake_row("evict", 512, 37.71, 3.168)]
    assert fake_round(["--out", str(tmp_path / "noisy")], noisy) == 0
    out = capsys.readouterr().out
    assert "targets: 2 of 3 met" in out and "INCONCLUSIVE: decode_speed evict/baseline @512" in out
    assert "PASS: every guard" in out
    assert fake_round(["--strict", "--out", str(tmp_path / "strict")], noisy) == 3
    err = capsys.readouterr().err
    assert "INCONCLUSIVE" in err and "PASS" not in err
    s = json.loads((tmp_path / "strict" / "summary.json").read_text())
    assert s["overall"] == "inconclusive" and not s["overall_pass"] and s["strict"]
    assert "**Overall: INCONCLUSIVE**" in (tmp_path / "strict" / "summary.md").read_text()
    low = [fake_row("baseline", 512), dict(fake_row("evict", 512, 110.0), top1_agreement=0.5)]
    assert fake_round(["--out", str(tmp_path / "low")], low) == 0
    assert "MISSED: top1_agreement evict @512 = 0.5 (target >= 0.9)" in capsys.readouterr().out
    assert fake_round(["--strict", "--out", str(tmp_path / "low-strict")], low) == 1
    quiet = [fake_row("baseline", 512, 100.0, 0.05), fake_row("evict", 512, 110.0, 0.05)]
    assert fake_round(["--strict", "--out", str(tmp_path / "quiet")], quiet) == 0
    assert "PASS: every guard and every target" in capsys.readouterr().out


def test_reference_round_guards_regressions(fake_round, tmp_path, capsys):
    quiet = [fake_row("baseline", 512, 100.0, 0.05), fake_row("evict", 512, 110.0, 0.05)]
    assert fake_round(["--out", str(tmp_path / "ref")], quiet) == 0
    ref = tmp_path / "ref.json"
    assert main(["reference", str(tmp_path / "ref"), "--to", str(ref)]) == 0
    assert json.loads(ref.read_text())["cases"][1]["kl"] == 0.01
    # The same figures again pass every guard, and the guards really compared them.
    assert fake_round(["--reference", str(ref), "--out", str(tmp_path / "same")], quiet) == 0
    s = json.loads((tmp_path / "same" / "summary.json").read_text())
    assert str(ref) in s["reference"]
    names = [g["name"] for g in s["gates"] if g["kind"] == "guard"]
    for prefix in ("kv_bytes_held evict @512 vs reference", "kl evict @512 vs reference",
                   "decode_speed evict/baseline @512 vs reference"):
        assert any(n.startswith(prefix) for n in names), names
    capsys.readouterr()
    # Worse memory, worse KL, slower: each fails the round (exit 1) with its guard named.
    for change, guard in (({"kv_bytes_held": 2 << 20}, "kv_bytes_held evict @512"), ({"kl": 0.05}, "kl evict @512"),
                          ({"decode_vs_baseline": _vs(0.7, 0.05)}, "decode_speed evict/baseline @512 vs reference")):
        worse = [quiet[0], dict(quiet[1], **change)]
        assert fake_round(["--reference", str(ref), "--out", str(tmp_path / guard.split()[0])], worse) == 1
        assert guard in capsys.readouterr().err
    # Settings the reference was not measured with: an explicit --reference is refused.
    assert fake_round(["--reference", str(ref), "--set", "eviction.sink_tokens=8", "--out", str(tmp_path / "x")],
                      quiet) == 2
    assert "eviction.sink_tokens" in capsys.readouterr().err
    # A reference is made from a healthy round only.
    assert main(["reference", str(tmp_path / "kl"), "--to", str(tmp_path / "bad.json")]) == 2
    assert "a guard failed" in capsys.readouterr().err


def test_no_speed_guard_against_a_loosely_measured_reference():
    g = config.defaults()["gates"]
    quiet = [fake_row("baseline", 512, 100.0, 0.05), fake_row("evict", 512, 110.0, 0.05)]
    loose = [fake_row("baseline", 512, 100.0, 0.05), fake_row("evict", 512, 110.0, 2 * g["max_speed_noise"])]
    slower = [quiet[0], dict(quiet[1], decode_vs_baseline=_vs(0.7, 0.05))]
    speed = [x for x in gates.evaluate(slower, [], g, {"cases": quiet}) if "vs reference" in x["name"]
             and x["name"].startswith("decode_speed")]
    assert [x["status"] for x in speed] == ["fail"]
    speed = [x for x in gates.evaluate(slower, [], g, {"cases": loose}) if "vs reference" in x["name"]
             and x["name"].startswith("decode_speed")]
    assert speed == []  # it could only ever be inconclusive: the reference must be remade
    assert gates.loose_reference_speeds({"cases": loose}, g["max_speed_noise"]) == ["evict @512"]


def test_reference_files_are_refused_when_unreadable(tmp_path):
    from mnn_h2o.bench import reference

    bad = tmp_path / "r.json"
    for text in ("", "[]", '{"reference_version": 99, "cases": [], "config": {}}'):
        bad.write_text(text)
        with pytest.raises(ValueError, match="r.json"):
            reference.read(str(bad))
    cfg = config.validate({"model": {"name": "/models/unreferenced.gguf"}})
    ref, note = reference.select(cfg, quick=True)  # no committed reference: no error, no figure guards
    assert ref is None and "no reference round for model unreferenced" in note
    with pytest.raises(ValueError, match="cannot|No such"):
        reference.select(cfg, quick=False, path=str(tmp_path / "missing.json"))


def test_committed_references_match_the_default_settings():
    """The reference rounds in the package are of the default settings (the README's round and
    --quick), so README command 1 is guarded."""
    from mnn_h2o.bench import reference
    from mnn_h2o.bench.__main__ import QUICK

    for quick in (False, True):
        cfg = config.load(None, dict(QUICK) if quick else {})
        ref, note = reference.select(cfg, quick)
        assert ref is not None, note
        assert ref["cases"] and {r["case"] for r in ref["cases"]} >= {"baseline"}


def test_ctrl_c_is_one_line_exit_130_and_no_run_folder(fake_round, tmp_path, capsys, monkeypatch):
    assert fake_round(["--out", str(tmp_path / "run")], error=KeyboardInterrupt()) == 130
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("bench:")]
    assert err == ["interrupted"]  # and the progress bar, no traceback
    assert not (tmp_path / "run").exists()
    # Interrupted while the run folder is being written: nothing half-written is left.
    from mnn_h2o.bench import plots

    def interrupted(rows, folder):
        with open(os.path.join(folder, "bytes_held.png"), "w") as f:
            f.write("half")
        raise KeyboardInterrupt
    monkeypatch.setattr(plots, "write_all", interrupted)
    quiet = [fake_row("baseline", 512), fake_row("evict", 512, 110.0)]
    assert fake_round(["--out", str(tmp_path / "run")], quiet) == 130
    assert os.listdir(tmp_path) == []


def test_existing_run_folder_is_not_overwritten(fake_round, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text("{}")
    assert fake_round(["--out", str(tmp_path / "run")], []) == 2
    assert "already exists" in capsys.readouterr().err


def test_compare_uses_each_metrics_own_noise():
    prev = fake_summary([512], spread=0.08, prefill_spread=0.02)
    now = fake_summary([512], spread=0.08, prefill_spread=0.02)
    for r in now["cases"]:
        r["decode_tps"]["median"] *= 0.95   # inside decode's 8% spread
        r["prefill_tps"]["median"] *= 0.95  # beyond prefill's own 2% spread
    rows = {line.split("|")[3].strip(): line for line in report.compare(prev, now).splitlines()
            if line.startswith("| evict")}
    assert rows["prefill tok/s"].rstrip(" |").endswith("worse")
    assert rows["decode tok/s"].rstrip(" |").endswith("-5.0%")
    # Beyond gates.max_speed_noise a change is inconclusive, not hidden inside the noise.
    noisy = fake_summary([512], spread=3.168)
    for r in noisy["cases"]:
        r["decode_tps"]["median"] *= 0.624
    table = report.compare(prev, noisy)
    assert "-37.6%" in table and "inconclusive (noise 317%)" in table


def test_compare_without_common_cases_says_so():
    quick, full = fake_summary([2048], quick=True), fake_summary([512, 1024, 4096])
    text = report.compare(full, quick)
    assert text.startswith("Nothing to compare")
    assert "--quick round of baseline, evict at 2048" in text and "at 512/1024/4096" in text


def test_quality_plot_has_a_line_per_case_and_no_point_labels():
    from mnn_h2o.bench import plots

    rows = [fake_row(c, n) for n in (4096, 512, 1024) for c in ("baseline", "evict", "store")]
    fig = plots.quality_figure(rows)
    try:
        for ax in fig.axes:
            assert len(ax.texts) == 0
            lines = ax.get_lines()
            assert [ln.get_label() for ln in lines] == ["eviction alone", "eviction + lossless store"]
            for ln in lines:
                assert ln.get_linestyle() == "-" and ln.get_marker() not in ("", "None", None)
                assert list(ln.get_xdata()) == sorted(ln.get_xdata()) and len(ln.get_xdata()) == 3
            assert ax.get_legend() is not None
    finally:
        plots._plt().close(fig)


def test_demo_divergence_and_similarity():
    from mnn_h2o.bench.cases import compare_answer
    from mnn_h2o.bench.similarity import first_divergence, rouge_l, token_f1

    ref = {"token_ids": [1, 2, 3, 4], "text": "The essay argues that startups grow fast."}
    same = compare_answer(ref, dict(ref))
    assert same == {"same_prefix_tokens": 4, "first_divergence": None, "identical_to_baseline": True,
                    "token_f1": 1.0, "rouge_l": 1.0}
    other = compare_answer(ref, {"token_ids": [1, 2, 9], "text": "The essay argues that founders work hard."})
    assert other["first_divergence"] == 2 and other["same_prefix_tokens"] == 2
    assert 0 < other["rouge_l"] < 1 and other["token_f1"] == pytest.approx(2 * 4 / 7 * 4 / 7 / (8 / 7))
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    # ROUGE-L rewards order, bag-of-words F1 does not.
    assert token_f1("a b c d", "d c b a") == 1.0 and rouge_l("a b c d", "d c b a") == pytest.approx(0.25)
    assert rouge_l("", "") == 1.0 and rouge_l("a", "") == 0.0
    table = report.demo_table([dict(fake_demo("baseline"), **same), dict(fake_demo("evict"), **other)])
    assert "| - | 1.000 | 1.000 |" in table and "| token 2 | " in table


def test_demo_answer_must_not_change_where_nothing_was_evicted():
    rows = [fake_row("baseline", 512), fake_row("evict", 512, 110.0)]
    g = config.defaults()["gates"]

    def demo_gates(lossy, identical):
        demo = [dict(fake_demo("baseline"), identical_to_baseline=True),
                dict(fake_demo("full"), lossy_ratio=lossy, identical_to_baseline=identical)]
        return [x for x in gates.evaluate(rows, demo, g) if x["name"].startswith("demo same answer")]
    assert [x["status"] for x in demo_gates(1.0, True)] == ["pass"]
    assert [x["status"] for x in demo_gates(1.0, False)] == ["fail"]
    assert demo_gates(3.2, False) == []  # evicted: reported as F1 / ROUGE-L, not gated


def fake_demo(case):
    return {"bucket": 128, "case": case, "prompt_tokens": 120, "generated_tokens": 4, "decode_tps": 50.0,
            "prefill_tps": 900.0, "kv_bytes_held": 1 << 20, "lossy_ratio": 1.0, "total_ratio": 1.0,
            "text": "x", "token_ids": [1, 2, 3, 4], "store": {"fallbacks": 0}}


@pytest.mark.parametrize("config_dtype,expect", [
    ("f16", {"baseline": "f16", "evict": "f16", "store": "f16", "q8": "q8", "q8_evict": "q8"}),
    ("bf16", {"baseline": "f16", "evict": "bf16", "store": "bf16", "q8": "q8", "q8_evict": "q8"}),
    ("q4r", {"baseline": "f16", "evict": "f16", "store": "f16", "q8": "q8", "q8_evict": "q8"}),
    ("q8r", {"baseline": "f16", "evict": "f16", "store": "f16", "q8": "q8r", "q8_evict": "q8r"}),
])
def test_case_element_types(config_dtype, expect):
    """The reference is always f16; the lossless cases (and evict, their bit-identical reference)
    measure the store on float rows, so a quantised runtime.kv_dtype leaves them on f16; the int8
    cases take the config's int8 rows (q8 or q8r), else q8."""
    from mnn_h2o.bench.cases import case_kv_dtype

    cfg = {"runtime": {"kv_dtype": config_dtype}}
    assert {c: case_kv_dtype(cfg, c) for c in expect} == expect
