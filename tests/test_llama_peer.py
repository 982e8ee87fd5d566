"""llama.cpp as a peer of `bench speed --llama` (the optional `llama` extra): without the extra the
command stops with the install hint; with it, the peer rows carry speeds, KV bytes and quality, and
llama.cpp evaluated exactly our token ids."""
import os
import sys

import numpy as np
import pytest

from mnn_h2o.bench import llama_peer as L

# Spinning OpenMP barriers crawl on a busy machine (minutes for this module); these tests check
# function, not speed.
os.environ.setdefault("MNN_H2O_LLAMA_OMP_WAIT_POLICY", "passive")


def test_speed_llama_without_the_extra_names_what_to_install(monkeypatch, capsys):
    from mnn_h2o.bench.__main__ import main

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp raises ImportError
    assert main(["speed", "--llama", "--contexts", "64"]) == 2  # a usage problem, as other CLI errors
    err = capsys.readouterr().err
    assert err.startswith("error: bench speed --llama needs llama-cpp-python")
    assert "pip install '.[llama]'" in err and f"llama-cpp-python=={L.PIN}" in err
    assert "Traceback" not in err


def test_a_llama_cpp_that_crashes_is_a_clear_error_not_a_dead_bench(monkeypatch):
    # llama.cpp's AMX kernels died with SIGSEGV on a Sapphire Rapids VM: the bench must survive and
    # say what to rebuild; a child that fails without a signal names its last error line.
    monkeypatch.setattr(L, "check", lambda: None)
    monkeypatch.setattr(L, "_flown", set())
    monkeypatch.setattr(L, "_PREFLIGHT", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV) # %r")
    with pytest.raises(L.LlamaUnavailable, match=r"crashed \(SIGSEGV\).*-mno-amx-tile"):
        L.preflight("model.gguf", 2)
    monkeypatch.setattr(L, "_PREFLIGHT", "raise SystemExit('no such file') # %r")
    with pytest.raises(L.LlamaUnavailable, match="failed on a test run of model.gguf: no such file"):
        L.preflight("model.gguf", 2)
    # The tools' peers go through it too (SIGILL: the same build on a VM whose CPU lists AMX).
    monkeypatch.setattr(L, "_PREFLIGHT", "import os, signal; os.kill(os.getpid(), signal.SIGILL) # %r")
    with pytest.raises(L.LlamaUnavailable, match=r"crashed \(SIGILL\).*-mno-amx-tile"):
        L.make_peers("model.gguf", 64, 2, ["llama_f16"])
    monkeypatch.setattr(L, "_PREFLIGHT", "pass # %r")
    L.preflight("model.gguf", 2)  # a child that evaluates cleanly: no error
    monkeypatch.setattr(L, "_PREFLIGHT", "raise SystemExit('not run again') # %r")
    L.preflight("model.gguf", 2)  # once per process


def test_llama_option_is_explained_in_help(capsys):
    from mnn_h2o.bench.__main__ import main

    with pytest.raises(SystemExit):
        main(["speed", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--llama" in out and "llama.cpp" in out and "q8_0" in out and "'.[llama]'" in out


def test_the_pin_is_the_extra_of_pyproject():
    import os

    tomllib = pytest.importorskip("tomllib")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert f"llama-cpp-python=={L.PIN}" in project["optional-dependencies"]["llama"]
    assert not any(r.startswith("llama") for r in project["dependencies"])


def test_speed_table_shows_llama_rows_and_ratios():
    from mnn_h2o.bench.speed import format_table

    s = lambda m: {"median": m, "min": m * 0.9, "max": m * 1.1, "spread": 0.2}
    row = {"context": 512, "ours": {"prefill_tps": s(400), "decode_tps": s(80), "kv_bytes_held": 2**20},
           "stock": {"prefill_tps": s(450), "decode_tps": s(84)},
           "llama_q8_fa": {"prefill_tps": s(900), "decode_tps": s(100), "kv_bytes_held": 2**21,
                           "quality_vs": {"llama_f16": {"kl": 0.00123, "top1_agreement": 0.984},
                                          "llama_f16_fa": {"kl": 0.0004, "top1_agreement": 1.0}}},
           "decode_ratio_ours_vs_llama_best": 0.8}
    t = format_table({"512": row})
    line = [x for x in t.splitlines() if "| llama_q8_fa |" in x][0]
    assert "900.0 (810.0-990.0)" in line and "| 2.0 |" in line and "0.0012 / 98.4% (vs llama_f16); 0.0004 / 100.0% (vs llama_f16_fa) |" in line
    assert "0.80x" in [x for x in t.splitlines() if "| ours |" in x][0]
    assert "decode vs llama.cpp best" in t.splitlines()[0]
    assert "llama" not in format_table({"512": {k: v for k, v in row.items() if not k.startswith("llama")}}).splitlines()[0]


# --- with the extra installed -------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama_cpp():
    from mnn_h2o.model_source import resolve_gguf

    try:
        mod = L.check()
    except L.LlamaUnavailable as e:
        pytest.skip(f"the llama extra is not installed: {e}")
    try:
        L.preflight(resolve_gguf("smollm2"), 2)  # a llama.cpp that crashes would end this pytest run
    except L.LlamaUnavailable as e:
        pytest.skip(f"the installed llama.cpp does not run here: {e}")
    return mod


class _Stats:
    mnn_s = attention_s = 0.0
    kv_bytes_held = 1234


class _FakeEngine:
    """Stands in for our engine and stock MNN.llm (their own tests cover them): logits of a fixed
    vocabulary, records every token id it is fed."""

    def __init__(self, vocab, stats=True):
        self.vocab, self.fed = vocab, []
        if stats:
            self.stats = _Stats()

    def configure_eviction(self, section):
        pass

    def reset(self):
        self.fed = []

    def prefill(self, ids):
        self.fed += list(ids)
        return np.random.default_rng(len(self.fed)).standard_normal(self.vocab).astype(np.float32)

    def decode(self, tok):
        return self.prefill([tok])


def test_llama_rows_have_speeds_kv_bytes_quality_and_our_token_ids(llama_cpp, smollm2_path, tokenizer):
    from mnn_h2o.bench.speed import LLAMA_ROWS, format_table, run_speed
    from mnn_h2o.essays import essay_tokens

    ctx, n_dec = 48, 6
    made = {}

    def peers(n_ctx):
        made[n_ctx] = L.make_peers(smollm2_path, n_ctx, threads=2)
        return made[n_ctx]

    ours, stock = _FakeEngine(49152), _FakeEngine(49152, stats=False)
    res = run_speed(ours, stock, tokenizer, contexts=[ctx], n_decode=n_dec, repetitions=3, progress=False,
                    llama=peers)
    row = res[str(ctx)]
    ids = essay_tokens(tokenizer, ctx)
    assert row["prompt_ids_sha256"] == L.ids_digest(ids)
    assert list(made) == [ctx + n_dec + 8]
    for name in LLAMA_ROWS:
        e = row[name]
        assert e["fed_ids_sha256"] == row["prompt_ids_sha256"]  # llama.cpp's own record of its input
        for k in ("prefill_tps", "decode_tps"):
            assert e[k]["n"] == 3 and 1 < e[k]["min"] <= e[k]["median"] <= e[k]["max"] < 1e6
        assert e["threads"] == 2 and e["n_ctx"] == 256  # llama.cpp rounds n_ctx up to 256
        # SmolLM2: 30 layers x 3 KV heads x 64 dims, K and V, f16 = 2 bytes, q8_0 = 34 bytes per 32 values
        per_cell = 30 * 3 * 64 * 2 * (2 if e["type_k"] == "f16" else 34 / 32)
        assert e["kv_bytes_held"] == 256 * per_cell
        assert e["kv_buffer_logged_mib"] == pytest.approx(e["kv_bytes_held"] / 2**20, abs=0.01)
    assert (row["llama_f16"]["flash_attn"], row["llama_f16_fa"]["flash_attn"], row["llama_q8_fa"]["type_v"]) == \
        (False, True, "q8_0")
    assert "quality_vs_own_full" not in row["llama_f16"]
    assert list(row["llama_f16_fa"]["quality_vs"]) == ["llama_f16"]
    assert list(row["llama_q8_fa"]["quality_vs"]) == ["llama_f16", "llama_f16_fa"]
    for name in ("llama_f16_fa", "llama_q8_fa"):
        assert row[name]["quality_vs_own_full"] is row[name]["quality_vs"]["llama_f16"]
        for ref, q in row[name]["quality_vs"].items():
            assert q["reference"] == ref and q["tokens"] == n_dec
            assert 0 <= q["kl"] < 0.05 and q["top1_agreement"] >= 0.5
    assert row["decode_llama_best"] in LLAMA_ROWS and row["decode_ratio_ours_vs_llama_best"] > 0
    assert "| llama_q8_fa |" in format_table(res)
    assert all(p.closed for p in made[ctx + n_dec + 8].values())  # freed after the context's runs


def test_peer_logits_match_a_plain_llama_cpp_eval(llama_cpp, smollm2_path, tokenizer):
    """prefill/decode return the logits llama.cpp computes for the same ids in one batch, up to rounding."""
    from mnn_h2o.essays import essay_tokens

    ids = essay_tokens(tokenizer, 40)
    peer = L.LlamaPeer(smollm2_path, 64, 2, flash_attn=False)
    try:
        peer.prefill(ids[:30])
        for t in ids[30:-1]:
            step = peer.decode(t)
        assert peer.tokens_in() == ids[:-1]
        peer.reset()
        batch = peer.prefill(ids[:-1])
        assert peer.pos == len(ids) - 1
        # Not bit-equal: llama.cpp's batched and one-token matmuls round differently (KL ~0.003-0.005
        # here, and this position's top 3 logits lie within 0.13 of each other).
        from mnn_h2o.measure import log_softmax

        lb, ls = log_softmax(batch).astype(np.float64), log_softmax(step).astype(np.float64)
        assert float(np.sum(np.exp(lb) * (lb - ls))) < 0.02
        assert np.corrcoef(step, batch)[0, 1] > 0.999
        assert int((step > step[batch.argmax()]).sum()) < 5
    finally:
        peer.close()


def test_llama_cpp_loads_without_the_passive_wait_policy():
    """llama.cpp's barriers are OpenMP barriers: its libgomp must not see the bench's passive policy."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import os; from mnn_h2o.bench import llama_peer as L\n"
            "try:\n    L.check()\nexcept L.LlamaUnavailable:\n    print('absent'); raise SystemExit\n"
            "print(L.omp_wait_policy_at_load, '|', os.environ.get('OMP_WAIT_POLICY'))\n")
    env = dict(os.environ, OMP_WAIT_POLICY="passive", PYTHONPATH=root)
    env.pop("MNN_H2O_LLAMA_OMP_WAIT_POLICY", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                         timeout=120).stdout.strip()
    if out == "absent":
        pytest.skip("the llama extra is not installed")
    assert out == "unset (libgomp default) | passive"  # restored for MNN and BLAS afterwards
