import os

import pytest

from mnn_h2o import config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_docs_table_matches_schema():
    with open(os.path.join(ROOT, "docs", "config.md"), encoding="utf-8") as f:
        assert f.read() == config.markdown(), "docs/config.md is stale: python -m mnn_h2o.config --markdown > docs/config.md"


def test_meanings_say_what_a_key_does_not_what_it_measured():
    """A figure from one run goes stale in docs/config.md; measurements belong in docs/results.md."""
    import re

    measurement = re.compile(r"\d\s*%|\d\.\d+x\b|\bKL\b|SmolLM2|Qwen|\bmeasured \d")
    for k in config.SCHEMA:
        assert not measurement.search(k.meaning), f"{k.path}: {k.meaning}"


def test_shipped_yaml_is_valid_and_covers_every_key():
    import yaml

    path = os.path.join(ROOT, "h2o.yaml")
    cfg = config.load(path)
    with open(path) as f:
        raw = yaml.safe_load(f)
    for k in config.SCHEMA:
        assert k.name in raw[k.section], f"h2o.yaml does not set {k.path}"
        assert cfg[k.section][k.name] == raw[k.section][k.name]


@pytest.mark.parametrize("raw, message", [
    ({"runtime": {"thread": 2}}, "unknown key runtime.thread"),
    ({"runtim": {}}, "unknown section 'runtim'"),
    ({"runtime": {"threads": "2"}}, "runtime.threads: expected int"),
    ({"runtime": {"threads": True}}, "runtime.threads: expected int"),
    ({"runtime": {"threads": 0}}, "runtime.threads: 0 is out of range"),
    ({"runtime": {"kv_dtype": "f8"}}, "runtime.kv_dtype: 'f8' is not allowed (allowed: f16 | bf16 | f32 | q8 | q4 | q4r | q8r)"),
    ({"model": {"weight_bits": 3}}, "model.weight_bits: 3 is not allowed"),
    ({"model": ["x"]}, "model: expected a mapping"),
    ([1, 2], "config must be a mapping"),
])
def test_bad_values_are_named(raw, message):
    with pytest.raises(config.ConfigError) as e:
        config.validate(raw)
    assert message in str(e.value)


def test_bad_yaml_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("runtime: {threads: [\n")
    with pytest.raises(config.ConfigError, match="not valid YAML"):
        config.load(str(p))
    with pytest.raises(config.ConfigError, match="cannot read config"):
        config.load(str(tmp_path / "missing.yaml"))


def test_overrides_apply_after_file():
    cfg = config.load(None, {"runtime.threads": 1, "model.name": "x.gguf"})
    assert cfg["runtime"]["threads"] == 1 and cfg["model"]["name"] == "x.gguf"


def test_command_line_assignments():
    assert config.parse_assignment("lossless.decode_cache_bytes=4194304") == ("lossless.decode_cache_bytes", 4194304)
    assert config.parse_assignment('lossless.mode="off"') == ("lossless.mode", "off")
    assert config.parse_assignment("bench.prompt_lengths=[512, 4096]") == ("bench.prompt_lengths", [512, 4096])
    for bad in ("threads=2", "runtime.threads", "runtime.threads=[1,"):
        with pytest.raises(config.ConfigError):
            config.parse_assignment(bad)
    # A bare off is YAML's boolean: the error says how to write it.
    with pytest.raises(config.ConfigError, match="quote it"):
        config.load(None, dict([config.parse_assignment("lossless.mode=off")]))


def test_kv_dtype_names_round_trip_by_name_through_the_binding():
    """The native enum is matched to the schema's names by name (kv_dtype.h's table): every name
    makes a cache of that type and reads back as itself, whatever the order of either list."""
    core = pytest.importorskip("mnn_h2o._core")
    names = config.key("runtime.kv_dtype").choices
    assert sorted(names) == sorted(core.kv_dtypes())
    for name in names:
        assert core.KvCache(1, 1, 64, 1, dtype=name).dtype == name
        assert core.kv_row_bytes(name, 64) > 0
    with pytest.raises(ValueError, match="dtype must be one of " + ", ".join(core.kv_dtypes())):
        core.KvCache(1, 1, 64, 1, dtype="q2")


def test_config_imports_without_the_native_module(tmp_path):
    """A source tree with no built _core: the config module (and its generators) still work."""
    import shutil
    import subprocess
    import sys

    shutil.copytree(os.path.join(ROOT, "mnn_h2o"), tmp_path / "mnn_h2o",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    code = ("import importlib.util, sys\n"
            "import mnn_h2o.config as c\n"
            "assert importlib.util.find_spec('mnn_h2o._core') is None\n"
            "assert 'kvzip' in c.key('eviction.policy').choices\n"
            "sys.stdout.write(c.native_header())\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("MNN_H2O_CORE_DIR", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout == config.native_header()


@pytest.mark.parametrize("mode", ["off", "probe", "full", "store"])
def test_every_lossless_mode_takes_every_kv_dtype(mode):
    for dtype in config.key("runtime.kv_dtype").choices:
        cfg = config.validate({"runtime": {"kv_dtype": dtype}, "lossless": {"mode": mode}})
        assert (cfg["runtime"]["kv_dtype"], cfg["lossless"]["mode"]) == (dtype, mode)


def test_quantised_kv_list_matches_the_native_row_sizes():
    core = pytest.importorskip("mnn_h2o._core")
    assert set(config.QUANTISED_KV) == {d for d in core.kv_dtypes() if core.kv_row_bytes(d, 64) < 128}
    assert set(config.INT8_KV) == {d for d in core.kv_dtypes() if core.kv_row_bytes(d, 64) == 64 + 2 * 64 // 32}


def test_policy_choices_are_the_native_registry():
    """One list of policy names, the schema's: the native registry (checked by a static_assert
    too) has exactly these, and config, the eval and error messages read them."""
    core = pytest.importorskip("mnn_h2o._core")
    names = core.policy_names()
    assert list(config.native_choices(config.key("eviction.policy"))) == names
    assert list(config.key("eviction.policy").choices) == ["auto"] + names
    assert {"h2o", "snapkv", "tova", "keydiff", "vatp", "expected_attention", "streaming", "random",
            "kvzip", "predicted_kvzip"} == set(names)
    with pytest.raises(config.ConfigError) as e:
        config.validate({"eviction": {"policy": "lru"}})
    assert all(n in str(e.value) for n in names)
    for n in names:
        assert config.validate({"eviction": {"policy": n}})["eviction"]["policy"] == n
    from mnn_h2o.eval import frontier

    assert frontier.our_policies() == tuple(names)
    with pytest.raises(ValueError) as e:
        frontier.parse_methods("ours:lru", ())
    assert all(n in str(e.value) for n in names)
    with pytest.raises(config.ConfigError, match="eviction.observation_window"):
        config.validate({"eviction": {"observation_window": 0}})


@pytest.mark.parametrize("raw, message", [
    ({"eviction": {"target_keep_ratio": 0.5, "kv_budget_bytes": 1}},
     "eviction.target_keep_ratio and eviction.kv_budget_bytes: set at most one, got 0.5 and 1"),
    ({"eviction": {"target_lossy_ratio": 0.5}},
     "eviction.target_lossy_ratio must be >= 1 when eviction.target_keep_ratio and eviction.kv_budget_bytes are 0, got 0.5"),
    ({"eviction": {"layer_start": 5, "layer_end": 3}},
     "eviction.layer_end must be -1 (all layers) or > eviction.layer_start (5), got 3"),
    ({"lossless": {"chunk_tokens": 40}}, "lossless.chunk_tokens must be a multiple of runtime.block_tokens (16), got 40"),
    ({"eviction": {"policy": "kvzip", "prefill_eviction": "chunk"}},
     "eviction.prefill_eviction chunk cannot be used with eviction.policy kvzip"),
])
def test_cross_key_rules_name_every_key_by_its_path(raw, message):
    """The rules over several native keys are the native validation's (one copy, asked through
    the binding); config.validate writes the fields its message names as their config paths."""
    pytest.importorskip("mnn_h2o._core")
    with pytest.raises(config.ConfigError) as e:
        config.validate(raw)
    assert message in str(e.value)


def test_byte_budget_is_one_of_the_targets():
    cfg = config.validate({"eviction": {"kv_budget_bytes": 1 << 30, "target_lossy_ratio": 0.0}})
    assert cfg["eviction"]["kv_budget_bytes"] == 1 << 30
    with pytest.raises(config.ConfigError, match="set at most one"):
        config.validate({"eviction": {"kv_budget_bytes": 1 << 30, "target_keep_ratio": 0.5}})
    with pytest.raises(config.ConfigError, match="eviction.head_floor_share"):
        config.validate({"eviction": {"head_floor_share": 1.5}})
    with pytest.raises(config.ConfigError, match="eviction.layer_budget"):
        config.validate({"eviction": {"layer_budget": "cone"}})


# --- one source of truth: the schema, the generated header, the native structs, the C API (its
# own test, native/tests/test_c_api.cpp), the binding, the engine and h2o.yaml agree -------------

def test_native_header_matches_schema():
    with open(os.path.join(ROOT, *config.NATIVE_HEADER.split("/")), encoding="utf-8") as f:
        assert f.read() == config.native_header(), \
            f"{config.NATIVE_HEADER} is stale: python -m mnn_h2o.config --native-header > {config.NATIVE_HEADER}"


def test_shipped_yaml_holds_the_schema_defaults():
    """h2o.yaml is the defaults written out ('the built-in defaults', bench --help): never others."""
    import yaml

    with open(os.path.join(ROOT, "h2o.yaml")) as f:
        raw = yaml.safe_load(f)
    assert {s: raw[s] for s in config.SECTIONS} == config.defaults()


def _signature_defaults(method) -> dict:
    """{argument: default} from a pybind11 method's signature line."""
    import ast
    import re

    line = method.__doc__.splitlines()[0]
    found = re.findall(r"(\w+): [^=,]+? = (.+?)(?=, \w+: |\) -> )", line)
    return {name: ast.literal_eval(value) for name, value in found}


@pytest.mark.parametrize("section, method", [("runtime", "__init__"), ("eviction", "enable_eviction"),
                                             ("lossless", "enable_store")])
def test_binding_arguments_are_the_schema_keys_and_defaults(section, method):
    core = pytest.importorskip("mnn_h2o._core")
    got = _signature_defaults(getattr(core.KvCache, method))
    got.pop("faults", None)  # enable_store's test hook, no config key
    got.pop("max_tokens", None)  # the constructor's capacity, no config key (the engine sizes it)
    got.pop("windows", None)  # the model's sliding windows, no config key (the engine's, per architecture)
    assert got == config.native_args(section, config.defaults()[section])


def _native_cache():
    core = pytest.importorskip("mnn_h2o._core")
    # Enough layers for every layer key's upper bound; a float dtype and the default block size.
    return core.KvCache(config.key("eviction.layer_end").range[1] + 1, 1, 16, 1, dtype="f16",
                        block_tokens=config.defaults()["runtime"]["block_tokens"], max_tokens=64)


def test_native_defaults_are_the_schema_defaults():
    """No arguments: the native structs' defaults, which the C API's init function copies."""
    core = pytest.importorskip("mnn_h2o._core")
    bare = core.KvCache(1, 1, 64, 1)
    assert {"dtype": bare.dtype, "block_tokens": bare.block_tokens, "threads": bare.threads} == \
        config.native_args("runtime", config.defaults()["runtime"])
    cache = _native_cache()
    cache.enable_eviction()
    want = config.native_args("eviction", config.defaults()["eviction"])
    assert cache.eviction_config() == {**want, "layer_end": cache.n_layers if want["layer_end"] == -1 else want["layer_end"]}
    cache.enable_store(mode="store")
    assert cache.store_config() == {**config.native_args("lossless", config.defaults()["lossless"]), "mode": "store"}


def _edges(k):
    """Values at and just beyond each bound of a native key, and its choices plus a wrong one."""
    if k.choices is not None and k.type is int:
        return sorted({c + d for c in k.choices for d in (-16, -1, 0, 1, 16)})
    if k.choices is not None:
        return list(k.choices) + ["no-such-" + k.name]
    if k.type is bool:
        return [True, False]
    lo, hi = k.range
    if k.type is int:
        return [lo - 1, lo, lo + 1, hi - 1, hi, hi + 1]
    import math

    return [lo - 1.0, math.nextafter(lo, -math.inf), lo, math.nextafter(hi, -math.inf), hi,
            math.nextafter(hi, math.inf), hi + 1.0, float("nan"), float("inf")]


def _python_accepts(section, name, value):
    raw = {"runtime": {"kv_dtype": "f16"}}
    if section == "lossless":
        raw["lossless"] = {"mode": "store"}
    if section == "runtime":
        raw["lossless"] = {"chunk_tokens": 4096}  # a multiple of every block size: block_tokens alone is judged
    raw.setdefault(section, {})[name] = value
    try:
        return True, config.validate(raw)[section]
    except config.ConfigError:
        return False, None


def _native_runtime(values):
    """The runtime keys of a cache made with ``values`` (head_dim 64 suits every dtype), or None
    when the constructor refuses them."""
    core = pytest.importorskip("mnn_h2o._core")
    try:
        c = core.KvCache(1, 1, 64, 1, max_tokens=64, **values)
    except (ValueError, TypeError):
        return None
    return {"dtype": c.dtype, "block_tokens": c.block_tokens, "threads": c.threads}


def _native_accepts(cache, section, values):
    try:
        if section == "eviction":
            cache.enable_eviction(**values)
        else:
            cache.enable_store(**values)
        return True
    except (ValueError, TypeError):
        return False


@pytest.mark.parametrize("path", [k.path for s in config.NATIVE_SECTIONS for k in config.native_keys(s)])
def test_python_and_native_validation_agree(path):
    """Each bound, bound +- 1 (and the neighbouring floats), each choice and a wrong one: the
    Python validation and the native one (through the binding) accept the same values."""
    k = config.key(path)
    native_name = config.NATIVE_NAMES.get(path, k.name)
    cache = _native_cache()
    for value in _edges(k):
        py_ok, section = _python_accepts(k.section, k.name, value)
        # The native side gets the same section: the defaults (mode store) with this one value.
        base = config.defaults()[k.section]
        if k.section == "lossless":
            base["mode"] = "store"
        values = config.native_args(k.section, {**base, k.name: value})
        if k.section == "runtime":
            got = _native_runtime(values)
            native_ok = got is not None
        else:
            native_ok = _native_accepts(cache, k.section, values)
            got = cache.eviction_config() if k.section == "eviction" else cache.store_config()
        assert py_ok == native_ok, f"{path} = {value!r}: Python {'accepts' if py_ok else 'rejects'}, " \
                                   f"native {'accepts' if native_ok else 'rejects'}"
        if py_ok and got is None:  # mode off: the store is off
            assert path == "lossless.mode" and value == "off"
        elif py_ok:
            want = config.core_value(k, section[k.name])  # auto: as the core alone
            assert got[native_name] == (cache.n_layers if path == "eviction.layer_end" and value == -1 else want)


@pytest.mark.parametrize("keep, cap, lossy", [(0.0, 0, 0.5), (0.0, 0, 1.0), (0.5, 0, 0.0), (0.5, 0, 0.5),
                                              (0.0, 1 << 20, 0.0), (0.5, 1 << 20, 3.2), (0.0, 0, 0.0)])
def test_budget_rule_is_the_same_on_both_sides(keep, cap, lossy):
    """target_keep_ratio or kv_budget_bytes (at most one) replaces target_lossy_ratio, which is
    otherwise at least 1: the same rule in config.py and native, and no layer rewrites a value."""
    h = {"target_keep_ratio": keep, "kv_budget_bytes": cap, "target_lossy_ratio": lossy}
    try:
        config.validate({"eviction": h})
        py_ok = True
    except config.ConfigError:
        py_ok = False
    cache = _native_cache()
    native_ok = _native_accepts(cache, "eviction", {**config.native_args("eviction", config.defaults()["eviction"]), **h})
    assert py_ok == native_ok
    if native_ok:
        assert {n: cache.eviction_config()[n] for n in h} == h


def test_engine_passes_sections_through_unchanged():
    """Llm.configure_* validate once (config.validate) and hand the section to the native cache
    as it is: a keep ratio leaves target_lossy_ratio alone, the scope is the native one."""
    core = pytest.importorskip("mnn_h2o._core")
    from mnn_h2o.engine import Llm

    from mnn_h2o.engine import KvContext

    llm = Llm.__new__(Llm)  # the configuration methods need only the cache
    llm.ctx = KvContext()
    llm._block_tokens, llm.kv_dtype = 16, "f16"
    llm.cache = core.KvCache(4, 1, 16, 1, dtype="f16", block_tokens=16, max_tokens=64)
    llm.configure_eviction({"policy": "h2o", "target_keep_ratio": 0.5, "prefill_eviction": "chunk"})
    want = config.validate({"eviction": {"policy": "h2o", "target_keep_ratio": 0.5, "prefill_eviction": "chunk"}})["eviction"]
    want["prompt_end_share"] = 0.0  # -1, the model's choice, resolved: h2o takes no share
    assert llm.eviction == want
    assert llm.cache.eviction_config() == {**config.native_args("eviction", want), "layer_end": 4}
    llm.configure_lossless({"mode": "store", "scope": "kept", "front_n": 3})
    want = config.validate({"lossless": {"mode": "store", "scope": "kept", "front_n": 3},
                            "runtime": {"kv_dtype": "f16"}})["lossless"]
    assert llm.lossless == want and llm.cache.store_config() == config.native_args("lossless", want)
    with pytest.raises(config.ConfigError, match="eviction.sink_tokens: expected int"):
        llm.configure_eviction({"sink_tokens": "64"})


@pytest.mark.parametrize("base, message", [
    ({"runtime": {"threads": "x"}}, "runtime.threads: expected int"),
    ({"runtime": {"threads": 0}}, "runtime.threads: 0 is out of range"),
    ({"eviction": {"target_keep_ratio": 0.5, "kv_budget_bytes": 1}}, "set at most one"),
    ({"runtime": {"thread": 2}}, "unknown key runtime.thread"),
    ([1], "config must be a mapping"),
])
def test_validate_checks_its_base_too(base, message):
    """validate(None, cfg) is how the engine checks a config it is handed: bad input is an error."""
    for raw in (None, {}, {"model": {"name": "x"}}):
        with pytest.raises(config.ConfigError) as e:
            config.validate(raw, base)
        assert message in str(e.value)


def test_validate_of_a_valid_config_is_that_config():
    cfg = config.validate({"eviction": {"sink_tokens": 32}})
    assert config.validate(None, cfg) == cfg and config.validate(None, cfg) is not cfg
    assert config.validate({"eviction": {"sink_tokens": 16}}, cfg)["eviction"]["sink_tokens"] == 16


def test_old_names_still_read_as_the_new_ones_each_named_once(capsys, monkeypatch):
    monkeypatch.setattr(config, "_reported", set())
    cfg = config.validate({"h2o": {"sink_tokens": 32, "policy": "h2o"},
                           "lossless": {"scope": "h2o_kept"}, "bench": {"cases": ["baseline", "h2o", "q8_h2o"]}})
    assert cfg["eviction"]["sink_tokens"] == 32 and cfg["eviction"]["policy"] == "h2o"
    assert cfg["lossless"]["scope"] == "kept" and cfg["bench"]["cases"] == ["baseline", "evict", "q8_evict"]
    err = capsys.readouterr().err.splitlines()
    assert "config: h2o.sink_tokens is now eviction.sink_tokens (the old name still works)" in err
    assert "config: lossless.scope=h2o_kept is now lossless.scope=kept (the old name still works)" in err
    assert len(err) == 5  # two keys, three values; the policy named h2o is not a renamed value
    config.load(None, {"h2o.sink_tokens": 16})
    assert capsys.readouterr().err == ""  # once per process
    assert config.validate({"h2o": {"recent_tokens": 8}}, notify=False)["eviction"]["recent_tokens"] == 8
    with pytest.raises(config.ConfigError, match="h2o is the old name of eviction"):
        config.validate({"h2o": {"sink_tokens": 32}, "eviction": {"sink_tokens": 16}})


def test_every_old_key_has_its_new_one():
    old = config.renamed()
    for k in config.SCHEMA:
        if k.section == "eviction":
            assert old[f"h2o.{k.name}"] == k.path
    for o, n in old.items():
        path, _, value = n.partition("=")
        assert path in {k.path for k in config.SCHEMA}
        if value and o.partition("=")[0] in config.RENAMED_KEYS:  # a key that became another's value
            assert value == config.RENAMED_KEYS[o.partition("=")[0]][1] + o.partition("=")[2]
        elif value:
            assert value in config.key(path).choices and o.partition("=")[2] not in config.key(path).choices


def test_config_check_names_the_renamed_keys(tmp_path):
    import subprocess
    import sys
    f = tmp_path / "old.yaml"
    f.write_text("h2o:\n  sink_tokens: 32\n")
    r = subprocess.run([sys.executable, "-m", "mnn_h2o.config", "--check", str(f)], capture_output=True, text=True)
    assert r.returncode == 0 and "valid" in r.stdout and "h2o.sink_tokens is now eviction.sink_tokens" in r.stderr
    f.write_text("h2o:\n  sink_tokens: -1\n")
    r = subprocess.run([sys.executable, "-m", "mnn_h2o.config", "--check", str(f)], capture_output=True, text=True)
    assert r.returncode == 1 and "eviction.sink_tokens" in r.stderr
