// KvCache::snapshot / restore: the cache as it is held, in the "KVCS" bytes of a saved session
// (docs/session_format.md). A restore decodes and checks everything before it touches the cache.
#include <algorithm>
#include <cstring>
#include <string>

#include "mnn_h2o/cache/kv_cache.h"
#include "mnn_h2o/cache/snapshot_io.h"

namespace mnn_h2o {

namespace {

constexpr char kMagic[4] = {'K', 'V', 'C', 'S'};
// 2: each layer's sliding window after the shape (version 1 files, written before windows
// existed, load as all-global layers).
constexpr uint32_t kVersion = 2;

// The header's shape fields, in format order, with their names for messages.
struct ShapeField {
    const char* name;
    uint32_t value;
};

std::vector<ShapeField> shape_fields(const KvCacheConfig& c, size_t row_bytes) {
    return {{"n_layers", static_cast<uint32_t>(c.n_layers)},   {"n_kv_heads", static_cast<uint32_t>(c.n_kv_heads)},
            {"n_heads", static_cast<uint32_t>(c.n_heads)},     {"head_dim", static_cast<uint32_t>(c.head_dim)},
            {"dtype", static_cast<uint32_t>(c.dtype)},         {"block_tokens", static_cast<uint32_t>(c.block_tokens)},
            {"max_tokens", static_cast<uint32_t>(c.max_tokens)}, {"row_bytes", static_cast<uint32_t>(row_bytes)}};
}

void save_counters(SnapshotWriter& w, const EvictionLayerStats& s) {
    w.value<int64_t>(s.tokens_seen);
    w.value<int64_t>(s.evictions);
    w.value<int64_t>(s.blocks_freed);
    w.value<int64_t>(s.invalid_plans);
    w.value<double>(s.policy_us);
    w.value<double>(s.compact_us);
    w.array(s.skipped.data(), s.skipped.size());
}

EvictionLayerStats load_counters(SnapshotReader& r) {
    EvictionLayerStats s;
    s.tokens_seen = r.value<int64_t>("tokens_seen");
    s.evictions = r.value<int64_t>("evictions");
    s.blocks_freed = r.value<int64_t>("blocks_freed");
    s.invalid_plans = r.value<int64_t>("invalid_plans");
    s.policy_us = r.value<double>("policy_us");
    s.compact_us = r.value<double>("compact_us");
    r.array(s.skipped.data(), s.skipped.size(), "skip counters");
    r.require(s.tokens_seen >= 0 && s.tokens_seen <= (int64_t{1} << 40), "tokens_seen out of range");
    return s;
}

std::string store_on_message(const char* what, const StoreConfig& c) {
    return std::string(what) + ": the lossless store is on (lossless.mode " + store_mode_name(c.mode) +
           "); saved sessions hold caches with lossless.mode off";
}

}  // namespace

std::vector<uint8_t> KvCache::snapshot() const {
    if (store_) throw std::invalid_argument(store_on_message("snapshot", store_->config()));
    std::vector<uint8_t> out;
    out.reserve(pool_.bytes_held() + 4096);
    SnapshotWriter w(&out);
    w.bytes(kMagic, sizeof kMagic);
    w.value<uint32_t>(kVersion);
    for (const ShapeField& f : shape_fields(cfg_, row_bytes_)) w.value<uint32_t>(f.value);
    for (int layer = 0; layer < cfg_.n_layers; ++layer) w.value<uint32_t>(static_cast<uint32_t>(window(layer)));
    for (const EvictionLayerStats& s : stats_) save_counters(w, s);
    const int bt = cfg_.block_tokens;
    for (const Head& hs : heads_) {
        w.value<uint32_t>(static_cast<uint32_t>(hs.length));
        for (const auto* list : {&hs.k_blocks, &hs.v_blocks})
            for (int pos = 0; pos < hs.length; pos += bt)
                w.bytes((*list)[pos / bt], static_cast<size_t>(std::min(bt, hs.length - pos)) * row_bytes_);
    }
    w.value<uint8_t>(eviction_ ? 1 : 0);
    if (eviction_) eviction_->save(w);
    return out;
}

void KvCache::restore(const uint8_t* data, size_t size) {
    if (store_) throw SnapshotError(store_on_message("restore", store_->config()));
    SnapshotReader r(data, size);
    r.require(std::memcmp(r.take(sizeof kMagic, "magic"), kMagic, sizeof kMagic) == 0,
              "not a KV cache snapshot (magic)");
    const uint32_t version = r.value<uint32_t>("version");
    r.require(version == 1 || version == kVersion, "snapshot version " + std::to_string(version) +
                                                       ", this build reads 1 to " + std::to_string(kVersion));
    for (const ShapeField& f : shape_fields(cfg_, row_bytes_)) {
        const uint32_t saved = r.value<uint32_t>(f.name);
        r.require(saved == f.value, std::string("the snapshot's ") + f.name + " is " + std::to_string(saved) +
                                        ", this cache's " + std::to_string(f.value));
    }
    for (int layer = 0; layer < cfg_.n_layers; ++layer) {
        const uint32_t saved = version >= 2 ? r.value<uint32_t>("layer window") : 0;
        r.require(saved == static_cast<uint32_t>(window(layer)),
                  "the snapshot's layer " + std::to_string(layer) + " has a sliding window of " + std::to_string(saved) +
                      " tokens, this cache's " + std::to_string(window(layer)));
    }
    std::vector<EvictionLayerStats> stats(stats_.size());
    for (EvictionLayerStats& s : stats) s = load_counters(r);

    struct Rows {
        int length;
        const uint8_t* k;
        const uint8_t* v;
    };
    std::vector<Rows> rows(heads_.size());
    for (size_t i = 0; i < heads_.size(); ++i) {
        const uint32_t length = r.value<uint32_t>("head length");
        const int64_t seen = stats[i / static_cast<size_t>(cfg_.n_kv_heads)].tokens_seen;
        r.require(length <= static_cast<uint32_t>(cfg_.max_tokens) && length <= seen,
                  "a head holds more tokens than max_tokens or than its layer has seen");
        const int w = window(static_cast<int>(i / static_cast<size_t>(cfg_.n_kv_heads)));
        r.require(w == 0 || length < static_cast<uint32_t>(w + 2 * cfg_.block_tokens),
                  "a window layer's head holds more tokens than its window keeps");
        const size_t bytes = static_cast<size_t>(length) * row_bytes_;
        rows[i].length = static_cast<int>(length);
        rows[i].k = r.take(bytes, "K rows");
        rows[i].v = r.take(bytes, "V rows");
    }
    const uint8_t enabled = r.value<uint8_t>("eviction enabled");
    r.require(enabled <= 1, "h2o enabled must be 0 or 1");
    r.require((enabled == 1) == (eviction_ != nullptr), enabled ? "the snapshot has eviction on, this cache has it off"
                                                           : "the snapshot has eviction off, this cache has it on");
    std::unique_ptr<EvictionState> eviction;
    if (enabled) {
        eviction = std::make_unique<EvictionState>(eviction_->config(), cfg_);
        eviction->load(r);
    }
    r.require(r.left() == 0, std::to_string(r.left()) + " trailing bytes");

    // Everything decoded: now replace the contents.
    reset();
    const int bt = cfg_.block_tokens;
    try {
        for (size_t i = 0; i < heads_.size(); ++i) {
            Head& hs = heads_[i];
            for (int pos = 0; pos < rows[i].length; pos += bt) {
                const size_t offset = static_cast<size_t>(pos) * row_bytes_;
                const size_t n = static_cast<size_t>(std::min(bt, rows[i].length - pos)) * row_bytes_;
                // Both blocks first: the lists stay of equal length for reset() if one fails.
                void* k = pool_.allocate(hs.k_blocks.empty() ? nullptr : hs.k_blocks.back());
                void* v = nullptr;
                try {
                    v = pool_.allocate(hs.v_blocks.empty() ? nullptr : hs.v_blocks.back());
                } catch (...) {
                    pool_.release(k);
                    throw;
                }
                std::memcpy(k, rows[i].k + offset, n);
                std::memcpy(v, rows[i].v + offset, n);
                hs.k_blocks.push_back(k);  // reserved to max_blocks(): never reallocates
                hs.v_blocks.push_back(v);
            }
            hs.length = rows[i].length;
        }
    } catch (...) {
        reset();
        throw;
    }
    stats_ = std::move(stats);
    if (eviction) eviction_ = std::move(eviction);
}

}  // namespace mnn_h2o
