"""eval fair: which press is the best one-pass press, how files merge, the bars' counts, the CLI."""
import json

import pytest

from mnn_h2o.eval import fair
from mnn_h2o.eval.__main__ import main


def _row(method, domain, kl, target=3.2, n=4096, kl_exact=None):
    engine, rest = method.split(":")
    policy, _, dtype = rest.partition("@")
    return {"method": method, "engine": engine, "kv_dtype": dtype or "f16", "policy": policy,
            "target_ratio": target, "kind": "kl", "domain": domain, "prompt_tokens": n,
            "ratio": target or 1.88, "kl": kl, "kl_exact": kl_exact, "top1": 1.0, "ppl_delta": 0.0,
            "bytes_held": 1.0, "split": "test", "segments": 1}


def _write(path, rows):
    path.write_text(json.dumps({"meta": {}, "rows": rows, "runs": []}))
    return str(path)


ROWS = [
    _row("ours:kvzip@q8", "code", 0.004, kl_exact=0.003),
    _row("kvpress:snapkv@q8", "code", 0.003, kl_exact=0.0035),
    _row("kvpress:tova@q8", "code", 0.005),
    # Lower than every one-pass press, but not one of them: kvzip re-reads the context, and
    # f16 presses and the peer's full cache are not the fair peers.
    _row("kvpress:kvzip@q8", "code", 0.001),
    _row("kvpress:snapkv", "code", 0.0001),
    _row("kvpress:none@q8", "code", 0.0002, target=None),
    _row("ours:none@q8", "code", 0.0025, target=None),
    # Another point, another length: the presses there must not leak into the 4096 point.
    _row("ours:kvzip@q8", "code", 0.006, n=7936),
    _row("kvpress:observed@q8", "code", 0.009, n=7936),
]


def test_points_pick_the_best_one_pass_press_at_the_same_point():
    pts = fair.points(ROWS, "ours:kvzip@q8")
    assert [(p.prompt_tokens, p.domain) for p in pts] == [(4096, "code"), (7936, "code")]
    p4, p8 = pts
    assert p4.best_press["method"] == "kvpress:snapkv@q8"
    assert p4.kvzip["kl"] == 0.001 and p4.rows_alone["kl"] == 0.0025
    assert p8.best_press["method"] == "kvpress:observed@q8" and p8.kvzip is None and p8.rows_alone is None
    # The floor is the default's own rows alone: q8r's for a q8r default, never q8's.
    assert fair.rows_alone("ours:kvzip@q8r") == "ours:none@q8r" and fair.rows_alone("ours:kvzip@q8") == "ours:none@q8"
    q8r = [dict(r, method=r["method"].replace("@q8", "@q8r"), kv_dtype="q8r") if r["engine"] == "ours" else r
           for r in ROWS]
    assert fair.points(q8r, "ours:kvzip@q8r")[0].rows_alone["kl"] == 0.0025
    assert fair.points(q8r + [r for r in ROWS if r["method"] == "ours:none@q8"], "ours:kvzip@q8r")[0].rows_alone[
        "method"] == "ours:none@q8r"


def test_table_counts_each_bar():
    text = fair.table(fair.points(ROWS, "ours:kvzip@q8"), "ours:kvzip@q8")
    # 4096: 0.004 > 1.1 * 0.003 (missed); 7936: 0.006 <= 1.1 * 0.009 (met).
    assert "default <= 1.1x the best press at 1 of 2" in text
    # Only 4096 has KVzip: 0.004 > 2 * 0.001.
    assert "default <= 2x KVzip@q8 at 0 of 1" in text
    assert "kl_exact 0.0030 against 0.0035 (0.86x" in text
    assert ("| 4096 | 3.2 | code | 3.20 / 0.0040 | 0.0025 | snapkv, 3.20 / 0.0030 | 3.20 / 0.0010 | 1.33 | 4.00 |"
            in text)


def test_a_later_file_replaces_an_earlier_row(tmp_path):
    old = _write(tmp_path / "old.json", ROWS)
    new = _write(tmp_path / "new.json", [_row("ours:kvzip@q8", "code", 0.002)])
    pts = fair.points(fair.load_rows([old, new]), "ours:kvzip@q8")
    assert pts[0].default["kl"] == 0.002 and pts[0].best_press["method"] == "kvpress:snapkv@q8"


def test_cli_writes_table_and_plot(tmp_path, capsys):
    f = _write(tmp_path / "f.json", ROWS)
    out = tmp_path / "fair"
    assert main(["fair", f, "--default", "ours:kvzip@q8", "--out", str(out)]) == 0
    assert (tmp_path / "fair.png").stat().st_size > 10_000
    text = (tmp_path / "fair.md").read_text()
    assert "best one-pass press@q8" in text and "| q8 alone |" in text


def test_cli_refuses_a_file_that_is_not_a_frontier_output(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main(["fair", str(bad), "--out", str(tmp_path / "x")]) != 0
    assert "not a frontier output file" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no teacher-forced rows"):
        fair.report([_write(tmp_path / "e.json", [])], "ours:kvzip@q8", str(tmp_path / "y"))
