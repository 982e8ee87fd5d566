"""decode_interleave: decode steps of cache configurations (and llama.cpp peers) token by token
(real model, a short prompt: the record's shape and its bookkeeping, not the speed)."""
import json

import pytest


def test_decode_interleave_records_every_step_and_the_paired_ratios(tmp_path):
    from mnn_h2o.tools.decode_interleave import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text("h2o: {trigger_min_tokens: 32}\n")  # the 64-token prompt is past it: kvzip evicts
    out = tmp_path / "r.json"
    assert main(["--config", str(cfg), "--context", "64", "--tokens", "32", "--engines", "q8:none", "q8:kvzip",
                 "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert (r["context"], r["tokens"], r["llama_best"]) == (64, 32, None)
    none, kvzip = r["engines"]["q8:none"], r["engines"]["q8:kvzip"]
    for e in (none, kvzip):
        assert len(e["step_s"]) == 32 and min(e["step_s"]) > 0 and e["prefill_s"] > 0
        assert e["vs_first"]["blocks"] == 2
    # Against itself the paired ratio is exactly 1 with no noise; the evicting engine holds less.
    assert none["vs_first"]["ratio"] == 1.0 and none["vs_first"]["noise"] == 0.0
    assert kvzip["vs_first"]["ratio"] == pytest.approx(sum(none["step_s"]) / sum(kvzip["step_s"]))
    assert kvzip["kv_bytes_held"] < none["kv_bytes_held"]
    assert r["environment"]["commit"]


def test_decode_interleave_refuses_bad_lengths_and_configs():
    from mnn_h2o.tools.decode_interleave import main

    with pytest.raises(SystemExit, match="context limit"):
        main(["--context", "100000", "--tokens", "32", "--engines", "q8:none"])
    with pytest.raises(SystemExit, match="--tokens must be at least 32"):
        main(["--context", "64", "--tokens", "8", "--engines", "q8:none"])
    with pytest.raises(SystemExit, match="--llama: unknown config.*llama_f16"):
        main(["--context", "64", "--tokens", "32", "--engines", "q8:none", "--llama", "llama_f99"])
