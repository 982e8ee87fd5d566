// Eviction config and plan validation: every field against the schema (its first bad one named),
// the budget and layer rules, the model's bounds; which plans of kept runs a head accepts; the
// policy registry against the schema's names.
#include "eviction_test_support.h"

static void test_config_validation() {
    CHECK(eviction_config_error(EvictionConfig{}, 30).empty(), "defaults are valid: %s", eviction_config_error(EvictionConfig{}, 30).c_str());
    const auto bad = [](const char* field, auto mutate, int n_layers = 30) {
        EvictionConfig c;
        mutate(c);
        const std::string e = eviction_config_error(c, n_layers);
        CHECK(e.rfind(field, 0) == 0, "bad %s gave '%s'", field, e.c_str());
        CHECK(throws<std::invalid_argument>([&] { resolved(c, n_layers); }), "resolved(%s) did not throw", field);
    };
    bad("policy", [](EvictionConfig& c) { c.policy = "lru"; });
    bad("max_floor_share", [](EvictionConfig& c) { c.max_floor_share = 1.5; });
    bad("max_floor_share", [](EvictionConfig& c) { c.max_floor_share = -0.1; });
    bad("max_floor_share", [](EvictionConfig& c) { c.max_floor_share = std::nan(""); });
    bad("sink_tokens", [](EvictionConfig& c) { c.sink_tokens = -1; });
    bad("recent_tokens", [](EvictionConfig& c) { c.recent_tokens = 0; });
    bad("target_keep_ratio", [](EvictionConfig& c) { c.target_keep_ratio = 1.5; });
    bad("target_keep_ratio", [](EvictionConfig& c) { c.target_keep_ratio = NAN; });
    bad("target_lossy_ratio", [](EvictionConfig& c) { c.target_lossy_ratio = 0.5; });
    bad("target_lossy_ratio", [](EvictionConfig& c) { c.target_lossy_ratio = INFINITY; });
    bad("target_lossy_ratio", [](EvictionConfig& c) { c.target_lossy_ratio = 1000.5; });
    // The budget: a keep ratio or a byte cap (at most one) replaces the lossy ratio, whatever its
    // value; without either the lossy ratio is the target and must be a real ratio.
    bad("target_keep_ratio and kv_budget_bytes", [](EvictionConfig& c) {
        c.target_keep_ratio = 0.5;
        c.kv_budget_bytes = 1 << 20;
    });
    bad("target_lossy_ratio", [](EvictionConfig& c) { c.target_lossy_ratio = 0.0; });
    for (const double lossy : {0.0, 0.5, 3.0}) {
        EvictionConfig keep, cap;
        keep.target_keep_ratio = 0.5;
        keep.target_lossy_ratio = lossy;
        cap.kv_budget_bytes = 1 << 20;
        cap.target_lossy_ratio = lossy;
        CHECK(eviction_config_error(keep, 30).empty(), "keep ratio with lossy %g: %s", lossy, eviction_config_error(keep, 30).c_str());
        CHECK(eviction_config_error(cap, 30).empty(), "byte cap with lossy %g: %s", lossy, eviction_config_error(cap, 30).c_str());
    }
    bad("kv_budget_bytes", [](EvictionConfig& c) { c.kv_budget_bytes = -1; });
    bad("kv_budget_bytes", [](EvictionConfig& c) { c.kv_budget_bytes = schema::eviction::kv_budget_bytes::kHi + 1; });
    bad("seed", [](EvictionConfig& c) { c.seed = uint64_t{1} << 31; });
    bad("sink_tokens", [](EvictionConfig& c) { c.sink_tokens = (1 << 20) + 1; });
    bad("layer_budget", [](EvictionConfig& c) { c.layer_budget = "cone"; });
    bad("head_floor_share", [](EvictionConfig& c) { c.head_floor_share = -0.1; });
    bad("observation_window", [](EvictionConfig& c) { c.observation_window = 0; });
    bad("ema_alpha", [](EvictionConfig& c) { c.ema_alpha = 1.0; });
    bad("ema_alpha", [](EvictionConfig& c) { c.ema_alpha = -0.1; });
    bad("layer_start", [](EvictionConfig& c) { c.layer_start = 30; });
    bad("layer_start", [](EvictionConfig& c) { c.layer_start = 1025; }, 2000);  // the schema's bound
    bad("layer_start", [](EvictionConfig& c) { c.layer_start = -1; });
    bad("layer_end", [](EvictionConfig& c) {
        c.layer_start = 2;
        c.layer_end = 2;
    });
    bad("layer_end", [](EvictionConfig& c) { c.layer_end = 31; });
    bad("trigger_min_tokens", [](EvictionConfig& c) { c.trigger_min_tokens = -5; });
    bad("update_interval", [](EvictionConfig& c) { c.update_interval = 0; });
    CHECK(resolved(EvictionConfig{}, 30).layer_end == 30, "layer_end -1 resolves to n_layers");
    // The defaults are the schema's (config_schema.h, generated from mnn_h2o/config.py).
    const EvictionConfig d;
    CHECK(d.policy == schema::eviction::policy::kDefault && d.target_lossy_ratio == schema::eviction::target_lossy_ratio::kDefault &&
              d.layer_start == schema::eviction::layer_start::kDefault && d.sink_tokens == schema::eviction::sink_tokens::kDefault &&
              d.trigger_min_tokens == schema::eviction::trigger_min_tokens::kDefault &&
              d.layer_budget == schema::eviction::layer_budget::kDefault,
          "EvictionConfig defaults are the schema's");

    KvCache cache(small_config(3, 64));
    EvictionConfig c;
    c.layer_start = 3;  // only 3 layers
    CHECK(throws<std::invalid_argument>([&] { cache.enable_eviction(c); }), "enable_eviction validates");
    CHECK(cache.eviction_config() == nullptr, "a failed enable leaves eviction off");
}

static void test_plan_validation() {
    using Runs = std::vector<TokenRun>;
    const auto err = [](const Runs& r, int len = 100, int sink = 8, int recent = 10) {
        return plan_error(r, len, sink, recent);
    };
    CHECK(err({{0, 100}}).empty(), "keep all");
    CHECK(err({{0, 8}, {50, 5}, {90, 10}}).empty(), "floors and a middle run");
    CHECK(err({{0, 4}, {4, 4}, {60, 30}, {90, 10}}).empty(), "touching runs cover floors together");
    CHECK(!err({}).empty(), "empty plan");
    CHECK(!err({{0, 8}, {20, 0}, {90, 10}}).empty(), "empty run");
    CHECK(!err({{-1, 9}, {90, 10}}).empty(), "negative offset");
    CHECK(!err({{0, 8}, {90, 11}}).empty(), "past the end");
    CHECK(!err({{0, 8}, {100, 1}}).empty(), "offset at length");
    CHECK(!err({{0, 8}, {5, 10}, {90, 10}}).empty(), "overlap");
    CHECK(!err({{0, 8}, {90, 10}, {50, 5}}).empty(), "unsorted");
    CHECK(!err({{0, 8}, {89, 10}}).empty(), "last token dropped");
    CHECK(!err({{0, 7}, {90, 10}}).empty(), "sink floor");
    CHECK(!err({{1, 8}, {90, 10}}).empty(), "sink floor must start at 0");
    CHECK(!err({{0, 8}, {91, 9}}).empty(), "recent floor");
    CHECK(err({{0, 3}}, 3).empty(), "floors larger than the head: everything");
    CHECK(err({{99, 1}}, 100, 0, 1).empty(), "no floors: only the last token");
    CHECK(!err({{0, 1}}, 0, 0, 1).empty(), "empty head");
    CHECK(err({{0, 8}, {90, 10}}).find("run") == std::string::npos, "valid plan has no message");
    CHECK(err({{0, 8}, {5, 10}, {90, 10}}).rfind("run 1", 0) == 0, "message names the run: %s",
          err({{0, 8}, {5, 10}, {90, 10}}).c_str());

    std::vector<uint8_t> keep{1, 0, 1, 1, 0, 1};
    std::vector<TokenRun> runs;
    plan_from_blocks(keep, 90, 16, &runs);
    CHECK(runs.size() == 3 && runs[0].offset == 0 && runs[0].length == 16 && runs[1].offset == 32 &&
              runs[1].length == 32 && runs[2].offset == 80 && runs[2].length == 10,
          "plan_from_blocks merges adjacent blocks and clips the last");
}

// The registry has exactly the schema's policy names, in its order (a static_assert checks it at
// compile time; this says it where a reader of the tests looks), and each makes its policy.
static void test_registry_is_the_schemas() {
    using Policy = schema::eviction::policy;
    const std::vector<std::string>& names = policy_list();
    CHECK(names.size() == static_cast<size_t>(Policy::kChoiceCount), "%zu names", names.size());
    for (size_t i = 0; i < names.size() && i < static_cast<size_t>(Policy::kChoiceCount); ++i) {
        CHECK(names[i] == Policy::kChoices[i], "name %zu: %s", i, names[i].c_str());
        CHECK(make_policy(names[i], 0) != nullptr, "%s makes no policy", names[i].c_str());
    }
}

int main() {
    test_config_validation();
    test_plan_validation();
    test_registry_is_the_schemas();
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all eviction config tests passed\n");
    return 0;
}
