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


def test_kv_dtype_choices_are_the_native_names():
    core = pytest.importorskip("mnn_h2o._core")
    assert list(config.key("runtime.kv_dtype").choices) == core.kv_dtypes()


@pytest.mark.parametrize("mode", ["probe", "full", "store"])
def test_lossless_store_needs_float_kv(mode):
    with pytest.raises(config.ConfigError, match="needs a float runtime.kv_dtype"):
        config.validate({"runtime": {"kv_dtype": "q8"}, "lossless": {"mode": mode}})
    config.validate({"runtime": {"kv_dtype": "q8"}, "lossless": {"mode": "off"}})


def test_quantised_kv_list_matches_the_native_row_sizes():
    core = pytest.importorskip("mnn_h2o._core")
    assert set(config.QUANTISED_KV) == {d for d in core.kv_dtypes() if core.kv_row_bytes(d, 64) < 128}


def test_policy_choices_are_the_native_registry():
    """One list of policy names: the native registry; config, the eval and error messages read it."""
    core = pytest.importorskip("mnn_h2o._core")
    names = core.policy_names()
    assert list(config.key("h2o.policy").choices) == names
    assert {"h2o", "snapkv", "tova", "keydiff", "vatp", "expected_attention", "streaming", "random"} == set(names)
    with pytest.raises(config.ConfigError) as e:
        config.validate({"h2o": {"policy": "lru"}})
    assert all(n in str(e.value) for n in names)
    for n in names:
        assert config.validate({"h2o": {"policy": n}})["h2o"]["policy"] == n
    from mnn_h2o.eval import frontier

    assert frontier.our_policies() == tuple(names)
    with pytest.raises(ValueError) as e:
        frontier.parse_methods("ours:lru", ())
    assert all(n in str(e.value) for n in names)
    with pytest.raises(config.ConfigError, match="h2o.observation_window"):
        config.validate({"h2o": {"observation_window": 0}})


def test_byte_budget_is_one_of_the_targets():
    cfg = config.validate({"h2o": {"kv_budget_bytes": 1 << 30, "target_lossy_ratio": 0.0}})
    assert cfg["h2o"]["kv_budget_bytes"] == 1 << 30
    with pytest.raises(config.ConfigError, match="set at most one"):
        config.validate({"h2o": {"kv_budget_bytes": 1 << 30, "target_keep_ratio": 0.5}})
    with pytest.raises(config.ConfigError, match="h2o.head_floor_share"):
        config.validate({"h2o": {"head_floor_share": 1.5}})
    with pytest.raises(config.ConfigError, match="h2o.layer_budget"):
        config.validate({"h2o": {"layer_budget": "cone"}})


@pytest.mark.parametrize("base, message", [
    ({"runtime": {"threads": "x"}}, "runtime.threads: expected int"),
    ({"runtime": {"threads": 0}}, "runtime.threads: 0 is out of range"),
    ({"h2o": {"target_keep_ratio": 0.5, "kv_budget_bytes": 1}}, "set at most one"),
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
    cfg = config.validate({"h2o": {"sink_tokens": 32}})
    assert config.validate(None, cfg) == cfg and config.validate(None, cfg) is not cfg
    assert config.validate({"h2o": {"sink_tokens": 16}}, cfg)["h2o"]["sink_tokens"] == 16


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
