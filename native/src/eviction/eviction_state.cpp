#include "mnn_h2o/eviction/eviction_state.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace mnn_h2o {

namespace {

// Moves per-block values along with a compaction by runs: new block j gets the token-weighted
// mean of the values of the old blocks its tokens came from, counting only old blocks < limit.
// Kept tokens only move down, so every value is read before any is written and this works in
// place. Entries from the new block count up to old_blocks are zeroed. Returns how many new
// blocks got a token from an old block < limit (a prefix, since runs are sorted).
template <class T>
int remap_blocks(const std::vector<TokenRun>& runs, int block_tokens, int old_blocks, int limit, T* values,
                 std::vector<double>* sum, std::vector<double>* count) {
    int64_t kept = 0;
    for (const TokenRun& r : runs) kept += r.length;
    const int new_blocks = static_cast<int>((kept + block_tokens - 1) / block_tokens);
    std::fill(sum->begin(), sum->begin() + new_blocks, 0.0);
    std::fill(count->begin(), count->begin() + new_blocks, 0.0);
    int reached = 0;
    int64_t dst = 0;
    for (const TokenRun& r : runs) {
        for (int64_t src = r.offset, left = r.length; left > 0;) {
            const int64_t n = std::min({block_tokens - src % block_tokens, block_tokens - dst % block_tokens, left});
            const int old_b = static_cast<int>(src / block_tokens), new_b = static_cast<int>(dst / block_tokens);
            if (old_b < limit) {
                (*sum)[new_b] += static_cast<double>(n) * values[old_b];
                (*count)[new_b] += static_cast<double>(n);
                reached = new_b + 1;
            }
            src += n;
            dst += n;
            left -= n;
        }
    }
    for (int j = 0; j < new_blocks; ++j) values[j] = (*count)[j] > 0 ? static_cast<T>((*sum)[j] / (*count)[j]) : T(0);
    std::fill(values + new_blocks, values + std::max(new_blocks, old_blocks), T(0));
    return reached;
}

}  // namespace

const char* skip_reason_name(SkipReason reason) {
    switch (reason) {
        case SkipReason::BelowTrigger: return "below_trigger";
        case SkipReason::WithinBudget: return "within_budget";
        case SkipReason::FloorsExceedTarget: return "floors_exceed_target";
        case SkipReason::TargetUnreachable: return "target_unreachable";
    }
    return "unknown";
}

EvictionState::EvictionState(const EvictionConfig& config, const KvCacheConfig& cache)
    : cfg_(resolved(config, cache.n_layers)),
      n_layers_(cache.n_layers),
      n_kv_heads_(cache.n_kv_heads),
      group_(cache.n_heads / cache.n_kv_heads),
      block_tokens_(cache.block_tokens),
      head_dim_(cache.head_dim),
      dtype_gain_(kv_dtype_quantised(cache.dtype) ? static_cast<double>(kv_row_bytes(KvDtype::F16, cache.head_dim)) /
                                                        static_cast<double>(kv_row_bytes(cache.dtype, cache.head_dim))
                                                  : 1.0),
      block_bytes_((kv_row_bytes(cache.dtype, cache.head_dim) * cache.block_tokens + 63) / 64 * 64),
      stride_(static_cast<size_t>((cache.max_tokens + cache.block_tokens - 1) / cache.block_tokens)),
      token_stride_(stride_ * static_cast<size_t>(cache.block_tokens)),
      policy_(make_policy(cfg_.policy, cfg_.seed)),
      signals_(policy_->signals()),
      window_size_(std::max(1, policy_->window_queries(cfg_.observation_window))),
      layers_(static_cast<size_t>(cfg_.layer_end - cfg_.layer_start)),
      window_of_(cache.windows.empty() ? std::vector<int>(static_cast<size_t>(cache.n_layers), 0) : cache.windows),
      evicting_rank_(static_cast<size_t>(cache.n_layers), -1) {
    for (int layer = cfg_.layer_start; layer < cfg_.layer_end; ++layer)
        if (collects(layer)) evicting_rank_[static_cast<size_t>(layer)] = n_evicting_++;
    if (n_evicting_ == 0)
        throw std::invalid_argument("enable_eviction: every layer of [" + std::to_string(cfg_.layer_start) + ", " +
                                    std::to_string(cfg_.layer_end) +
                                    ") has a sliding window: no layer to evict from (a window layer holds its window)");
    if (n_kv_heads_ > kMaxSelectHeads || stride_ > (size_t{1} << 20))
        throw std::invalid_argument("enable_eviction: at most 4096 kv heads and 2^20 blocks per head are supported");
    if (global_budget() && static_cast<int64_t>(n_kv_heads_) * (cfg_.layer_end - cfg_.layer_start) > kMaxSelectHeads)
        throw std::invalid_argument("enable_eviction: layer_budget 'global' ranks at most 4096 (layer, kv head) pairs together");
    // Everything is sized for max_tokens up front (like the cache's block lists), so steps and
    // updates never allocate.
    for (LayerScores& l : layers_) {
        l.acc.assign(static_cast<size_t>(n_kv_heads_) * stride_, 0.f);
        l.heads.resize(n_kv_heads_);
        for (HeadScores& h : l.heads) {
            h.seen.assign(stride_, 0.0);
            h.ema.assign(stride_, 0.f);
            h.pos.assign(stride_, 0.0);
            if (signals_.window) h.wseen.assign(stride_, 0.0);
            if (signals_.reconstruction) {
                h.recon.assign(stride_, std::numeric_limits<float>::quiet_NaN());
                h.recon_prev.assign(stride_, std::numeric_limits<float>::quiet_NaN());
            }
        }
        if (signals_.window) l.wacc.assign(static_cast<size_t>(n_kv_heads_) * stride_, 0.f);
        if (signals_.reconstruction) {
            l.rmax.assign(static_cast<size_t>(n_kv_heads_) * stride_, 0.f);
            l.tpeak.assign(static_cast<size_t>(n_kv_heads_) * token_stride_, 0.f);
        }
        if (signals_.queries) {
            l.qsum.assign(static_cast<size_t>(cache.n_heads) * head_dim_, 0.0);
            l.qsq.assign(l.qsum.size(), 0.0);
        }
    }
    if (signals_.window) window_.assign(stride_, 0.f);
    if (signals_.queries) {
        q_mean_.assign(static_cast<size_t>(group_) * head_dim_, 0.f);
        q_var_.assign(q_mean_.size(), 0.f);
    }
    priority_.assign(static_cast<size_t>(n_kv_heads_) * stride_, 0.f);
    keep_.resize(n_kv_heads_);
    for (auto& k : keep_) k.reserve(stride_);
    select_.reserve(n_kv_heads_);
    candidates_.reserve(static_cast<size_t>(n_kv_heads_) * stride_);
    remap_sum_.assign(stride_, 0.0);
    remap_count_.assign(stride_, 0.0);
}

EvictionState::LayerScores& EvictionState::layer_scores(int layer) {
    return const_cast<LayerScores&>(static_cast<const EvictionState*>(this)->layer_scores(layer));
}

const EvictionState::LayerScores& EvictionState::layer_scores(int layer) const {
    if (!collects(layer))
        throw std::out_of_range("eviction: layer " + std::to_string(layer) + " is outside the evicting layers [" +
                                std::to_string(cfg_.layer_start) + ", " + std::to_string(cfg_.layer_end) + ")");
    return layers_[static_cast<size_t>(layer - cfg_.layer_start)];
}

float* EvictionState::accumulator(int layer) { return layer_scores(layer).acc.data(); }

float* EvictionState::reconstruction_accumulator(int layer) {
    LayerScores& ls = layer_scores(layer);
    return signals_.reconstruction ? ls.rmax.data() : nullptr;
}

void EvictionState::finish_reconstruction(int layer, const int* lengths) {
    LayerScores& ls = layer_scores(layer);
    if (!signals_.reconstruction) return;
    for (int h = 0; h < n_kv_heads_; ++h) {
        float* peak = ls.rmax.data() + static_cast<size_t>(h) * stride_;
        HeadScores& hs = ls.heads[h];
        std::vector<float>& recon = hs.recon;
        // The token peaks wait for the next update; the block scores they add to are those from
        // before the first pass since the last update.
        if (hs.n_tpeak == 0) std::copy(recon.begin(), recon.begin() + blocks_of(lengths[h]), hs.recon_prev.begin());
        hs.n_tpeak = std::max(hs.n_tpeak, lengths[h]);
        // A max over every reconstruction query so far: a later pass (the next prompt of a
        // conversation) can only raise a block's score.
        for (int b = 0; b < blocks_of(lengths[h]); ++b)
            recon[b] = std::isnan(recon[b]) ? peak[b] : std::max(recon[b], peak[b]);
        std::fill(peak, peak + stride_, 0.f);
    }
}

float* EvictionState::token_peak_accumulator(int layer) {
    LayerScores& ls = layer_scores(layer);
    return signals_.reconstruction ? ls.tpeak.data() : nullptr;
}

void EvictionState::add_token_scores(int layer, int head, int length, int n, const float* scores) {
    LayerScores& ls = layer_scores(layer);
    HeadScores& hs = ls.heads[head];
    const int first = length - n;
    // As finish_reconstruction: the block scores from before the first scores since the last
    // update are what the older tokens' scores fall back to.
    if (hs.n_tpeak == 0) std::copy(hs.recon.begin(), hs.recon.begin() + blocks_of(first), hs.recon_prev.begin());
    float* tp = ls.tpeak.data() + static_cast<size_t>(head) * token_stride_;
    for (int i = 0; i < n; ++i) {
        const int t = first + i;
        const float s = scores[i];
        tp[t] = std::max(t < hs.n_tpeak ? tp[t] : 0.f, std::isnan(s) ? 0.f : s);
        float& block = hs.recon[t / block_tokens_];
        if (!std::isnan(s)) block = std::isnan(block) ? s : std::max(block, s);
    }
    hs.n_tpeak = std::max(hs.n_tpeak, length);
}

void EvictionState::open_token_peaks(int layer, int head, int length) {
    LayerScores& ls = layer_scores(layer);
    HeadScores& hs = ls.heads[head];
    if (hs.n_tpeak == 0) std::copy(hs.recon.begin(), hs.recon.begin() + blocks_of(length), hs.recon_prev.begin());
    float* tp = ls.tpeak.data() + static_cast<size_t>(head) * token_stride_;
    std::fill(tp + std::min(hs.n_tpeak, length), tp + length, 0.f);
}

void EvictionState::keep_top_tokens(int layer, int head, int first, int length, const float* peaks, int m) {
    open_token_peaks(layer, head, length);
    LayerScores& ls = layer_scores(layer);
    HeadScores& hs = ls.heads[head];
    first = std::clamp(first, 0, length);
    m = std::clamp(m, 0, length - first);
    order_.resize(static_cast<size_t>(length - first));
    for (int t = first; t < length; ++t) order_[t - first] = t;
    if (m > 0 && m < length - first)
        std::nth_element(order_.begin(), order_.begin() + (m - 1), order_.end(), [peaks](int a, int b) {
            return peaks[a] > peaks[b] || (peaks[a] == peaks[b] && a > b);
        });
    float* tp = ls.tpeak.data() + static_cast<size_t>(head) * token_stride_;
    hs.n_tpeak = std::max(hs.n_tpeak, length);  // every token scored (open_token_peaks zeroed the new)
    for (int i = 0; i < m; ++i) {
        const int t = order_[i];
        tp[t] = kKeptFirst + std::min(token_score(ls, hs, head, t), 1.f);
        float& block = hs.recon[t / block_tokens_];
        block = std::isnan(block) ? tp[t] : std::max(block, tp[t]);
    }
}

void EvictionState::release_kept_first(int layer, int head, int length) {
    LayerScores& ls = layer_scores(layer);
    HeadScores& hs = ls.heads[head];
    const auto release = [](float& s) {
        if (s >= kKeptFirst) s -= kKeptFirst;
    };
    float* tp = ls.tpeak.data() + static_cast<size_t>(head) * token_stride_;
    std::for_each(tp, tp + std::min(hs.n_tpeak, length), release);
    const int blocks = blocks_of(length);
    std::for_each(hs.recon.begin(), hs.recon.begin() + blocks, release);
    std::for_each(hs.recon_prev.begin(), hs.recon_prev.begin() + blocks, release);
}

void EvictionState::close_token_peaks(int layer, int head, int length) {
    LayerScores& ls = layer_scores(layer);
    HeadScores& hs = ls.heads[head];
    const float* tp = ls.tpeak.data() + static_cast<size_t>(head) * token_stride_;
    for (int t = 0; t < length; ++t) {
        float& block = hs.recon[t / block_tokens_];
        if (tp[t] > 0.f) block = std::isnan(block) ? tp[t] : std::max(block, tp[t]);
    }
    hs.n_tpeak = std::max(hs.n_tpeak, length);
}

bool EvictionState::token_peaks_pending(int layer) const {
    const LayerScores& ls = layer_scores(layer);
    return std::any_of(ls.heads.begin(), ls.heads.end(), [](const HeadScores& h) { return h.n_tpeak > 0; });
}

float EvictionState::token_score(const LayerScores& ls, const HeadScores& hs, int head, int t) const {
    if (t >= hs.n_tpeak) return std::numeric_limits<float>::quiet_NaN();
    const float peak = ls.tpeak[static_cast<size_t>(head) * token_stride_ + t];
    const float before = hs.recon_prev[t / block_tokens_];
    return std::isnan(before) ? peak : std::max(before, peak);
}

float EvictionState::token_score(int layer, int head, int t) const {
    const LayerScores& ls = layer_scores(layer);
    if (!signals_.reconstruction) return std::numeric_limits<float>::quiet_NaN();
    return token_score(ls, ls.heads[head], head, t);
}

void EvictionState::drop_token_peaks(int layer, int head) {
    LayerScores& ls = layer_scores(layer);
    HeadScores& hs = ls.heads[head];
    if (hs.n_tpeak == 0) return;
    float* tp = ls.tpeak.data() + static_cast<size_t>(head) * token_stride_;
    std::fill(tp, tp + hs.n_tpeak, 0.f);
    std::fill(hs.recon_prev.begin(), hs.recon_prev.begin() + blocks_of(hs.n_tpeak), std::numeric_limits<float>::quiet_NaN());
    hs.n_tpeak = 0;
    hs.token_plan = false;
}

float EvictionState::reconstruction_score(int layer, int head, int block) const {
    const float none = std::numeric_limits<float>::quiet_NaN();
    if (!collects(layer) || !signals_.reconstruction) return none;
    const HeadScores& hs = layer_scores(layer).heads[head];
    return block >= 0 && static_cast<size_t>(block) < hs.recon.size() ? hs.recon[block] : none;
}

namespace {

// Adds to seen[] (suffix-difference form) the (query, query head) pairs of the last `last` of a
// step's n_q queries over a head now holding n_keys tokens: query i sees n_keys - n_q + i + 1.
void count_pairs(double* seen, int n_keys, int n_q, int last, int bt, int group) {
    const int first = n_q - last;
    const int before = n_keys - n_q + first;  // tokens the first counted query sees, minus one
    // Blocks starting at or before `before` are seen by all `last` queries of each query head.
    const int all_see = before / bt + 1;
    seen[all_see - 1] += static_cast<double>(last) * group;
    // A later block b is seen by the counted queries i >= b * bt - before: add to block b alone.
    for (int b = all_see; b * bt < n_keys; ++b) {
        const double pairs = static_cast<double>(last - (b * bt - before)) * group;
        seen[b] += pairs;
        seen[b - 1] -= pairs;
    }
}

}  // namespace

void EvictionState::record_step(int layer, int head, int n_keys, int n_q) {
    LayerScores& ls = layer_scores(layer);
    HeadScores& hs = ls.heads[head];
    count_pairs(hs.seen.data(), n_keys, n_q, n_q, block_tokens_, group_);
    if (signals_.window && ls.step_window > 0) {
        count_pairs(hs.wseen.data(), n_keys, n_q, std::min(ls.step_window, n_q), block_tokens_, group_);
        hs.window_blocks = std::max(hs.window_blocks, blocks_of(n_keys));
    }
}

int EvictionState::begin_window(int layer, int n_q) {
    LayerScores& ls = layer_scores(layer);
    if (!signals_.window && !signals_.queries) return 0;
    const int last = std::min(window_size_, n_q);
    if (ls.window_restart || ls.window_count + last > window_size_) {
        for (int h = 0; h < n_kv_heads_; ++h) {
            HeadScores& hs = ls.heads[h];
            if (signals_.window) {
                float* w = ls.wacc.data() + static_cast<size_t>(h) * stride_;
                std::fill(w, w + hs.window_blocks, 0.f);
                std::fill(hs.wseen.begin(), hs.wseen.begin() + hs.window_blocks, 0.0);
            }
            hs.window_blocks = 0;
        }
        std::fill(ls.qsum.begin(), ls.qsum.end(), 0.0);
        std::fill(ls.qsq.begin(), ls.qsq.end(), 0.0);
        ls.window_count = 0;
        ls.window_restart = false;
    }
    ls.window_count += last;
    ls.step_window = last;
    return last;
}

float* EvictionState::window_accumulator(int layer) {
    LayerScores& ls = layer_scores(layer);
    return signals_.window ? ls.wacc.data() : nullptr;
}

void EvictionState::record_queries(int layer, const float* q, int n_q) {
    LayerScores& ls = layer_scores(layer);
    if (!signals_.queries) return;
    const int n_heads = n_kv_heads_ * group_;
    for (int t = n_q - std::min(ls.step_window, n_q); t < n_q; ++t) {
        const float* row = q + static_cast<size_t>(t) * n_heads * head_dim_;
        for (size_t i = 0; i < static_cast<size_t>(n_heads) * head_dim_; ++i) {
            ls.qsum[i] += row[i];
            ls.qsq[i] += static_cast<double>(row[i]) * row[i];
        }
    }
}

bool EvictionState::count_decode_tokens(int n_tokens) {
    decode_tokens_ += n_tokens;
    if (decode_tokens_ < cfg_.update_interval) return false;
    decode_tokens_ %= cfg_.update_interval;
    return true;
}

double EvictionState::kept_blocks(int64_t tokens_seen) const {
    const int64_t all = (tokens_seen + block_tokens_ - 1) / block_tokens_;
    double kept = 0.0;
    for (int layer = 0; layer < n_layers_; ++layer) {
        if (collects(layer)) continue;
        const int w = window_of_[static_cast<size_t>(layer)];
        kept += static_cast<double>(w > 0 ? std::min<int64_t>(all, (w + 2 * block_tokens_ - 2) / block_tokens_) : all);
    }
    return kept;
}

double EvictionState::cap_blocks(int64_t tokens_seen) const {
    const double evicting = n_evicting_;
    const double per_head = static_cast<double>(cfg_.kv_budget_bytes) / (2.0 * block_bytes_ * n_kv_heads_);
    return std::floor((per_head - kept_blocks(tokens_seen)) / evicting + 1e-9);
}

double EvictionState::keep_ratio(int64_t tokens_seen) const {
    if (cfg_.target_keep_ratio > 0.0) return cfg_.target_keep_ratio;
    if (cfg_.kv_budget_bytes > 0) {
        if (tokens_seen <= 0) return 1.0;
        return std::min(1.0, cap_blocks(tokens_seen) * block_tokens_ / static_cast<double>(tokens_seen));
    }
    // Whole model, in tokens: n_layers * T / (kept_layers * T + evicting * k * T) = R, solved for
    // k, with R the target left once the dtype has paid its part (>= 1 keeps everything). The
    // sliding-window layers are not part of it: they hold their window whatever the target, so
    // the target is the ratio of the layers that grow (docs/eviction.md "Sliding-window layers").
    int windowed = 0;
    for (int w : window_of_) windowed += w > 0;
    const double layers = n_layers_ - windowed, evicting = n_evicting_;
    const double r = std::max(1.0, cfg_.target_lossy_ratio / dtype_gain_);
    return (layers / r - (layers - evicting)) / evicting;
}

double EvictionState::layer_keep_ratio(int layer, int64_t tokens_seen) const {
    const double k = keep_ratio(tokens_seen);
    const int n = n_evicting_;
    if (layer < 0 || cfg_.layer_budget != "pyramid" || n < 2 || !(k > 0.0) || tokens_seen <= 0) return k;
    const double floors = static_cast<double>(cfg_.sink_tokens) + cfg_.recent_tokens;
    const double slope = std::max(
        0.0, std::min({0.5, 1.0 / k - 1.0, 1.0 - floors / (k * static_cast<double>(tokens_seen))}));
    const double i = evicting_rank_[static_cast<size_t>(layer)];
    return k * (1.0 + slope * (1.0 - 2.0 * i / (n - 1)));
}

int EvictionState::budget_blocks(int64_t tokens_seen, int layer) const {
    if (cfg_.kv_budget_bytes > 0 && (layer < 0 || cfg_.layer_budget != "pyramid")) {
        // In blocks, not through the ratio: a byte cap is met exactly (the layer's last partial
        // block counts whole, as the pool holds it).
        const double all = static_cast<double>((tokens_seen + block_tokens_ - 1) / block_tokens_);
        const double b = std::min({cap_blocks(tokens_seen), all, static_cast<double>(stride_)});
        return b > 0.0 ? static_cast<int>(b) : 0;
    }
    const double k = layer_keep_ratio(layer, tokens_seen);
    if (!(k > 0.0)) return 0;
    // The blocks that budget's tokens need, as a head of that many tokens would hold them (so a
    // keep ratio of 1 keeps a partial last block); the epsilon absorbs rounding of k.
    const double blocks = std::ceil(k * static_cast<double>(tokens_seen) / block_tokens_ - 1e-9);
    return static_cast<int>(std::min(blocks, static_cast<double>(stride_)));
}

bool EvictionState::over_budget(int layer, int64_t tokens_seen, const int* lengths) const {
    if (!collects(layer) || !(keep_ratio(tokens_seen) > 0.0)) return false;
    const int budget = budget_blocks(tokens_seen, layer);
    int64_t eligible = 0, total = 0;
    bool any_over = false;
    for (int h = 0; h < n_kv_heads_; ++h) {
        // The trigger counts the tokens the layer has seen, not those a head still holds: a head
        // cut below trigger_min_tokens by an earlier update must keep being held to its budget.
        if (tokens_seen < cfg_.trigger_min_tokens) continue;
        const int n = blocks_of(lengths[h]);
        ++eligible;
        total += n;
        any_over = any_over || n > budget;
    }
    return cfg_.per_head_budget ? total > eligible * budget : any_over;
}

void EvictionState::update_scores(int layer, const int* lengths) {
    LayerScores& ls = layer_scores(layer);
    const double alpha = cfg_.ema_alpha;
    for (int h = 0; h < n_kv_heads_; ++h) {
        HeadScores& hs = ls.heads[h];
        float* acc = ls.acc.data() + static_cast<size_t>(h) * stride_;
        const int n = blocks_of(lengths[h]);
        double pairs = 0.0;  // the running suffix sum turns seen[] into counts
        for (int b = n - 1; b >= 0; --b) {
            pairs += hs.seen[b];
            if (pairs > 0.0) {
                const double mean = acc[b] / pairs;
                hs.ema[b] = static_cast<float>(b < hs.n_scored ? alpha * hs.ema[b] + (1.0 - alpha) * mean : mean);
            } else if (b >= hs.n_scored) {
                hs.ema[b] = 0.f;  // no query has seen it yet (appended without a step)
            }
        }
        hs.n_scored = n;
        std::fill(acc, acc + n, 0.f);
        std::fill(hs.seen.begin(), hs.seen.begin() + n, 0.0);
    }
    // The window keeps describing the latest queries until the next step replaces it.
    ls.window_restart = true;
}

ScoreContext EvictionState::context(int layer, int h, int length, const HeadRowReader* rows) {
    LayerScores& ls = layer_scores(layer);
    HeadScores& hs = ls.heads[h];
    ScoreContext c;
    c.layer = layer;
    c.head = h;
    c.n_blocks = blocks_of(length);
    c.block_tokens = block_tokens_;
    c.length = length;
    c.head_dim = head_dim_;
    c.group = group_;
    c.ema = hs.ema.data();
    c.positions = hs.pos.data();
    if (signals_.window) {
        const float* w = ls.wacc.data() + static_cast<size_t>(h) * stride_;
        double pairs = 0.0;  // suffix sum of wseen: the window pairs that could see block b
        for (int b = c.n_blocks - 1; b >= 0; --b) {
            pairs += b < hs.window_blocks ? hs.wseen[b] : 0.0;
            window_[b] = pairs > 0.0 ? static_cast<float>(w[b] / pairs) : 0.f;
        }
        c.window = window_.data();
    }
    if (signals_.queries) {
        const size_t n = static_cast<size_t>(group_) * head_dim_, base = static_cast<size_t>(h) * n;
        const double count = ls.window_count;
        for (size_t i = 0; i < n; ++i) {
            const double mean = count > 0 ? ls.qsum[base + i] / count : 0.0;
            q_mean_[i] = static_cast<float>(mean);
            q_var_[i] = static_cast<float>(count > 0 ? std::max(0.0, ls.qsq[base + i] / count - mean * mean) : 0.0);
        }
        c.q_mean = q_mean_.data();
        c.q_var = q_var_.data();
        c.q_count = ls.window_count;
    }
    if (signals_.reconstruction) c.reconstruction = hs.recon.data();
    if (signals_.keys || signals_.values) {
        if (!rows) throw std::invalid_argument("eviction: policy '" + cfg_.policy + "' needs the head's rows");
        const size_t n = static_cast<size_t>(length) * head_dim_;
        if (signals_.keys && k_rows_.size() < n) k_rows_.resize(n);
        if (signals_.values && v_rows_.size() < n) v_rows_.resize(n);
        rows->read(layer, h, signals_.keys ? k_rows_.data() : nullptr, signals_.values ? v_rows_.data() : nullptr);
        c.k_rows = signals_.keys ? k_rows_.data() : nullptr;
        c.v_rows = signals_.values ? v_rows_.data() : nullptr;
    }
    return c;
}

SelectHead EvictionState::select_head(int slot, int length, int budget, std::vector<uint8_t>* keep) const {
    SelectHead s;
    s.n_blocks = blocks_of(length);
    s.priority = const_cast<float*>(priority_.data()) + static_cast<size_t>(slot) * stride_;
    s.sink_blocks = blocks_of(std::min(cfg_.sink_tokens, length));
    s.recent_first = length > cfg_.recent_tokens ? (length - cfg_.recent_tokens) / block_tokens_ : 0;
    s.keep = keep;
    const double share = cfg_.max_floor_share;
    const int floors = floor_blocks(s);
    if (share > 0.0 && budget > 0) {
        // At most share * budget blocks for the floors (at least the newest block): sink and
        // recent shrink in proportion to their sizes, the recent floor keeping >= 1 block.
        const int cap = std::max(1, static_cast<int>(std::floor(share * budget + 1e-9)));
        if (floors > cap) {
            const int sink = std::min(s.sink_blocks, s.n_blocks);
            const int recent = s.n_blocks - std::min(std::max(s.recent_first, sink), s.n_blocks);
            const int new_recent = std::clamp(
                static_cast<int>(std::lround(static_cast<double>(recent) * cap / floors)), 1, cap);
            s.sink_blocks = std::min(sink, cap - new_recent);
            s.recent_first = s.n_blocks - new_recent;
        }
    }
    return s;
}

void EvictionState::floor_tokens(int64_t tokens_seen, int length, int* sink_tokens, int* recent_tokens, int layer) const {
    *sink_tokens = cfg_.sink_tokens;
    *recent_tokens = cfg_.recent_tokens;
    if (!(keep_ratio(tokens_seen) > 0.0) || length <= 0) return;
    const SelectHead s = select_head(0, length, budget_blocks(tokens_seen, layer), nullptr);
    // What the (possibly shrunk) floor blocks cover, never more than configured.
    *sink_tokens = std::min(cfg_.sink_tokens, s.sink_blocks * block_tokens_);
    *recent_tokens = std::min(cfg_.recent_tokens, std::max(1, length - s.recent_first * block_tokens_));
}

void EvictionState::place_blocks(int layer, int64_t tokens_seen, const int* lengths) {
    LayerScores& ls = layer_scores(layer);
    // Exact unless truncate() shortened the head.
    for (int h = 0; h < n_kv_heads_; ++h) {
        HeadScores& hs = ls.heads[h];
        const int n = blocks_of(lengths[h]);
        const double dropped = static_cast<double>(tokens_seen - lengths[h]);
        for (int b = hs.n_pos; b < n; ++b) hs.pos[b] = dropped + static_cast<double>(b) * block_tokens_;
        hs.n_pos = std::max(hs.n_pos, n);
    }
}

void EvictionState::plan(int layer, int64_t tokens_seen, const int* lengths, std::vector<std::vector<TokenRun>>* plans,
                    EvictionLayerStats* stats, const HeadRowReader* rows) {
    plans->resize(n_kv_heads_);
    for (auto& p : *plans) p.clear();
    const auto skip = [&](SkipReason r) { ++stats->skipped[static_cast<int>(r)]; };
    place_blocks(layer, tokens_seen, lengths);

    select_heads_.clear();
    for (int h = 0; h < n_kv_heads_; ++h) {
        if (tokens_seen < cfg_.trigger_min_tokens) skip(SkipReason::BelowTrigger);
        else select_heads_.push_back(h);
    }
    // The first update after a pass consumes its token peaks, whatever it decides.
    const auto drop_peaks = [&] {
        if (signals_.reconstruction)
            for (int h = 0; h < n_kv_heads_; ++h) drop_token_peaks(layer, h);
    };
    if (select_heads_.empty()) return drop_peaks();
    if (!(keep_ratio(tokens_seen) > 0.0)) {
        for (size_t i = 0; i < select_heads_.size(); ++i) skip(SkipReason::TargetUnreachable);
        return drop_peaks();
    }
    const int budget = budget_blocks(tokens_seen, layer);

    if (signals_.reconstruction && token_peaks_pending(layer)) {
        // The first update after a pass: tokens, each head on its own or the layer's heads pooled.
        if (cfg_.per_head_budget) {
            pool_.clear();
            for (int h : select_heads_) pool_.push_back({layer, h, lengths[h], budget, stats, &(*plans)[h]});
            plan_tokens();
        } else {
            for (int h : select_heads_) {
                pool_.assign(1, {layer, h, lengths[h], budget, stats, &(*plans)[h]});
                plan_tokens();
            }
        }
        for (int h = 0; h < n_kv_heads_; ++h)
            if ((*plans)[h].empty()) drop_token_peaks(layer, h);
        return;
    }

    if (!cfg_.per_head_budget) {
        for (int h : select_heads_) {
            const SelectHead s = select_head(h, lengths[h], budget, &keep_[h]);
            const int floors = floor_blocks(s);
            if (s.n_blocks <= budget) {
                skip(SkipReason::WithinBudget);
            } else if (floors > budget) {
                skip(SkipReason::FloorsExceedTarget);
            } else {
                policy_->rank(context(layer, h, lengths[h], rows), priority_.data() + static_cast<size_t>(h) * stride_);
                select_.assign(1, s);
                select_blocks(select_, budget - floors, &candidates_);
                plan_from_blocks(keep_[h], lengths[h], block_tokens_, &(*plans)[h]);
            }
        }
        return;
    }

    // Shared budget: the layer's eligible heads keep n_eligible * budget blocks between them,
    // ranked together, so a head whose attention is concentrated gives blocks to the others.
    pool_.clear();
    for (int h : select_heads_) pool_.push_back({layer, h, lengths[h], budget, stats, &(*plans)[h]});
    plan_pooled(rows);
}

bool EvictionState::over_budget_global(const int64_t* tokens_seen, const int* lengths) const {
    int64_t total = 0, pooled = 0;
    for (int layer = cfg_.layer_start; layer < cfg_.layer_end; ++layer) {
        const int i = layer - cfg_.layer_start;
        if (!collects(layer)) continue;
        if (tokens_seen[i] < cfg_.trigger_min_tokens || !(keep_ratio(tokens_seen[i]) > 0.0)) continue;
        const int budget = budget_blocks(tokens_seen[i], layer);
        for (int h = 0; h < n_kv_heads_; ++h) {
            total += blocks_of(lengths[i * n_kv_heads_ + h]);
            pooled += budget;
        }
    }
    return total > pooled;
}

void EvictionState::plan_global(const int64_t* tokens_seen, const int* lengths, std::vector<std::vector<TokenRun>>* plans,
                           EvictionLayerStats* stats, const HeadRowReader* rows, bool headroom) {
    const int n_layers = cfg_.layer_end - cfg_.layer_start;
    plans->resize(static_cast<size_t>(n_layers) * n_kv_heads_);
    for (auto& p : *plans) p.clear();
    pool_.clear();
    for (int layer = cfg_.layer_start; layer < cfg_.layer_end; ++layer) {
        const int i = layer - cfg_.layer_start;
        if (!collects(layer)) continue;
        const int* len = lengths + static_cast<size_t>(i) * n_kv_heads_;
        EvictionLayerStats* st = stats + layer;
        place_blocks(layer, tokens_seen[i], len);
        const SkipReason none = tokens_seen[i] < cfg_.trigger_min_tokens ? SkipReason::BelowTrigger
                                : !(keep_ratio(tokens_seen[i]) > 0.0)     ? SkipReason::TargetUnreachable
                                                                          : SkipReason::WithinBudget;
        if (none != SkipReason::WithinBudget) {
            st->skipped[static_cast<int>(none)] += n_kv_heads_;
            continue;
        }
        const int budget = budget_blocks(tokens_seen[i], layer);
        for (int h = 0; h < n_kv_heads_; ++h)
            pool_.push_back({layer, h, len[h], budget, st, &(*plans)[static_cast<size_t>(i) * n_kv_heads_ + h]});
    }
    // Sized on first use: only a global budget pools more heads than a layer has.
    if (priority_.size() < pool_.size() * stride_) priority_.resize(pool_.size() * stride_);
    if (keep_.size() < pool_.size()) keep_.resize(pool_.size());
    bool tokens = false;
    for (int layer = cfg_.layer_start; layer < cfg_.layer_end && signals_.reconstruction; ++layer)
        tokens = tokens || (collects(layer) && token_peaks_pending(layer));
    if (!tokens) {
        plan_pooled(rows, headroom);
        return;
    }
    plan_tokens(headroom);
    for (int layer = cfg_.layer_start; layer < cfg_.layer_end; ++layer)
        for (int h = 0; h < n_kv_heads_ && collects(layer); ++h)
            if ((*plans)[static_cast<size_t>(layer - cfg_.layer_start) * n_kv_heads_ + h].empty()) drop_token_peaks(layer, h);
}

void EvictionState::plan_tokens(bool headroom) {
    select_.clear();
    int64_t total = 0, floors = 0, pooled = 0, n_tokens = 0;
    for (size_t i = 0; i < pool_.size(); ++i) {
        const PoolHead& e = pool_[i];
        select_.push_back(select_head(0, e.length, e.budget, nullptr));
        total += select_.back().n_blocks;
        floors += floor_blocks(select_.back());
        pooled += e.budget;
        n_tokens += e.length;
    }
    // The same decisions as the block plans: in blocks.
    if (total <= pooled || floors > pooled) {
        const SkipReason r = total <= pooled ? SkipReason::WithinBudget : SkipReason::FloorsExceedTarget;
        for (const PoolHead& e : pool_) ++e.stats->skipped[static_cast<int>(r)];
        return;
    }
    const int64_t target = std::max(floors, pooled - (headroom ? spare_blocks(pooled) : 0));
    if (keep_.size() < pool_.size()) keep_.resize(pool_.size());
    token_priority_.resize(static_cast<size_t>(n_tokens));
    token_heads_.clear();
    int64_t floor_tokens = 0, base = 0;
    const float inf = std::numeric_limits<float>::infinity();
    for (size_t i = 0; i < pool_.size(); ++i) {
        const PoolHead& e = pool_[i];
        const LayerScores& ls = layer_scores(e.layer);
        const HeadScores& hs = ls.heads[e.head];
        float* prio = token_priority_.data() + base;
        for (int t = 0; t < e.length; ++t) {
            const float score = token_score(ls, hs, e.head, t);
            prio[t] = std::isnan(score) ? inf : score;  // unscored (written since the pass) first
        }
        // The floors in tokens, as floor_tokens() gives them (what the plan is validated against).
        const SelectHead& s = select_[i];
        SelectTokensHead th;
        th.length = e.length;
        th.priority = prio;
        th.sink = std::min({cfg_.sink_tokens, s.sink_blocks * block_tokens_, e.length});
        th.recent = std::min({cfg_.recent_tokens, std::max(1, e.length - s.recent_first * block_tokens_), e.length});
        th.keep = &keep_[i];
        token_heads_.push_back(th);
        floor_tokens += std::min(e.length, th.sink + th.recent);
        base += e.length;
    }
    if (cfg_.head_floor_share > 0.0) {
        // AdaKV's per-head minimum, in tokens: each head's own best first (priority +inf).
        for (size_t i = 0; i < pool_.size(); ++i) {
            const int64_t minimum =
                static_cast<int64_t>(std::floor(cfg_.head_floor_share * pool_[i].budget + 1e-9)) * block_tokens_;
            const SelectTokensHead& th = token_heads_[i];
            const int64_t extra = minimum - std::min(th.length, th.sink + th.recent);
            if (extra <= 0) continue;
            one_token_head_.assign(1, th);
            select_tokens(one_token_head_, extra, &candidates_);
            float* prio = const_cast<float*>(th.priority);
            for (int t = th.sink; t < th.length - th.recent; ++t)
                if ((*th.keep)[t]) prio[t] = inf;
        }
    }
    select_tokens(token_heads_, target * block_tokens_ - floor_tokens, &candidates_);

    // Partial last blocks: a head keeping k tokens holds ceil(k / B) blocks, so the pool may hold
    // up to one block per head more than its target. The heads with the fewest tokens in their
    // last block give those up (their lowest-scored non-floor tokens) until it does not.
    int64_t blocks = 0;
    std::vector<std::pair<int, int>>& partial = partial_;
    partial.clear();
    for (size_t i = 0; i < pool_.size(); ++i) {
        const SelectTokensHead& th = token_heads_[i];
        const int kept = static_cast<int>(std::count(th.keep->begin(), th.keep->end(), uint8_t{1}));
        blocks += blocks_of(kept);
        const int rest = kept % block_tokens_;
        const int chosen = kept - std::min(th.length, th.sink + th.recent);
        if (rest > 0 && chosen >= rest) partial.push_back({rest, static_cast<int>(i)});
    }
    std::sort(partial.begin(), partial.end());
    for (size_t j = 0; j < partial.size() && blocks > target; ++j, --blocks) {
        const SelectTokensHead& th = token_heads_[partial[j].second];
        trim_.clear();
        for (int t = th.sink; t < th.length - th.recent; ++t)
            if ((*th.keep)[t]) trim_.push_back({th.priority[t], t});
        std::partial_sort(trim_.begin(), trim_.begin() + partial[j].first, trim_.end());
        for (int r = 0; r < partial[j].first; ++r) (*th.keep)[trim_[r].second] = 0;
    }
    for (size_t i = 0; i < pool_.size(); ++i) {
        const std::vector<uint8_t>& keep = keep_[i];
        if (std::count(keep.begin(), keep.end(), uint8_t{1}) == pool_[i].length) continue;
        plan_from_tokens(keep, pool_[i].plan);
        layer_scores(pool_[i].layer).heads[pool_[i].head].token_plan = true;
    }
}

int64_t EvictionState::spare_blocks(int64_t pooled) const {
    // At most 1/64 of the budget, so a short context's ratio stays within ~1.6% of its target.
    return std::min(static_cast<int64_t>(pool_.size()), pooled / 64);
}

void EvictionState::plan_pooled(const HeadRowReader* rows, bool headroom) {
    select_.clear();
    int64_t total = 0, floors = 0, pooled = 0;
    for (size_t i = 0; i < pool_.size(); ++i) {
        const PoolHead& e = pool_[i];
        select_.push_back(select_head(static_cast<int>(i), e.length, e.budget, &keep_[i]));
        total += select_.back().n_blocks;
        floors += floor_blocks(select_.back());
        pooled += e.budget;
    }
    if (total <= pooled || floors > pooled) {
        const SkipReason r = total <= pooled ? SkipReason::WithinBudget : SkipReason::FloorsExceedTarget;
        for (const PoolHead& e : pool_) ++e.stats->skipped[static_cast<int>(r)];
        return;
    }
    for (size_t i = 0; i < pool_.size(); ++i)
        policy_->rank(context(pool_[i].layer, pool_[i].head, pool_[i].length, rows),
                      priority_.data() + i * stride_);
    if (cfg_.head_floor_share > 0.0) {
        // AdaKV's per-head minimum: each head's own best blocks up to the share of its budget are
        // kept first (priority +inf), so the joint choice below only spends the rest.
        for (size_t i = 0; i < pool_.size(); ++i) {
            const int minimum = static_cast<int>(std::floor(cfg_.head_floor_share * pool_[i].budget + 1e-9));
            const int extra = minimum - floor_blocks(select_[i]);
            if (extra <= 0) continue;
            one_.assign(1, select_[i]);
            select_blocks(one_, extra, &candidates_);
            const SelectHead& s = select_[i];
            float* prio = const_cast<float*>(s.priority);
            for (int b = 0; b < s.n_blocks; ++b)
                if ((*s.keep)[b] && b >= s.sink_blocks && b < s.recent_first)
                    prio[b] = std::numeric_limits<float>::infinity();
        }
    }
    const int64_t target = std::max(floors, pooled - (headroom ? spare_blocks(pooled) : 0));
    select_blocks(select_, static_cast<int>(target - floors), &candidates_);
    for (size_t i = 0; i < pool_.size(); ++i) {
        const std::vector<uint8_t>& keep = keep_[i];
        if (std::count(keep.begin(), keep.end(), uint8_t{1}) < select_[i].n_blocks)
            plan_from_blocks(keep, pool_[i].length, block_tokens_, pool_[i].plan);
    }
}

void EvictionState::materialise_seen(std::vector<double>& seen, int n_blocks) {
    double pairs = 0.0;
    for (int b = n_blocks - 1; b >= 0; --b) seen[b] = pairs += seen[b];
}

void EvictionState::difference_seen(std::vector<double>& seen, int n_blocks) {
    for (int b = 0; b < n_blocks; ++b) seen[b] -= b + 1 < n_blocks ? seen[b + 1] : 0.0;
}

void EvictionState::compact(int layer, int head, const std::vector<TokenRun>& runs, int old_length) {
    LayerScores& ls = layer_scores(layer);
    HeadScores& hs = ls.heads[head];
    const int old_blocks = blocks_of(old_length);
    float* acc = ls.acc.data() + static_cast<size_t>(head) * stride_;
    remap_blocks(runs, block_tokens_, old_blocks, old_blocks, acc, &remap_sum_, &remap_count_);
    materialise_seen(hs.seen, old_blocks);
    remap_blocks(runs, block_tokens_, old_blocks, old_blocks, hs.seen.data(), &remap_sum_, &remap_count_);
    int64_t kept = 0;
    for (const TokenRun& r : runs) kept += r.length;
    difference_seen(hs.seen, blocks_of(static_cast<int>(kept)));
    hs.n_scored = remap_blocks(runs, block_tokens_, old_blocks, hs.n_scored, hs.ema.data(), &remap_sum_, &remap_count_);
    hs.n_pos = remap_blocks(runs, block_tokens_, old_blocks, hs.n_pos, hs.pos.data(), &remap_sum_, &remap_count_);
    if (signals_.reconstruction) {
        // Exact for block plans; a block merged from a scored and an unscored one has none (NaN).
        const int n = remap_blocks(runs, block_tokens_, old_blocks, old_blocks, hs.recon.data(), &remap_sum_, &remap_count_);
        std::fill(hs.recon.begin() + n, hs.recon.begin() + std::max(n, old_blocks), std::numeric_limits<float>::quiet_NaN());
        if (hs.n_tpeak > 0) move_token_peaks(layer, head, runs, old_length);
    }
    if (signals_.window) {
        // The window moves like the interval's masses and counts.
        const int wb = std::min(hs.window_blocks, old_blocks);
        float* w = ls.wacc.data() + static_cast<size_t>(head) * stride_;
        remap_blocks(runs, block_tokens_, old_blocks, wb, w, &remap_sum_, &remap_count_);
        materialise_seen(hs.wseen, wb);  // to plain counts, remapped, and back (as seen above)
        hs.window_blocks = remap_blocks(runs, block_tokens_, old_blocks, wb, hs.wseen.data(), &remap_sum_, &remap_count_);
        difference_seen(hs.wseen, hs.window_blocks);
    }
}

void EvictionState::move_token_peaks(int layer, int head, const std::vector<TokenRun>& runs, int old_length) {
    LayerScores& ls = layer_scores(layer);
    HeadScores& hs = ls.heads[head];
    float* tp = ls.tpeak.data() + static_cast<size_t>(head) * token_stride_;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (hs.token_plan) {
        // The plan made from the token peaks: each new block's score is the largest of its kept
        // tokens' own (NaN if one was unscored: such a block ranks first, like any unscored
        // block), plus kKeptFirst if one of them was kept first (the whole block is, until
        // release_kept_first gives it the own score of all its tokens, not only that one's).
        int64_t dst = 0;
        float own = 0.f;
        bool unscored = false, kept_first = false;
        const auto write_block = [&](int64_t b) {
            hs.recon[b] = unscored ? nan : own + (kept_first ? kKeptFirst : 0.f);
            own = 0.f;
            unscored = kept_first = false;
        };
        for (const TokenRun& r : runs)
            for (int64_t t = r.offset; t < r.offset + r.length; ++t, ++dst) {
                if (dst > 0 && dst % block_tokens_ == 0) write_block(dst / block_tokens_ - 1);
                float score = token_score(ls, hs, head, static_cast<int>(t));
                if (std::isnan(score)) {
                    unscored = true;
                    continue;
                }
                if (score >= kKeptFirst) {
                    kept_first = true;
                    score -= kKeptFirst;
                }
                own = std::max(own, score);
            }
        if (dst > 0) write_block((dst - 1) / block_tokens_);
        drop_token_peaks(layer, head);
        return;
    }
    // Any other compaction (an explicit plan, a rewind): the peaks move with their tokens, and
    // the scores from before the pass with their blocks. Rows only move down: in place is safe.
    int64_t dst = 0;
    int n = 0;
    for (const TokenRun& r : runs)
        for (int64_t t = r.offset; t < r.offset + r.length; ++t, ++dst)
            if (t < hs.n_tpeak) {
                tp[dst] = tp[t];
                n = static_cast<int>(dst) + 1;
            }
    std::fill(tp + n, tp + std::max(n, hs.n_tpeak), 0.f);
    hs.n_tpeak = n;
    const int old_blocks = blocks_of(old_length);
    const int m = remap_blocks(runs, block_tokens_, old_blocks, old_blocks, hs.recon_prev.data(), &remap_sum_, &remap_count_);
    std::fill(hs.recon_prev.begin() + m, hs.recon_prev.begin() + std::max(m, old_blocks), nan);
}

void EvictionState::truncate(int layer, int head, int old_length, int n_tokens) {
    if (n_tokens > 0) {
        compact(layer, head, {TokenRun{0, n_tokens}}, old_length);
        return;
    }
    LayerScores& ls = layer_scores(layer);
    HeadScores& hs = ls.heads[head];
    const int old_blocks = blocks_of(old_length);
    float* acc = ls.acc.data() + static_cast<size_t>(head) * stride_;
    std::fill(acc, acc + old_blocks, 0.f);
    std::fill(hs.seen.begin(), hs.seen.begin() + old_blocks, 0.0);
    std::fill(hs.ema.begin(), hs.ema.begin() + old_blocks, 0.f);
    hs.n_scored = 0;
    hs.n_pos = 0;
    if (signals_.reconstruction) {
        std::fill(hs.recon.begin(), hs.recon.begin() + old_blocks, std::numeric_limits<float>::quiet_NaN());
        drop_token_peaks(layer, head);
    }
    if (signals_.window) {
        float* w = ls.wacc.data() + static_cast<size_t>(head) * stride_;
        std::fill(w, w + hs.window_blocks, 0.f);
        std::fill(hs.wseen.begin(), hs.wseen.begin() + hs.window_blocks, 0.0);
        hs.window_blocks = 0;
    }
}

void EvictionState::reset() {
    for (LayerScores& l : layers_) {
        std::fill(l.acc.begin(), l.acc.end(), 0.f);
        std::fill(l.wacc.begin(), l.wacc.end(), 0.f);
        std::fill(l.qsum.begin(), l.qsum.end(), 0.0);
        std::fill(l.qsq.begin(), l.qsq.end(), 0.0);
        std::fill(l.rmax.begin(), l.rmax.end(), 0.f);
        std::fill(l.tpeak.begin(), l.tpeak.end(), 0.f);
        l.window_count = l.step_window = 0;
        l.window_restart = true;
        for (HeadScores& h : l.heads) {
            std::fill(h.seen.begin(), h.seen.end(), 0.0);
            std::fill(h.ema.begin(), h.ema.end(), 0.f);
            std::fill(h.wseen.begin(), h.wseen.end(), 0.0);
            std::fill(h.recon.begin(), h.recon.end(), std::numeric_limits<float>::quiet_NaN());
            std::fill(h.recon_prev.begin(), h.recon_prev.end(), std::numeric_limits<float>::quiet_NaN());
            h.n_scored = h.n_pos = h.window_blocks = h.n_tpeak = 0;
            h.token_plan = false;
        }
    }
    decode_tokens_ = 0;
    updates_ = 0;
    policy_->reset();
}

float EvictionState::score(int layer, int head, int block) const {
    if (!collects(layer)) return std::numeric_limits<float>::quiet_NaN();
    const HeadScores& hs = layer_scores(layer).heads[head];
    return block >= 0 && block < hs.n_scored ? hs.ema[block] : std::numeric_limits<float>::quiet_NaN();
}

}  // namespace mnn_h2o
