"""prefill_interleave: prefill time of cache configurations in rotating order (real model, a short
prompt: the output's shape and the pass's share, not the speed)."""
import re


def test_prefill_interleave_reports_each_engine_and_the_pass(tmp_path, capsys):
    from mnn_h2o.tools.prefill_interleave import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text("h2o: {trigger_min_tokens: 32}\n")  # the 48-token prompt is past it: kvzip passes
    assert main(["--config", str(cfg), "--contexts", "48", "--rounds", "2", "--engines", "q8:h2o", "q8:kvzip"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("     48 ")]
    assert [r[1] for r in rows] == ["q8:h2o", "q8:kvzip"]
    for r in rows:
        lo, hi = map(float, re.fullmatch(r"([\d.]+)-([\d.]+)", r[3]).groups())
        assert 0 <= lo <= float(r[2]) <= hi
    assert float(rows[0][4]) == 0 and float(rows[1][4]) > 0  # only kvzip runs a reconstruction pass
    assert rows[0][5] == "1.00"


def test_prefill_interleave_refuses_a_context_past_the_limit():
    import pytest

    from mnn_h2o.tools.prefill_interleave import main

    with pytest.raises(SystemExit, match="max_context"):
        main(["--contexts", "100000", "--engines", "q8:h2o"])


def test_prefill_interleave_names_an_unknown_llama_config():
    import pytest

    from mnn_h2o.tools.prefill_interleave import main

    with pytest.raises(SystemExit, match="--llama: unknown config.*llama_f16"):
        main(["--contexts", "48", "--engines", "q8:h2o", "--llama", "llama_f99"])
