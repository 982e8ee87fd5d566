"""A bench round's verdicts hold on a busy machine: a small real round, made the reference on a
quiet machine, run again with a CPU burner beside it, must pass every guard (the speed guards
included) rather than end inconclusive or failed. Slow tier: two real rounds, one of them on a
machine with a core taken."""
import json
import subprocess
import sys

import pytest
import yaml

from mnn_h2o.bench.__main__ import main

ROUND = {
    "eviction": {"sink_tokens": 16, "recent_tokens": 64, "trigger_min_tokens": 128, "target_lossy_ratio": 2.0},
    "bench": {"prompt_lengths": [512], "decode_tokens": 64, "repetitions": 3, "cases": ["baseline", "evict", "q8"],
              "demo_cases": ["full"], "demo_buckets": [160], "demo_new_tokens": 4},
}


@pytest.mark.slow
def test_speed_guards_judge_beside_a_cpu_burner(tmp_path, capsys):
    cfg = tmp_path / "round.yaml"
    cfg.write_text(yaml.safe_dump(ROUND))
    assert main(["--config", str(cfg), "--out", str(tmp_path / "quiet")]) == 0
    ref = tmp_path / "ref.json"
    assert main(["reference", str(tmp_path / "quiet"), "--to", str(ref)]) == 0
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        status = main(["--config", str(cfg), "--reference", str(ref), "--out", str(tmp_path / "busy")])
    finally:
        burner.kill()
        burner.wait()
    s = json.loads((tmp_path / "busy" / "summary.json").read_text())
    speed = [g for g in s["gates"] if g["name"].startswith("decode_speed") and "vs reference" in g["name"]]
    assert len(speed) == 2, s["reference"]  # h2o and q8 against the baseline: the guards really judged
    assert status == 0, [g for g in s["gates"] if g["status"] != "pass" and g["kind"] == "guard"]
    # Whole runs' tokens/s moved with the burner; the paired ratios are what held.
    quiet = json.loads((tmp_path / "quiet" / "summary.json").read_text())
    base = lambda summary: next(r for r in summary["cases"] if r["case"] == "baseline")["decode_tps"]["median"]
    print(f"baseline decode tok/s quiet {base(quiet):.1f}, beside a burner {base(s):.1f}; "
          + "; ".join(f"{g['name']} = {g['value']}" for g in speed))
