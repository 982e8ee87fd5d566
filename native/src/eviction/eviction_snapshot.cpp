// EvictionState's part of the cache snapshot (docs/session_format.md "KVCS", Eviction). Only what decides
// later results is saved: the schedule, the policy's state and each head's scores over the blocks
// it may hold; the scratch buffers are rewritten before they are read.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "mnn_h2o/eviction/eviction_state.h"

namespace mnn_h2o {

namespace {

// One field of the config: a name as its length and bytes, a bool as a byte, a number as itself.
template <class T>
void write_field(SnapshotWriter& w, const T& x) {
    if constexpr (std::is_same_v<T, std::string>)
        w.string(x);
    else if constexpr (std::is_same_v<T, bool>)
        w.value<uint8_t>(x ? 1 : 0);
    else
        w.value<T>(x);
}

// The resolved config as bytes, every field in the schema's order (config_schema.h): a restore
// compares them with its own, byte for byte.
std::string config_bytes(const EvictionConfig& c) {
    std::vector<uint8_t> out;
    SnapshotWriter w(&out);
#define MNN_H2O_WRITE(field, key, CType, CppType) write_field(w, c.field);
    MNN_H2O_EVICTION_FIELDS(MNN_H2O_WRITE)
#undef MNN_H2O_WRITE
    return std::string(out.begin(), out.end());
}

}  // namespace

void EvictionState::save(SnapshotWriter& w) const {
    w.string(config_bytes(cfg_));
    w.value<int64_t>(decode_tokens_);
    w.value<int64_t>(updates_);
    w.string(policy_->state());
    for (const LayerScores& ls : layers_) {
        w.value<int32_t>(ls.window_count);
        w.value<int32_t>(ls.step_window);
        w.value<uint8_t>(ls.window_restart ? 1 : 0);
        if (signals_.queries) {
            w.array(ls.qsum.data(), ls.qsum.size());
            w.array(ls.qsq.data(), ls.qsq.size());
        }
        for (size_t h = 0; h < ls.heads.size(); ++h) {
            const HeadScores& hs = ls.heads[h];
            // Every entry that may be non-zero: the blocks scored, positioned or windowed, and
            // those the interval's masses and counts reach (the head's blocks, at most stride_).
            size_t blocks = static_cast<size_t>(std::max({hs.n_scored, hs.n_pos, hs.window_blocks}));
            const float* acc = ls.acc.data() + h * stride_;
            for (size_t b = blocks; b < stride_; ++b)
                if (acc[b] != 0.f || hs.seen[b] != 0.0) blocks = b + 1;
            w.value<uint32_t>(static_cast<uint32_t>(blocks));
            w.value<int32_t>(hs.n_scored);
            w.value<int32_t>(hs.n_pos);
            w.value<int32_t>(hs.window_blocks);
            w.array(acc, blocks);
            w.array(hs.seen.data(), blocks);
            w.array(hs.ema.data(), blocks);
            w.array(hs.pos.data(), blocks);
            if (signals_.window) {
                w.array(ls.wacc.data() + h * stride_, blocks);
                w.array(hs.wseen.data(), blocks);
            }
            if (signals_.reconstruction) {
                // Scored blocks up to the last one (NaN = none); the rest are NaN again on load.
                uint32_t scored = static_cast<uint32_t>(hs.recon.size());
                while (scored > 0 && std::isnan(hs.recon[scored - 1])) --scored;
                w.value<uint32_t>(scored);
                w.array(hs.recon.data(), scored);
            }
        }
    }
}

void EvictionState::load(SnapshotReader& r) {
    r.require(r.string("eviction config") == config_bytes(cfg_),
              "the saved eviction config differs from this cache's (eviction section of the config)");
    decode_tokens_ = r.value<int64_t>("eviction decode_tokens");
    updates_ = r.value<int64_t>("eviction updates");
    r.require(decode_tokens_ >= 0 && updates_ >= 0, "negative eviction schedule counters");
    try {
        policy_->set_state(r.string("eviction policy state"));
    } catch (const SnapshotError&) {
        throw;
    } catch (const std::invalid_argument& e) {
        r.require(false, e.what());
    }
    for (LayerScores& ls : layers_) {
        ls.window_count = r.value<int32_t>("eviction window_count");
        ls.step_window = r.value<int32_t>("eviction step_window");
        const uint8_t restart = r.value<uint8_t>("eviction window_restart");
        r.require(restart <= 1, "window_restart must be 0 or 1");
        ls.window_restart = restart == 1;
        r.require(ls.window_count >= 0 && ls.window_count <= window_size_ && ls.step_window >= 0 &&
                      ls.step_window <= ls.window_count,
                  "observation window counts out of range");
        if (signals_.queries) {
            r.array(ls.qsum.data(), ls.qsum.size(), "eviction query sums");
            r.array(ls.qsq.data(), ls.qsq.size(), "eviction query squares");
        }
        for (size_t h = 0; h < ls.heads.size(); ++h) {
            HeadScores& hs = ls.heads[h];
            const uint32_t blocks = r.value<uint32_t>("eviction head blocks");
            r.require(blocks <= stride_, "a head's score blocks exceed the cache's blocks per head");
            hs.n_scored = r.value<int32_t>("eviction n_scored");
            hs.n_pos = r.value<int32_t>("eviction n_pos");
            hs.window_blocks = r.value<int32_t>("eviction window_blocks");
            const auto in_range = [&](int v) { return v >= 0 && static_cast<uint32_t>(v) <= blocks; };
            r.require(in_range(hs.n_scored) && in_range(hs.n_pos) && in_range(hs.window_blocks),
                      "a head's scored, positioned or window blocks exceed its stored blocks");
            r.array(ls.acc.data() + h * stride_, blocks, "eviction masses");
            r.array(hs.seen.data(), blocks, "eviction visibility counts");
            r.array(hs.ema.data(), blocks, "eviction EMA scores");
            r.array(hs.pos.data(), blocks, "eviction block positions");
            if (signals_.window) {
                r.array(ls.wacc.data() + h * stride_, blocks, "eviction window masses");
                r.array(hs.wseen.data(), blocks, "eviction window counts");
            }
            if (signals_.reconstruction) {
                const uint32_t scored = r.value<uint32_t>("eviction reconstruction blocks");
                r.require(scored <= hs.recon.size(), "a head's reconstruction scores exceed its blocks");
                std::fill(hs.recon.begin(), hs.recon.end(), std::numeric_limits<float>::quiet_NaN());
                r.array(hs.recon.data(), scored, "eviction reconstruction scores");
            }
        }
    }
}

}  // namespace mnn_h2o
