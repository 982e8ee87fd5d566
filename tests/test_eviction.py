"""H2O eviction in mnn_h2o._core.KvCache on synthetic data: argument checks, the decode-token
schedule, explicit plans against numpy, scores against a float64 reference, the policies, the
shared per-layer budget, statistics and memory returned."""
import numpy as np
import pytest

core = pytest.importorskip("mnn_h2o._core")

HD = 32


def make_cache(n_layers=3, n_kv=2, group=3, dtype="f32", block_tokens=16, max_tokens=2048):
    return core.KvCache(n_layers, n_kv, HD, n_kv * group, dtype=dtype, block_tokens=block_tokens,
                        max_tokens=max_tokens, threads=1)


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def step(cache, layer, n, rng, q=None, k=None):
    q = rand(rng, n, cache.n_heads * HD) if q is None else q
    k = rand(rng, n, cache.n_kv_heads * HD) if k is None else k
    v = rand(rng, n, cache.n_kv_heads * HD)
    out = np.empty((n, cache.n_heads * HD), np.float32)
    cache.step(layer, q, k, v, out)
    return out


def forward(cache, n, rng, prefill):
    """One forward of n tokens through every layer, then end_step (as the engine does)."""
    for layer in range(cache.n_layers):
        step(cache, layer, n, rng)
    return cache.end_step(n, prefill)


def attention(q, k, v, group):
    """float64 causal attention of q [n, n_heads, hd] over one kv head's k, v [len, hd]."""
    n, length = q.shape[0], k.shape[0]
    s = q.astype(np.float64) @ k.T.astype(np.float64) / np.sqrt(k.shape[1])  # [n, heads, len]
    visible = length - n + np.arange(n)[:, None, None] + 1
    s = np.where(np.arange(length)[None, None, :] < visible, s, -np.inf)
    p = np.exp(s - s.max(axis=2, keepdims=True))
    p /= p.sum(axis=2, keepdims=True)
    return p @ v.astype(np.float64), p


ARGS = dict(policy="h2o", layer_budget="uniform", sink_tokens=16, recent_tokens=32, target_keep_ratio=0.0, target_lossy_ratio=3.0,
            ema_alpha=0.5, layer_start=1, layer_end=-1, trigger_min_tokens=0, update_interval=4,
            per_head_budget=False, seed=0, max_floor_share=1.0, observation_window=32)


def test_enable_validates_and_names_the_argument():
    cache = make_cache()
    bad = dict(policy="lru", sink_tokens=-1, recent_tokens=0, target_keep_ratio=1.5, target_lossy_ratio=0.5,
               ema_alpha=1.0, layer_start=3, layer_end=1, trigger_min_tokens=-1, update_interval=0, seed=-1,
               max_floor_share=1.5, observation_window=0, head_floor_share=1.5, layer_budget="cone")
    for name, value in [*bad.items(), ("sink_tokens", 2**40), ("update_interval", -2**40),
                        ("ema_alpha", float("nan")), ("target_keep_ratio", -0.1)]:
        with pytest.raises(ValueError, match=name):
            cache.enable_eviction(**{**ARGS, name: value})
    with pytest.raises(ValueError, match="target_keep_ratio and kv_budget_bytes: set at most one"):
        cache.enable_eviction(**{**ARGS, "target_keep_ratio": 0.5, "kv_budget_bytes": 1 << 20})
    with pytest.raises(ValueError, match="kv_budget_bytes"):
        cache.enable_eviction(**{**ARGS, "target_lossy_ratio": 0.0, "kv_budget_bytes": -1})
    with pytest.raises(ValueError, match="target_lossy_ratio must be >= 1 when"):
        cache.enable_eviction(**{**ARGS, "target_lossy_ratio": 0.0})
    assert not cache.eviction_enabled
    # A keep ratio or a byte cap replaces the lossy ratio, whatever its value (no rewrite to 0).
    for replacing in ({"target_keep_ratio": 0.5}, {"kv_budget_bytes": 1 << 20}):
        for lossy in (0.0, 0.5, 3.0):
            cache.enable_eviction(**{**ARGS, **replacing, "target_lossy_ratio": lossy})
            assert cache.eviction_config()["target_lossy_ratio"] == lossy


def test_defaults_and_config_round_trip():
    """The keyword defaults are the config schema's (mnn_h2o/config.py, through the generated
    native header): enable_eviction() is the eviction section of config.defaults()."""
    from mnn_h2o import config

    cache = make_cache(n_layers=30)
    assert not cache.eviction_enabled and cache.eviction_config() is None
    cache.enable_eviction()
    assert cache.eviction_enabled
    want = config.native_args("eviction", config.defaults()["eviction"])
    assert cache.eviction_config() == {**want, "layer_end": 30 if want["layer_end"] == -1 else want["layer_end"]}
    with pytest.raises(ValueError) as e:
        cache.enable_eviction(policy="nope")
    # The message lists the registry's names, the one list config.py and the eval take too.
    names = core.policy_names()
    assert names[0] == "h2o" and len(names) == len(set(names)) == len(config.native_choices(config.key("eviction.policy")))
    assert all(f"'{n}'" in str(e.value) for n in names)
    assert cache.eviction_config()["policy"] == want["policy"]  # a failed enable keeps the previous settings
    cache.disable_eviction()
    assert not cache.eviction_enabled
    assert cache.end_step(1, False) is False
    with pytest.raises(ValueError):
        cache.block_scores(3)


def test_schedule_counts_decode_tokens():
    rng = np.random.default_rng(0)
    cache = make_cache()
    cache.enable_eviction(**{**ARGS, "target_lossy_ratio": 0.0, "target_keep_ratio": 0.5, "trigger_min_tokens": 100})
    assert not forward(cache, 60, rng, prefill=True)  # below the trigger: no update
    assert cache.eviction_stats()["updates"] == 0
    assert forward(cache, 140, rng, prefill=True)  # 200 tokens > budget of 100 (7 blocks)
    assert cache.eviction_stats()["updates"] == 1
    # 7 blocks: the sink block, 3 more by score, the recent ones 10-12 (the last holds 8 tokens)
    assert [cache.length(layer, h) for layer in (1, 2) for h in (0, 1)] == [104] * 4
    assert cache.length(0, 0) == cache.length(0, 1) == 200  # layer 0 is outside [1, 3)
    updates = []
    for t in range(1, 17):
        evicted = forward(cache, 1, rng, prefill=False)
        assert not evicted or t % 4 == 0
        updates.append(cache.eviction_stats()["updates"])
    assert updates == [1 + t // 4 for t in range(1, 17)]  # one update per 4 decode tokens, all layers
    with pytest.raises(ValueError):
        cache.end_step(0, False)


def test_explicit_plans_match_numpy():
    rng = np.random.default_rng(1)
    cache = make_cache(n_layers=1)
    cache.enable_eviction(**{**ARGS, "layer_start": 0, "update_interval": 1000})
    step(cache, 0, 150, rng)
    for _ in range(30):
        step(cache, 0, 1, rng)
    before = [cache.read(0, h) for h in range(2)]
    block_bytes = 16 * HD * 4
    held = cache.bytes_held()
    plans = [
        [(0, 32), (64, 16), (96, 32), (144, 36)],           # block-aligned: drops blocks 2, 3, 5, 8
        [(0, 20), (25, 3), (60, 40), (130, 50)],            # arbitrary: rows move
    ]
    for h, runs in enumerate(plans):
        cache.evict(0, h, runs)
        want_k = np.concatenate([before[h][0][o:o + n] for o, n in runs])
        want_v = np.concatenate([before[h][1][o:o + n] for o, n in runs])
        k, v = cache.read(0, h)
        np.testing.assert_array_equal(k, want_k)
        np.testing.assert_array_equal(v, want_v)
    assert cache.length(0, 0) == 116 and cache.length(0, 1) == 113
    assert held - cache.bytes_held() == 2 * (4 + 4) * block_bytes  # 12 -> 8 blocks each, K and V
    stats = cache.eviction_stats()["layers"][0]
    assert stats["evictions"] == 2 and stats["blocks_freed"] == 2 * (4 + 4) and stats["held"] == [116, 113]

    # Attention over the compacted cache equals attention over the kept tokens.
    q = rand(rng, 2, cache.n_heads * HD, scale=2.0)
    out = np.empty_like(q)
    cache.attend(0, q, out)
    q3 = q.reshape(2, cache.n_heads, HD)
    for h in range(2):
        k, v = cache.read(0, h)
        want, _ = attention(q3[:, 3 * h:3 * h + 3], k, v, 3)
        np.testing.assert_allclose(out.reshape(2, 6, HD)[:, 3 * h:3 * h + 3], want, rtol=0,
                                   atol=2e-5 * np.abs(want).max())


def test_invalid_plans_change_nothing():
    rng = np.random.default_rng(2)
    cache = make_cache(n_layers=1, dtype="f16")
    cache.enable_eviction(**{**ARGS, "layer_start": 0})
    step(cache, 0, 100, rng)
    k0, _ = cache.read(0, 0)
    held = cache.bytes_held()
    invalid = [
        [],                                  # keeps nothing
        [(0, 16), (50, 0), (68, 32)],        # empty run
        [(0, 16), (10, 20), (68, 32)],       # overlap
        [(0, 16), (68, 32), (20, 5)],        # unsorted
        [(0, 16), (68, 33)],                 # past the end
        [(-1, 17), (68, 32)],                # negative offset
        [(0, 15), (68, 32)],                 # sink floor
        [(0, 16), (70, 30)],                 # recent floor
        [(0, 16), (67, 32)],                 # drops the last token
    ]
    for runs in invalid:
        with pytest.raises(ValueError):
            cache.evict(0, 0, runs)
    for malformed in ("abc", [(1, 2, 3)], [("a", 1)], [(0.5, 3)], 5):
        with pytest.raises(ValueError):
            cache.evict(0, 0, malformed)
    with pytest.raises(IndexError):
        cache.evict(0, 2, [(0, 100)])
    np.testing.assert_array_equal(cache.read(0, 0)[0], k0)
    assert cache.bytes_held() == held and cache.length(0, 0) == 100
    assert cache.eviction_stats()["layers"][0]["invalid_plans"] == len(invalid)
    cache.evict(0, 0, np.array([[0, 16], [68, 32]]))  # numpy rows are pairs too
    assert cache.length(0, 0) == 48


def test_block_scores_match_reference():
    """EMA of per-block attention mass normalised by the (query, query head) pairs that saw it."""
    rng = np.random.default_rng(3)
    cache = make_cache(n_layers=2, n_kv=2, group=2)
    alpha = 0.3
    cache.enable_eviction(**{**ARGS, "target_lossy_ratio": 0.0, "target_keep_ratio": 1.0, "ema_alpha": alpha,
                        "update_interval": 2})
    G, bt = 2, 16
    mass = np.zeros((2, 64))
    seen = np.zeros((2, 64))
    ema = np.zeros((2, 64))
    scored = 0
    ks, vs = [[], []], [[], []]

    def run(n):
        q = rand(rng, n, 4 * HD, scale=2.0)
        k = rand(rng, n, 2 * HD)
        v = rand(rng, n, 2 * HD)
        out = np.empty_like(q)
        cache.step(1, q, k, v, out)
        for h in range(2):
            ks[h].append(k[:, h * HD:(h + 1) * HD])
            vs[h].append(v[:, h * HD:(h + 1) * HD])
            kk, vv = np.concatenate(ks[h]), np.concatenate(vs[h])
            _, p = attention(q.reshape(n, 4, HD)[:, G * h:G * h + G], kk, vv, G)
            per_key = p.sum(axis=(0, 1))
            np.add.at(mass[h], np.arange(len(kk)) // bt, per_key)
            pos = len(kk) - n + np.arange(n)  # query positions; each sees the blocks starting <= pos
            for b in range((len(kk) + bt - 1) // bt):
                seen[h, b] += G * np.count_nonzero(pos >= b * bt)
        return sum(len(x) for x in ks[0])

    def fold(length):
        nonlocal scored
        nb = (length + bt - 1) // bt
        mean = mass[:, :nb] / seen[:, :nb]
        old = np.arange(nb) < scored
        ema[:, :nb] = np.where(old, alpha * ema[:, :nb] + (1 - alpha) * mean, mean)
        mass[:] = 0
        seen[:] = 0
        scored = nb

    run(40)
    length = run(30)
    cache.end_step(30, True)  # within budget: no update, the prompt's scores carry on
    for i, n in enumerate((1, 1, 1, 3, 1)):
        length = run(n)
        cache.end_step(n, False)
        if i in (1, 3):  # 2 decode tokens, then 1 + 3 = 4 >= 2
            fold(length)
            got = cache.block_scores(1)
            assert got.shape == (2, scored) and got.dtype == np.float32
            np.testing.assert_allclose(got, ema[:, :scored], rtol=2e-5, atol=1e-9)
    assert np.isnan(cache.block_scores(0)).all()  # layer 0 collects nothing
    assert cache.eviction_stats()["updates"] == 2


def planted_cache(policy, per_head_budget=False, seed=0, layer_budget="uniform", **kw):
    """Layer 1, head 0: queries point at the keys of block 5, which take ~98% of the attention of
    every query that sees them (a heavy hitter); head 1: queries are zero, so its attention is
    uniform. Keep ratio 0.25 of 320 tokens: 5 blocks per head, 3 of them floors."""
    rng = np.random.default_rng(4)
    cache = make_cache(n_layers=2, n_kv=2, group=2)
    cache.enable_eviction(policy=policy, sink_tokens=16, recent_tokens=32, target_keep_ratio=0.25,
                     target_lossy_ratio=0.0, layer_start=1, trigger_min_tokens=0, update_interval=8,
                     per_head_budget=per_head_budget, seed=seed, layer_budget=layer_budget, **kw)
    u = rand(rng, HD)
    u /= np.linalg.norm(u)
    k = rand(rng, 320, 2 * HD, scale=0.3)
    k[80:96, :HD] += 20.0 * u  # block 5 of head 0
    for layer in range(2):
        q = np.zeros((320, 4 * HD), np.float32)
        q[:, :2 * HD] = np.tile(2.0 * u, 2)
        step(cache, layer, 320, rng, q=q, k=k)
    return cache, k


def kept_blocks(cache, k, layer=1, head=0):
    """Which 16-token blocks of the original keys a head still holds (matched by rows)."""
    held, _ = cache.read(layer, head)
    orig = k[:, head * HD:(head + 1) * HD].astype(np.float32)
    rows = [int(np.flatnonzero((orig == r).all(axis=1))[0]) for r in held]
    return sorted({r // 16 for r in rows})


def test_h2o_keeps_the_heavy_hitter_streaming_does_not():
    cache, k = planted_cache("h2o")
    assert cache.end_step(320, True)
    blocks = kept_blocks(cache, k)
    assert len(blocks) == 5 and 0 in blocks and 5 in blocks and {18, 19} <= set(blocks)
    scores = cache.block_scores(1)
    assert scores.shape == (2, 5) and scores[0].argmax() == blocks.index(5)  # scores moved with blocks

    cache, k = planted_cache("streaming")
    assert cache.end_step(320, True)
    assert kept_blocks(cache, k) == [0, 16, 17, 18, 19]


def test_random_policy_is_seeded():
    picks = []
    for seed in (1, 1, 2, 3):
        cache, k = planted_cache("random", seed=seed)
        cache.end_step(320, True)
        picks.append(kept_blocks(cache, k))
    assert picks[0] == picks[1]
    assert picks[0] != picks[2] or picks[0] != picks[3]
    for p in picks:
        assert len(p) == 5 and 0 in p and {18, 19} <= set(p)


def test_shared_budget_moves_blocks_to_the_spread_head():
    cache, _ = planted_cache("h2o", per_head_budget=False)
    cache.end_step(320, True)
    assert cache.eviction_stats()["layers"][1]["held"] == [80, 80]
    cache, k = planted_cache("h2o", per_head_budget=True)
    cache.end_step(320, True)
    held = cache.eviction_stats()["layers"][1]["held"]
    # Same layer total; head 0 spends its share on the heavy hitter only, head 1 gets the rest.
    assert held == [64, 96]
    assert 5 in kept_blocks(cache, k)
    # AdaKV's per-head minimum: with all of its budget guaranteed, head 0 keeps 5 blocks again
    # (the heavy hitter among them); half of it (2 blocks) is less than its 3 floor blocks: no change.
    cache, k = planted_cache("h2o", per_head_budget=True, head_floor_share=1.0)
    cache.end_step(320, True)
    assert cache.eviction_stats()["layers"][1]["held"] == [80, 80] and 5 in kept_blocks(cache, k)
    cache, k = planted_cache("h2o", per_head_budget=True, head_floor_share=0.5)
    cache.end_step(320, True)
    assert cache.eviction_stats()["layers"][1]["held"] == [64, 96]


def test_stats_and_memory_returned():
    rng = np.random.default_rng(5)
    n_layers = 12
    cache = core.KvCache(n_layers, 2, 64, 6, dtype="f16", block_tokens=64, max_tokens=4096, threads=1)
    cache.enable_eviction(policy="h2o", layer_budget="uniform", sink_tokens=64, recent_tokens=256,
                     target_lossy_ratio=3.0, layer_start=2, trigger_min_tokens=512)
    k = rand(rng, 512, 128)
    for layer in range(n_layers):
        for _ in range(8):
            cache.append(layer, k, k)

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    held0, rss0 = cache.bytes_held(), rss()
    assert cache.end_step(4096, True)
    held1, rss1 = cache.bytes_held(), rss()
    s = cache.eviction_stats()
    assert set(s) >= {"layers", "bytes_held", "bytes_uncompressed", "lossy_ratio", "policy_us"}
    assert s["bytes_held"] == held1
    assert s["bytes_uncompressed"] == n_layers * 4096 * 2 * 64 * 2 * 2
    assert s["lossy_ratio"] == pytest.approx(s["bytes_uncompressed"] / held1)
    assert 2.7 < s["lossy_ratio"] < 3.3
    freed = sum(layer["blocks_freed"] for layer in s["layers"]) * 64 * 64 * 2
    assert held0 - held1 == freed
    assert rss0 - rss1 > 0.8 * freed, (rss0 - rss1, freed)
    layer = s["layers"][5]
    assert set(layer) >= {"layer", "tokens_seen", "held", "bytes_held", "evictions", "blocks_freed", "policy_us",
                          "skipped", "invalid_plans"}
    assert layer["layer"] == 5 and layer["tokens_seen"] == 4096 and layer["evictions"] == 2
    assert set(layer["skipped"]) == {"below_trigger", "within_budget", "floors_exceed_target", "target_unreachable"}
    assert s["layers"][0]["held"] == [4096, 4096] and s["layers"][0]["evictions"] == 0
    assert s["policy_us"] > 0
    cache.reset()
    s = cache.eviction_stats()
    assert s["bytes_held"] == 0 and s["lossy_ratio"] == 1.0 and s["layers"][5]["evictions"] == 0


def test_unreachable_target_is_reported():
    rng = np.random.default_rng(6)
    cache = make_cache(n_layers=3)
    # 3 layers, only layer 2 evicts: the 2 full layers alone hold 2/3 > 1/2 of the uncompressed bytes.
    cache.enable_eviction(**{**ARGS, "target_lossy_ratio": 2.0, "layer_start": 2})
    forward(cache, 100, rng, prefill=True)
    for _ in range(4):
        forward(cache, 1, rng, prefill=False)
    assert cache.eviction_stats()["layers"][2]["skipped"]["target_unreachable"] == 2
    assert cache.length(2, 0) == 104


def test_quantised_dtype_pays_its_part_of_the_whole_model_target():
    """target_lossy_ratio is whole-model against f16 rows: a q8 cache at 6x keeps the tokens an
    f16 cache keeps at 6 * 17/32, holds 1/6 of f16's bytes, and q8 at 1.5x evicts nothing."""
    from mnn_h2o.eval.frontier import dtype_gain
    from mnn_h2o.eval.quality import eviction_target

    held = {}  # f16 at the eviction target the frontier's one rule gives (6 * 17/32)
    for dtype, target in (("f16", eviction_target(6.0, dtype_gain("ours", "q8"))), ("q8", 6.0), ("q8r", 1.5)):
        cache = make_cache(n_layers=10, dtype=dtype)
        cache.enable_eviction(policy="h2o", layer_budget="uniform", target_lossy_ratio=target, sink_tokens=16,
                         recent_tokens=32, layer_start=2, trigger_min_tokens=512)
        rng = np.random.default_rng(3)
        for _ in range(4):
            forward(cache, 256, rng, prefill=True)
        held[dtype] = [cache.length(layer, h) for layer in range(10) for h in range(2)]
        st = cache.eviction_stats()
        if dtype == "q8":
            assert 5.0 < st["whole_model_ratio"] < 6.1  # under by the floors and whole blocks of 1024 tokens
        if dtype == "q8r":
            assert held[dtype] == [1024] * 20 and 1.7 < st["whole_model_ratio"] < 32 / 17  # 34-byte rows, 64-byte blocks
    assert held["q8"] == held["f16"] and min(held["q8"]) < 1024


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_floors_larger_than_the_budget_shrink(share):
    """8x over a 2048-token prompt in 256-token chunks, 16 layers (15 evicting), floors 64 + 256
    tokens = 20 blocks against a 9-block budget: with max_floor_share > 0 the floors shrink and
    the whole model reaches ~8x; 0 is the old rule (such heads are left alone)."""
    rng = np.random.default_rng(11)
    cache = make_cache(n_layers=16, max_tokens=2048 + 64)
    cache.enable_eviction(**{**ARGS, "sink_tokens": 64, "recent_tokens": 256, "target_lossy_ratio": 8.0,
                        "trigger_min_tokens": 512, "update_interval": 32, "max_floor_share": share})
    for _ in range(8):
        forward(cache, 256, rng, prefill=True)
    s = cache.eviction_stats()
    exceed = sum(layer["skipped"]["floors_exceed_target"] for layer in s["layers"])
    if share == 0.0:
        assert exceed > 0 and cache.length(5, 0) == 2048 and s["lossy_ratio"] < 1.1
        return
    assert exceed == 0 and sum(layer["invalid_plans"] for layer in s["layers"]) == 0
    assert cache.length(5, 0) == 9 * 16  # the budget: ceil(2048 / 15 / 16) blocks
    assert 7.7 < s["lossy_ratio"] <= 8.0  # 16 * 2048 / (2048 + 15 * 144) = 7.79
    # Decode re-eviction keeps the whole model at the target too.
    for _ in range(64):
        forward(cache, 1, rng, prefill=False)
    assert 7.6 < cache.eviction_stats()["lossy_ratio"] <= 8.0


@pytest.mark.parametrize("policy", core.policy_names())
@pytest.mark.parametrize("dtype", ["f32", "q8r"])
def test_every_policy_evicts_to_budget_and_keeps_attention_exact(policy, dtype):
    """Every registry policy under the same budget and schedule: the planted cache is cut to 5
    blocks per head at the prompt and stays within budget through decode updates, and attention
    over what is kept still matches the reference (the cache stays consistent)."""
    rng = np.random.default_rng(9)
    cache = make_cache(n_layers=2, n_kv=2, group=2, dtype=dtype)
    cache.enable_eviction(policy=policy, sink_tokens=16, recent_tokens=32, target_keep_ratio=0.25,
                     target_lossy_ratio=0.0, layer_start=1, trigger_min_tokens=0, update_interval=8,
                     per_head_budget=policy in ("keydiff", "expected_attention"), observation_window=4,
                     layer_budget="uniform")
    forward(cache, 320, rng, prefill=True)
    held = cache.eviction_stats()["layers"][1]["held"]
    assert sum(held) == 160 and cache.eviction_stats()["layers"][0]["held"] == [320, 320]
    for _ in range(16):
        forward(cache, 1, rng, prefill=False)
    s = cache.eviction_stats()
    assert s["updates"] == 3 and s["layers"][1]["policy_us"] > 0
    n = s["layers"][1]["held"]
    assert sum(n) <= 2 * (0.25 * 336 + 16) + 16
    q = rand(rng, 1, 4 * HD)
    k = rand(rng, 1, 2 * HD)
    v = rand(rng, 1, 2 * HD)
    out = np.empty((1, 4 * HD), np.float32)
    cache.step(1, q, k, v, out)
    for h in range(2):
        kk, vv = cache.read(1, h)
        want, _ = attention(q.reshape(1, 4, HD)[:, 2 * h:2 * h + 2], kk, vv, 2)
        np.testing.assert_allclose(out.reshape(1, 4, HD)[:, 2 * h:2 * h + 2], want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", ["f16", "q8"])
def test_byte_budget_caps_the_whole_model(dtype):
    """eviction.kv_budget_bytes: the pool holds at most the cap after the prompt and through decode; the
    smaller q8 rows keep more tokens under the same cap."""
    rng = np.random.default_rng(6)
    cache = make_cache(n_layers=3, dtype=dtype)
    cap = 200 * 1024
    cache.enable_eviction(policy="h2o", layer_budget="uniform", sink_tokens=16, recent_tokens=32, target_lossy_ratio=0.0,
                     kv_budget_bytes=cap, layer_start=1, trigger_min_tokens=0, update_interval=4)
    assert cache.eviction_config()["kv_budget_bytes"] == cap
    forward(cache, 600, rng, prefill=True)
    assert 0.9 * cap < cache.eviction_stats()["bytes_held"] <= cap
    for _ in range(12):
        forward(cache, 1, rng, prefill=False)
    assert cache.eviction_stats()["bytes_held"] <= cap  # the 12th decode token ran an update
    held = sum(cache.eviction_stats()["layers"][2]["held"])
    assert held > (400 if dtype == "q8" else 100)
