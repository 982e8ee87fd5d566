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
    "h2o": {"sink_tokens": 16, "recent_tokens": 64, "trigger_min_tokens": 128, "update_interval": 4,
            "target_lossy_ratio": 2.0},
    "lossless": {"hot_sink_tokens": 16, "hot_recent_tokens": 32, "chunk_tokens": 64, "probe_every": 2},
    "bench": {"prompt_lengths": [512], "decode_tokens": 8, "repetitions": 3,
              "cases": ["baseline", "probe", "full", "store"], "demo_cases": ["full", "store"],
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
    assert status == (0 if s["overall_pass"] else 1)
    assert s["overall_pass"] == all(g["pass"] for g in s["gates"])
    for g in s["gates"]:
        assert set(g) == {"name", "value", "op", "threshold", "pass"}
    assert {(r["case"], r["prompt_tokens"]) for r in s["cases"]} == \
        {(c, n) for c in MICRO["bench"]["cases"] for n in MICRO["bench"]["prompt_lengths"]}
    for r in s["cases"]:
        assert r["decode_tps"]["n"] == 3 and r["decode_tps"]["median"] > 0
        assert r["kv_bytes_held"] > 0 and r["kv_bytes_uncompressed"] > 0
    assert [(d["bucket"], d["case"]) for d in s["demo"]] == [(160, "baseline"), (160, "full"), (160, "store")]
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
