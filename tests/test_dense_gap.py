"""dense_gap: MNN's share of a decode token back to back, with a spin and with the real cache
step between layer calls (real model, a few tokens: the output's shape, not its speed)."""
import re

import pytest


# A profiling tool of MNN's dense part (the modules the native layers replaced by default): it loads
# them and times every mode, about 30 s of the default tier on 2 cores, so the full tier runs it.
@pytest.mark.slow
def test_dense_gap_times_every_mode_on_the_real_model(capsys):
    from mnn_h2o.tools.dense_gap import MODES, main

    assert main(["--context", "16", "--tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"MNN wheel's x86 kernel sets: SSE \d+ kernels, AVX2 \d+ kernels, AVX-512 \d+ kernels", out)
    rows = [line for line in out.splitlines() if line.startswith("| ") and "MNN ms/token" not in line]
    assert len(rows) == len(MODES)
    assert rows[0].startswith("| back-to-back |") and rows[0].endswith("| 1.00x |")
    assert rows[1].startswith("| spin ") and rows[2].startswith("| cache step (")
    for row in rows:
        med, lo, hi = map(float, re.search(r"\| ([\d.]+) \(([\d.]+)-([\d.]+)\) \|", row).groups())
        assert 0 < lo <= med <= hi


def test_dense_gap_refuses_a_context_past_the_limit(capsys):
    from mnn_h2o.tools.dense_gap import main

    assert main(["--context", "9000", "--tokens", "3"]) != 0
    assert "context limit" in capsys.readouterr().err
