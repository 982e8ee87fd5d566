#include "mnn_h2o/cache/kv_cache.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace mnn_h2o {

namespace {

constexpr int kMaxHeadDim = 256;
// Tile kernels compare key positions as float: positions must stay exactly representable.
constexpr int kMaxTokensLimit = 1 << 24;

// Slabs of about 512 KiB, but no larger than one head's K or V at max_tokens: each head's blocks
// fill slabs of their own (see BlockPool::allocate), so bigger slabs would only map unused space.
size_t slab_blocks(const KvCacheConfig& c, size_t block_bytes) {
    const size_t target = block_bytes >= (512u << 10) ? 1 : (512u << 10) / block_bytes;
    const size_t max_blocks = static_cast<size_t>((c.max_tokens + c.block_tokens - 1) / c.block_tokens);
    return target < max_blocks ? target : max_blocks;
}

using Clock = std::chrono::steady_clock;

// num / den, infinite when only den is 0, 1 when both are (nothing seen, nothing held).
double ratio_of(size_t num, size_t den) {
    if (den > 0) return static_cast<double>(num) / static_cast<double>(den);
    return num > 0 ? std::numeric_limits<double>::infinity() : 1.0;
}

double micros_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// True if every run starts on a block boundary and spans whole blocks (the last may end at the
// head's partial last block): compaction then only drops blocks from the lists.
bool block_aligned(const std::vector<TokenRun>& runs, int block_tokens, int length) {
    for (const TokenRun& r : runs)
        if (r.offset % block_tokens != 0 || (r.length % block_tokens != 0 && r.offset + r.length != length)) return false;
    return true;
}

void require(bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("KvCache: " + what);
}

void require_empty(const std::string& error) { require(error.empty(), error); }

KvCacheConfig validated(const KvCacheConfig& c) {
    require(c.n_layers >= 1, "n_layers must be >= 1");
    require(c.n_kv_heads >= 1, "n_kv_heads must be >= 1");
    require(c.n_heads >= c.n_kv_heads && c.n_heads % c.n_kv_heads == 0,
            "n_heads must be a positive multiple of n_kv_heads");
    require(c.n_heads / c.n_kv_heads <= 64, "at most 64 query heads per kv head");
    require(c.head_dim >= 16 && c.head_dim <= kMaxHeadDim && c.head_dim % 16 == 0,
            "head_dim must be a multiple of 16 in [16, 256]");
    // The config keys: the schema's choices and bounds, in its order (config_schema.h).
#define MNN_H2O_CHECK(field, key, CType, CppType) require_empty(field_error<schema::runtime::key>(#field, c.field));
    MNN_H2O_RUNTIME_FIELDS(MNN_H2O_CHECK)
#undef MNN_H2O_CHECK
    const std::string shape_error = kv_dtype_shape_error(c.dtype, c.head_dim);
    require(shape_error.empty(), shape_error);
    require(c.max_tokens >= 1 && c.max_tokens <= kMaxTokensLimit, "max_tokens must be in [1, 2^24]");
    require(c.windows.empty() || c.windows.size() == static_cast<size_t>(c.n_layers),
            "windows must be empty or one per layer (" + std::to_string(c.n_layers) + "), got " +
                std::to_string(c.windows.size()));
    for (int w : c.windows) require(w >= 0, "a layer's window must be >= 0 tokens, got " + std::to_string(w));
    return c;
}

}  // namespace

KvCache::KvCache(const KvCacheConfig& config)
    : cfg_(validated(config)),
      row_bytes_(kv_row_bytes(cfg_.dtype, cfg_.head_dim)),
      isa_(best_isa()),
      pool_(row_bytes_ * cfg_.block_tokens, slab_blocks(cfg_, row_bytes_ * cfg_.block_tokens)),
      threads_(cfg_.threads > 1 ? std::make_unique<ThreadPool>(cfg_.threads) : nullptr),
      heads_(static_cast<size_t>(cfg_.n_layers) * cfg_.n_kv_heads),
      views_(static_cast<size_t>(cfg_.n_kv_heads)),
      stats_(static_cast<size_t>(cfg_.n_layers)),
      lengths_(static_cast<size_t>(cfg_.n_kv_heads)) {
    row_reader_.cache = this;
    for (Head& h : heads_) {
        h.k_blocks.reserve(max_blocks());
        h.v_blocks.reserve(max_blocks());
    }
}

KvCache::~KvCache() { store_.reset(); }

void KvCache::check_layer(int layer) const {
    if (layer < 0 || layer >= cfg_.n_layers)
        throw std::out_of_range("KvCache: layer " + std::to_string(layer) + " out of range [0, " +
                                std::to_string(cfg_.n_layers) + ")");
}

KvCache::Head& KvCache::head(int layer, int h) {
    return const_cast<Head&>(static_cast<const KvCache*>(this)->head(layer, h));
}

const KvCache::Head& KvCache::head(int layer, int h) const {
    check_layer(layer);
    if (h < 0 || h >= cfg_.n_kv_heads)
        throw std::out_of_range("KvCache: kv head " + std::to_string(h) + " out of range [0, " +
                                std::to_string(cfg_.n_kv_heads) + ")");
    return heads_[static_cast<size_t>(layer) * cfg_.n_kv_heads + h];
}

void KvCache::check_append(int layer, const float* k, const float* v, int n_tokens) const {
    check_layer(layer);
    require(n_tokens >= 0, "n_tokens must be >= 0");
    require(n_tokens == 0 || (k && v), "null k or v");
    for (int h = 0; h < cfg_.n_kv_heads; ++h) {
        const int len = head(layer, h).length;
        if (n_tokens > cfg_.max_tokens - len)
            throw std::length_error("KvCache: appending " + std::to_string(n_tokens) + " tokens to layer " +
                                    std::to_string(layer) + " head " + std::to_string(h) + " (holding " +
                                    std::to_string(len) + ") exceeds max_tokens " + std::to_string(cfg_.max_tokens));
    }
}

void KvCache::release_behind_window(Head& hs, int window) {
    if (reconstructing_) return;  // a pass's tokens are dropped again: the window must stay whole
    // The next query sees the newest window - 1 tokens held and itself.
    const int drop = std::max(0, hs.length - (window - 1)) / cfg_.block_tokens;
    if (drop == 0) return;
    for (auto* list : {&hs.k_blocks, &hs.v_blocks}) {
        for (int b = 0; b < drop; ++b) pool_.release((*list)[static_cast<size_t>(b)]);
        list->erase(list->begin(), list->begin() + drop);
    }
    hs.length -= drop * cfg_.block_tokens;
}

void KvCache::append(int layer, const float* k, const float* v, int n_tokens) {
    check_append(layer, k, v, n_tokens);
    const int bt = cfg_.block_tokens, hd = cfg_.head_dim;
    if (window(layer) > 0 && n_tokens > 0)
        for (int h = 0; h < cfg_.n_kv_heads; ++h) release_behind_window(head(layer, h), window(layer));
    // Take every block first, so that running out of memory leaves the cache as it was. The
    // block lists are reserved to max_blocks(), so push_back never throws. Each block is asked
    // for right behind the previous one of its list, so a head's K (and V) stay contiguous.
    try {
        for (int h = 0; h < cfg_.n_kv_heads; ++h) {
            Head& hs = head(layer, h);
            const size_t need = static_cast<size_t>((hs.length + n_tokens + bt - 1) / bt);
            while (hs.v_blocks.size() < need) {
                hs.k_blocks.push_back(pool_.allocate(hs.k_blocks.empty() ? nullptr : hs.k_blocks.back()));
                hs.v_blocks.push_back(pool_.allocate(hs.v_blocks.empty() ? nullptr : hs.v_blocks.back()));
            }
        }
    } catch (...) {
        for (int h = 0; h < cfg_.n_kv_heads; ++h) {
            Head& hs = head(layer, h);
            const size_t keep = static_cast<size_t>((hs.length + bt - 1) / bt);
            for (auto* list : {&hs.k_blocks, &hs.v_blocks}) {
                while (list->size() > keep) {
                    pool_.release(list->back());
                    list->pop_back();
                }
            }
        }
        throw;
    }
    const size_t src_stride = static_cast<size_t>(cfg_.n_kv_heads) * hd;
    const bool rotated = kv_dtype_rotated(cfg_.dtype);
    float rows[2][kMaxHeadDim];
    for (int h = 0; h < cfg_.n_kv_heads; ++h) {
        Head& hs = head(layer, h);
        for (int t = 0; t < n_tokens; ++t) {
            const int pos = hs.length + t;
            const size_t offset = static_cast<size_t>(pos % bt) * row_bytes_;
            const size_t src = t * src_stride + static_cast<size_t>(h) * hd;
            const float* k_row = k + src;
            const float* v_row = v + src;
            if (rotated) {
                std::memcpy(rows[0], k_row, sizeof(float) * hd);
                std::memcpy(rows[1], v_row, sizeof(float) * hd);
                rotate_rows(isa_, rows[0], 1, hd);
                rotate_rows(isa_, rows[1], 1, hd);
                k_row = rows[0];
                v_row = rows[1];
            }
            convert_from_f32(isa_, cfg_.dtype, k_row, static_cast<uint8_t*>(hs.k_blocks[pos / bt]) + offset, 1, hd);
            convert_from_f32(isa_, cfg_.dtype, v_row, static_cast<uint8_t*>(hs.v_blocks[pos / bt]) + offset, 1, hd);
        }
        hs.length += n_tokens;
    }
    stats_[layer].tokens_seen += n_tokens;
}

void KvCache::check_attend(int layer, const float* q, int n_q, const float* out, const float* block_scores,
                           size_t scores_stride, int extra_tokens) const {
    check_layer(layer);
    require(n_q >= 1, "n_q must be >= 1");
    require(q && out, "null q or out");
    for (int h = 0; h < cfg_.n_kv_heads; ++h) {
        const int len = head(layer, h).length + extra_tokens;
        if (len < n_q)
            throw std::invalid_argument("KvCache: layer " + std::to_string(layer) + " head " + std::to_string(h) +
                                        " holds " + std::to_string(len) + " tokens, fewer than the " +
                                        std::to_string(n_q) + " queries");
        if (block_scores && scores_stride < static_cast<size_t>((len + cfg_.block_tokens - 1) / cfg_.block_tokens))
            throw std::invalid_argument("KvCache: block score rows of " + std::to_string(scores_stride) +
                                        " are too short for the blocks of layer " + std::to_string(layer) +
                                        " head " + std::to_string(h));
    }
    const size_t bytes = static_cast<size_t>(n_q) * cfg_.n_heads * cfg_.head_dim * sizeof(float);
    const auto q0 = reinterpret_cast<uintptr_t>(q), o0 = reinterpret_cast<uintptr_t>(out);
    require(q0 + bytes <= o0 || o0 + bytes <= q0, "out must not overlap q");
}

void KvCache::attend(int layer, const float* q, int n_q, float* out, float* block_scores, size_t scores_stride,
                     Isa isa) {
    check_attend(layer, q, n_q, out, block_scores, scores_stride, 0);
    attend_checked(layer, q, n_q, out, block_scores, scores_stride, nullptr, 0, isa);
}

void KvCache::attend_checked(int layer, const float* q, int n_q, float* out, float* block_scores,
                             size_t scores_stride, float* window_scores, int window_queries, Isa isa,
                             float* block_max) {
    for (int h = 0; h < cfg_.n_kv_heads; ++h) views_[h] = view(layer, h);
    AttentionProblem p;
    p.n_kv_heads = cfg_.n_kv_heads;
    p.group = group();
    p.head_dim = cfg_.head_dim;
    p.block_tokens = cfg_.block_tokens;
    p.dtype = cfg_.dtype;
    p.heads = views_.data();
    p.q = q;
    p.n_q = n_q;
    p.out = out;
    p.block_scores = block_scores;
    p.scores_stride = scores_stride;
    p.window_scores = window_scores;
    p.window_queries = window_queries;
    p.block_max = block_max;
    p.window = window(layer);
    // Rotated keys need rotated queries (scores unchanged: H is orthonormal); the output is a
    // mix of rotated values, so it is rotated back (H is its own inverse).
    const size_t q_rows = static_cast<size_t>(n_q) * cfg_.n_heads;
    const bool rotated = kv_dtype_rotated(cfg_.dtype);
    if (rotated) {
        rotated_q_.assign(q, q + q_rows * cfg_.head_dim);
        rotate_rows(isa, rotated_q_.data(), q_rows, cfg_.head_dim);
        p.q = rotated_q_.data();
    }
    // Rounded here, once (attention.h): the peaks and query statistics after the step read them.
    p.q = attention_queries(cfg_.dtype, p.q, n_q, cfg_.n_heads, cfg_.head_dim, seen_codes_, seen_q_);
    if (p.q == seen_q_.data()) p.q8_rows = seen_codes_.data();
    attended_q_ = p.q;
    if (store_ && store_->holds_compressed(layer)) store_->attend(layer, p, isa, team(), workspace_);
    else attention(p, isa, team(), workspace_);
    if (rotated) rotate_rows(isa, out, q_rows, cfg_.head_dim);
}

void KvCache::step(int layer, const float* q, const float* k, const float* v, int n_tokens, float* out,
                   float* block_scores, size_t scores_stride) {
    check_append(layer, k, v, n_tokens);
    check_attend(layer, q, n_tokens, out, block_scores, scores_stride, n_tokens);
    if (store_) store_->install_finished();
    append(layer, k, v, n_tokens);
    if (reconstructing_) {
        step_reconstruction(layer, q, n_tokens, out, block_scores, scores_stride);
        return;
    }
    if (!eviction_ || !eviction_->collects(layer)) {
        attend_checked(layer, q, n_tokens, out, block_scores, scores_stride, nullptr, 0, best_isa());
        // A window layer gives back now what the next query cannot see: after a prompt chunk it
        // would otherwise hold the chunk until the next step.
        if (window(layer) > 0)
            for (int h = 0; h < cfg_.n_kv_heads; ++h) release_behind_window(head(layer, h), window(layer));
        // The next layer's chunks decode on the workers while MNN runs this layer's dense part.
        if (store_) store_->prefetch(layer + 1);
        return;
    }
    float* acc = eviction_->accumulator(layer);
    const size_t stride = eviction_->stride();
    // The window policies' second output: the last queries' masses, from the same pass.
    const int window_queries = eviction_->begin_window(layer, n_tokens);
    float* window = window_queries > 0 ? eviction_->window_accumulator(layer) : nullptr;
    if (!block_scores) {
        attend_checked(layer, q, n_tokens, out, acc, stride, window, window_queries, best_isa());
    } else {
        // The caller wants the masses too: the kernel collects them once, both get a copy.
        scores_scratch_.assign(static_cast<size_t>(cfg_.n_kv_heads) * stride, 0.f);
        attend_checked(layer, q, n_tokens, out, scores_scratch_.data(), stride, window, window_queries, best_isa());
        for (int h = 0; h < cfg_.n_kv_heads; ++h) {
            const int n_blocks = (head(layer, h).length + cfg_.block_tokens - 1) / cfg_.block_tokens;
            const float* mass = scores_scratch_.data() + static_cast<size_t>(h) * stride;
            for (int b = 0; b < n_blocks; ++b) {
                acc[static_cast<size_t>(h) * stride + b] += mass[b];
                block_scores[static_cast<size_t>(h) * scores_stride + b] += mass[b];
            }
        }
    }
    for (int h = 0; h < cfg_.n_kv_heads; ++h) eviction_->record_step(layer, h, head(layer, h).length, n_tokens);
    const float* q_stored = attended_q_;  // the keys' space, as attention saw them
    if (n_tokens > 1 && query_peaks_) {
        const int w = std::min(eviction_->window_size(), n_tokens);
        add_query_peaks(layer, q_stored + static_cast<size_t>(n_tokens - w) * cfg_.n_heads * cfg_.head_dim, w);
    }
    if (n_tokens > 1 && prompt_end_share_ > 0.0 && eviction_->token_peak_accumulator(layer)) {
        const int w = std::min(eviction_->window_size(), n_tokens);
        keep_prompt_end(layer, q_stored + static_cast<size_t>(n_tokens - w) * cfg_.n_heads * cfg_.head_dim, w);
    }
    // Query statistics in the keys' space, as attention saw them.
    if (eviction_->wants_queries()) eviction_->record_queries(layer, q_stored, n_tokens);
    if (store_) store_->prefetch(layer + 1);
}

void KvCache::step_reconstruction(int layer, const float* q, int n_tokens, float* out, float* block_scores,
                                  size_t scores_stride) {
    if (!eviction_->collects(layer)) {
        attend(layer, q, n_tokens, out, block_scores, scores_stride);
    } else {
        // The peaks come out of the same softmax as the masses; the pass keeps only the peaks (the
        // H2O scores stay those of the real tokens), so the masses go to scratch.
        // With a window the block peaks come from the window's token peaks (add_window_peaks),
        // not from the kernel's softmax over every key.
        const bool windowed = window_from_end_ > 0;
        const size_t stride = eviction_->stride();
        scores_scratch_.assign(static_cast<size_t>(cfg_.n_kv_heads) * stride, 0.f);
        attend_checked(layer, q, n_tokens, out, scores_scratch_.data(), stride, nullptr, 0, best_isa(),
                       windowed ? nullptr : eviction_->reconstruction_accumulator(layer));
        const float* q_stored = attended_q_;
        if (windowed) add_window_peaks(layer, q_stored, n_tokens);
        else add_token_peaks(layer, q_stored, n_tokens);
        for (int h = 0; block_scores && h < cfg_.n_kv_heads; ++h) {
            const int n_blocks = (head(layer, h).length + cfg_.block_tokens - 1) / cfg_.block_tokens;
            for (int b = 0; b < n_blocks; ++b)
                block_scores[static_cast<size_t>(h) * scores_stride + b] += scores_scratch_[static_cast<size_t>(h) * stride + b];
        }
    }
    if (store_) store_->prefetch(layer + 1);
}

void KvCache::add_token_peaks(int layer, const float* q, int n_tokens) {
    const int H = cfg_.n_kv_heads;
    peak_n_peak_.resize(static_cast<size_t>(H));
    // Only the keys held before the pass: the pass's own are dropped at its rewind.
    for (int h = 0; h < H; ++h) peak_n_peak_[h] = pass_lengths_[static_cast<size_t>(layer) * H + h];
    layer_token_peaks(layer, q, n_tokens);
}

void KvCache::layer_token_peaks(int layer, const float* q, int n_q) {
    layer_token_peaks(layer, q, n_q, eviction_->token_peak_accumulator(layer), eviction_->token_stride());
}

void KvCache::keep_prompt_end(int layer, const float* q, int n_q) {
    const int H = cfg_.n_kv_heads;
    peak_n_peak_.resize(static_cast<size_t>(H));
    int longest = 0;
    for (int h = 0; h < H; ++h) longest = std::max(longest, peak_n_peak_[h] = head(layer, h).length);
    end_peaks_.assign(static_cast<size_t>(H) * longest, 0.f);
    layer_token_peaks(layer, q, n_q, end_peaks_.data(), static_cast<size_t>(longest));
    // The uniform share of the budget: the plan's own split between heads is not known yet.
    const double keep = std::max(0.0, eviction_->keep_ratio(stats_[layer].tokens_seen));
    for (int h = 0; h < H; ++h) {
        const int n = peak_n_peak_[h];
        // The prompt's own tokens: in a conversation, the earlier turns keep the scores they have.
        // Its newest rows are its own as long as no plan ran within it (prefill_eviction end).
        const int own = std::min(n, prompt_end_tokens_);
        const int m = std::min(own, static_cast<int>(prompt_end_share_ * keep * own + 0.5));
        eviction_->release_kept_first(layer, h, n);
        eviction_->keep_top_tokens(layer, h, n - own, n, end_peaks_.data() + static_cast<size_t>(h) * longest, m);
    }
}

void KvCache::layer_token_peaks(int layer, const float* q, int n_q, float* peak, size_t peak_stride) {
    const int H = cfg_.n_kv_heads, hd = cfg_.head_dim;
    peak_n_keys_.resize(static_cast<size_t>(H));
    peak_k_.resize(static_cast<size_t>(H));
    size_t rows = 0;
    for (int h = 0; h < H; ++h) rows += static_cast<size_t>(head(layer, h).length);
    if (peak_keys_.size() < rows * hd) peak_keys_.resize(rows * hd);
    rows = 0;
    for (int h = 0; h < H; ++h) {
        peak_n_keys_[h] = head(layer, h).length;
        peak_k_[h] = peak_keys_.data() + rows * hd;
        read_stored(layer, h, peak_keys_.data() + rows * hd, nullptr);
        rows += static_cast<size_t>(peak_n_keys_[h]);
    }
    TokenPeakProblem p;
    p.n_kv_heads = H;
    p.group = group();
    p.head_dim = hd;
    p.q = q;
    p.n_q = n_q;
    p.k = peak_k_.data();
    p.n_keys = peak_n_keys_.data();
    p.n_peak = peak_n_peak_.data();
    p.peak = peak;
    p.peak_stride = peak_stride;
    token_peaks(p, best_isa(), team(), peak_ws_);
}

void KvCache::head_token_peaks(const float* q, int n_q, int h, const float* k, int n_keys, int n_peak, float* peak) {
    const int G = group(), hd = cfg_.head_dim;
    // This head's queries, [n_q][G][hd], out of the step's [n_q][H * G][hd].
    head_q_.resize(static_cast<size_t>(n_q) * G * hd);
    for (int i = 0; i < n_q; ++i)
        std::copy(q + (static_cast<size_t>(i) * cfg_.n_kv_heads + h) * G * hd,
                  q + (static_cast<size_t>(i) * cfg_.n_kv_heads + h + 1) * G * hd,
                  head_q_.data() + static_cast<size_t>(i) * G * hd);
    TokenPeakProblem p;
    p.n_kv_heads = 1;
    p.group = G;
    p.head_dim = hd;
    p.q = head_q_.data();
    p.n_q = n_q;  // the newest queries: query i sees the first n_keys - n_q + i + 1 keys
    p.k = &k;
    p.n_keys = &n_keys;
    p.n_peak = &n_peak;
    p.peak = peak;
    p.peak_stride = static_cast<size_t>(n_peak);
    token_peaks(p, best_isa(), team(), peak_ws_);
}

void KvCache::add_query_peaks(int layer, const float* q, int n_q) {
    const int H = cfg_.n_kv_heads;
    peak_n_peak_.resize(static_cast<size_t>(H));
    for (int h = 0; h < H; ++h) {
        peak_n_peak_[h] = head(layer, h).length;
        eviction_->open_token_peaks(layer, h, peak_n_peak_[h]);
    }
    // All heads in one call, so the team splits (kv head, row tile) tasks across them.
    layer_token_peaks(layer, q, n_q);
    for (int h = 0; h < H; ++h) eviction_->close_token_peaks(layer, h, peak_n_peak_[h]);
}

void KvCache::add_window_peaks(int layer, const float* q, int n_tokens) {
    const int H = cfg_.n_kv_heads, hd = cfg_.head_dim, bt = cfg_.block_tokens;
    float* tpeak = eviction_->token_peak_accumulator(layer);
    float* rmax = eviction_->reconstruction_accumulator(layer);
    for (int h = 0; h < H; ++h) {
        const int held = pass_lengths_[static_cast<size_t>(layer) * H + h], length = head(layer, h).length;
        const int begin = std::max(0, held - window_from_end_);
        const int end = std::min(held, begin + window_length_);
        if (end <= begin) continue;
        const int sinks = std::min(kReconstructionSinks, begin);
        // The keys in softmax order: the window (its peaks are the first end - begin), the sinks,
        // then the pass's rows, last, so the routine's causal rule holds for them.
        const int n_keys = (end - begin) + sinks + (length - held);
        window_keys_.resize(static_cast<size_t>(n_keys) * hd);
        float* dst = window_keys_.data();
        for (const auto& [from, to] : {std::pair<int, int>{begin, end}, {0, sinks}, {held, length}}) {
            read_stored_rows(layer, h, from, to, dst, nullptr);
            dst += static_cast<size_t>(to - from) * hd;
        }
        float* peak = tpeak + static_cast<size_t>(h) * eviction_->token_stride() + begin;
        head_token_peaks(q, n_tokens, h, window_keys_.data(), n_keys, end - begin, peak);
        // The blocks' peaks: the largest of their tokens' (what the kernel would give a block).
        float* block = rmax + static_cast<size_t>(h) * eviction_->stride();
        for (int t = begin; t < end; ++t) block[t / bt] = std::max(block[t / bt], peak[t - begin]);
    }
}

void KvCache::set_reconstruction_window(int from_end, int length) {
    require(reconstructing_, "set_reconstruction_window: no reconstruction pass is under way");
    if (from_end < 0 || length < 0)
        throw std::invalid_argument("KvCache: set_reconstruction_window: from_end and length must be >= 0, got " +
                                    std::to_string(from_end) + " and " + std::to_string(length));
    window_from_end_ = from_end;
    window_length_ = length;
}

void KvCache::require_no_pass(const char* what) const {
    if (reconstructing_)
        throw std::invalid_argument(std::string("KvCache: ") + what +
                                    ": a reconstruction pass is under way (end_reconstruction first)");
}

void KvCache::begin_reconstruction() {
    require(eviction_reconstructs(), "begin_reconstruction: the eviction policy takes no reconstruction scores "
                                "(enable_eviction with policy 'kvzip')");
    require_no_pass("begin_reconstruction");
    pass_lengths_.resize(heads_.size());
    for (size_t i = 0; i < heads_.size(); ++i) pass_lengths_[i] = heads_[i].length;
    pass_seen_.resize(stats_.size());
    for (size_t l = 0; l < stats_.size(); ++l) pass_seen_[l] = stats_[l].tokens_seen;
    window_from_end_ = window_length_ = 0;
    reconstructing_ = true;
}

void KvCache::rewind_reconstruction() {
    require(reconstructing_, "rewind_reconstruction: no reconstruction pass is under way");
    for (int layer = 0; layer < cfg_.n_layers; ++layer) {
        for (int h = 0; h < cfg_.n_kv_heads; ++h)
            truncate(layer, h, pass_lengths_[static_cast<size_t>(layer) * cfg_.n_kv_heads + h]);
        stats_[layer].tokens_seen = pass_seen_[layer];
    }
}

void KvCache::end_reconstruction() {
    rewind_reconstruction();
    const EvictionConfig& c = eviction_->config();
    for (int layer = c.layer_start; layer < c.layer_end; ++layer)
        if (eviction_->collects(layer))
            eviction_->finish_reconstruction(layer, pass_lengths_.data() + static_cast<size_t>(layer) * cfg_.n_kv_heads);
    free_peak_scratch();
    window_from_end_ = window_length_ = 0;
    reconstructing_ = false;
}

void KvCache::free_peak_scratch() {
    peak_keys_ = {};
    peak_ws_ = {};
    window_keys_ = {};
    head_q_ = {};
    end_peaks_ = {};
}

void KvCache::set_token_scores(int layer, const float* scores, int n_tokens) {
    require(eviction_predicts(), "set_token_scores: the eviction policy takes no predicted scores "
                            "(enable_eviction with policy 'predicted_kvzip')");
    require_no_pass("set_token_scores");
    check_layer(layer);
    const EvictionConfig& c = eviction_->config();
    require(eviction_->collects(layer),
            "set_token_scores: layer " + std::to_string(layer) + " is not an evicting layer (those of [" +
                std::to_string(c.layer_start) + ", " + std::to_string(c.layer_end) + ") without a sliding window)");
    require(n_tokens >= 0, "set_token_scores: n_tokens must be >= 0, got " + std::to_string(n_tokens));
    for (int h = 0; h < cfg_.n_kv_heads; ++h)
        require(n_tokens <= head(layer, h).length,
                "set_token_scores: " + std::to_string(n_tokens) + " tokens, but kv head " + std::to_string(h) +
                    " of layer " + std::to_string(layer) + " holds " + std::to_string(head(layer, h).length));
    const size_t n = static_cast<size_t>(cfg_.n_kv_heads) * n_tokens;
    for (size_t i = 0; i < n; ++i)
        require(scores[i] >= 0.f && scores[i] <= 1.f,  // false for NaN
                "set_token_scores: scores must be in [0, 1], got " + std::to_string(scores[i]) + " at " +
                    std::to_string(i));
    for (int h = 0; h < cfg_.n_kv_heads; ++h)
        eviction_->add_token_scores(layer, h, head(layer, h).length, n_tokens, scores + static_cast<size_t>(h) * n_tokens);
}

std::vector<float> KvCache::token_scores(int layer, int h) const {
    require(eviction_ && eviction_->signals().reconstruction,
            "token_scores: the eviction policy takes no reconstruction scores (kvzip, predicted_kvzip)");
    const int length = head(layer, h).length;
    std::vector<float> out(static_cast<size_t>(length), std::numeric_limits<float>::quiet_NaN());
    if (!eviction_->collects(layer)) return out;
    for (int t = 0; t < length; ++t) out[t] = eviction_->token_score(layer, h, t);
    return out;
}

int KvCache::length(int layer, int h) const { return head(layer, h).length; }

KvHeadView KvCache::view(int layer, int h) const {
    const Head& hs = head(layer, h);
    KvHeadView view;
    view.k_blocks = hs.k_blocks.data();
    view.v_blocks = hs.v_blocks.data();
    view.n_keys = hs.length;
    return view;
}

void KvCache::read_stored(int layer, int h, float* k_out, float* v_out) const {
    read_stored_rows(layer, h, 0, head(layer, h).length, k_out, v_out);
}

void KvCache::read_stored_rows(int layer, int h, int from, int to, float* k_out, float* v_out) const {
    const Head& hs = head(layer, h);
    if (from < 0 || to > hs.length || from > to)
        throw std::out_of_range("KvCache: rows [" + std::to_string(from) + ", " + std::to_string(to) +
                                ") outside the head's " + std::to_string(hs.length));
    const int bt = cfg_.block_tokens, hd = cfg_.head_dim;
    const size_t row_bytes = kv_row_bytes(cfg_.dtype, hd);
    for (int pos = from; pos < to;) {
        const int b = pos / bt, in_block = pos - b * bt;
        const size_t rows = static_cast<size_t>(std::min(to - pos, bt - in_block));
        const size_t offset = static_cast<size_t>(pos - from) * hd, skip = static_cast<size_t>(in_block) * row_bytes;
        const void* k = hs.k_blocks[b];
        const void* v = hs.v_blocks[b];
        if (!k) store_->read_block(layer, h, b, &k, &v);
        if (k_out) convert_to_f32(isa_, cfg_.dtype, static_cast<const uint8_t*>(k) + skip, k_out + offset, rows, hd);
        if (v_out) convert_to_f32(isa_, cfg_.dtype, static_cast<const uint8_t*>(v) + skip, v_out + offset, rows, hd);
        pos += static_cast<int>(rows);
    }
}

void KvCache::read(int layer, int h, float* k_out, float* v_out) const {
    const Head& hs = head(layer, h);
    require(hs.length == 0 || (k_out && v_out), "null output");
    read_stored(layer, h, k_out, v_out);
    if (kv_dtype_rotated(cfg_.dtype)) {
        rotate_rows(isa_, k_out, static_cast<size_t>(hs.length), cfg_.head_dim);
        rotate_rows(isa_, v_out, static_cast<size_t>(hs.length), cfg_.head_dim);
    }
}

void KvCache::release_tail(Head& hs, int n_tokens) {
    const size_t keep = static_cast<size_t>((n_tokens + cfg_.block_tokens - 1) / cfg_.block_tokens);
    while (hs.k_blocks.size() > keep) {
        pool_.release(hs.k_blocks.back());
        hs.k_blocks.pop_back();
        pool_.release(hs.v_blocks.back());
        hs.v_blocks.pop_back();
    }
    hs.length = n_tokens;
}

void KvCache::truncate(int layer, int h, int n_tokens) {
    Head& hs = head(layer, h);
    require(n_tokens >= 0 && n_tokens <= hs.length, "truncate: n_tokens must be in [0, length]");
    const int old_length = hs.length;
    if (store_) store_->truncate(layer, h, n_tokens);
    release_tail(hs, n_tokens);
    if (eviction_ && eviction_->collects(layer)) eviction_->truncate(layer, h, old_length, n_tokens);
}

void KvCache::reset() {
    reconstructing_ = false;
    window_from_end_ = window_length_ = 0;
    if (store_) store_->reset();
    for (Head& hs : heads_) release_tail(hs, 0);
    free_peak_scratch();
    std::fill(stats_.begin(), stats_.end(), EvictionLayerStats{});
    if (eviction_) eviction_->reset();
}

void KvCache::enable_eviction(const EvictionConfig& config) {
    require_no_pass("enable_eviction");
    eviction_ = std::make_unique<EvictionState>(config, cfg_);
    query_peaks_ = false;
    prompt_end_share_ = 0.0;
    prompt_end_tokens_ = 0;
    const EvictionConfig& c = eviction_->config();
    if (eviction_->global_budget()) lengths_.resize(static_cast<size_t>(c.layer_end - c.layer_start) * cfg_.n_kv_heads);
}

void KvCache::disable_eviction() {
    require_no_pass("disable_eviction");
    eviction_.reset();
    query_peaks_ = false;
    prompt_end_share_ = 0.0;
    prompt_end_tokens_ = 0;
}

void KvCache::set_prompt_end_share(double share, int prompt_tokens) {
    if (!(share >= 0.0 && share <= 1.0))
        throw std::invalid_argument("KvCache: set_prompt_end_share: the share must be in [0, 1], got " +
                                    std::to_string(share));
    if (share > 0.0 && prompt_tokens < 1)
        throw std::invalid_argument("KvCache: set_prompt_end_share: a share needs the prompt's tokens (at least 1), got " +
                                    std::to_string(prompt_tokens));
    prompt_end_share_ = share;
    prompt_end_tokens_ = share > 0.0 ? prompt_tokens : 0;
}

void KvCache::set_query_peaks(bool on) {
    require(!on || eviction_predicts(), "set_query_peaks: the eviction policy takes no predicted scores "
                                        "(enable_eviction with policy 'predicted_kvzip')");
    query_peaks_ = on;
}

void KvCache::enable_store(const StoreConfig& config) {
    validate_store_config(config, cfg_);
    for (int layer = 0; layer < cfg_.n_layers && config.mode != StoreMode::Off; ++layer)
        require(window(layer) == 0, "enable_store: layer " + std::to_string(layer) +
                                        " has a sliding window; the lossless store over window layers is not built");
    disable_store();
    if (config.mode != StoreMode::Off) store_ = std::make_unique<LosslessStage>(config, cfg_, pool_, heads_);
}

void KvCache::disable_store() {
    if (!store_) return;
    store_->dissolve_all();
    store_.reset();
}

void KvCache::drain_store() {
    if (store_) store_->drain();
}

StoreStats KvCache::store_stats() const {
    StoreStats s;
    if (store_) s = store_->stats();
    else s.layers.resize(static_cast<size_t>(cfg_.n_layers));
    const EvictionStats h = eviction_stats();
    s.pool_bytes = pool_bytes_held();
    s.bytes_held = bytes_held();
    s.bytes_uncompressed = h.bytes_uncompressed;
    s.total_ratio = ratio_of(s.bytes_uncompressed, s.bytes_held);
    return s;
}

bool KvCache::end_step(int n_tokens, bool prefill) {
    require(n_tokens >= 1, "end_step: n_tokens must be >= 1");
    require_no_pass("end_step");
    if (store_) store_->install_finished();
    // Query peaks reuse their scratch over a prompt's chunks; decode steps add none.
    if (!prefill) free_peak_scratch();
    const bool evicted = eviction_ && evict_due(n_tokens, prefill);
    // New cold chunks, after eviction has had its say on this step's blocks.
    if (store_) store_->schedule(eviction_config());
    return evicted;
}

bool KvCache::evict_due(int n_tokens, bool prefill) {
    // Counted in decode tokens, the same for every layer (not in layer calls).
    const bool decode_due = !prefill && eviction_->count_decode_tokens(n_tokens);
    if (eviction_->global_budget()) return evict_global(decode_due, prefill);
    const EvictionConfig& c = eviction_->config();
    bool updated = false, evicted = false;
    for (int layer = c.layer_start; layer < c.layer_end; ++layer) {
        if (!eviction_->collects(layer)) continue;  // a window layer
        for (int h = 0; h < cfg_.n_kv_heads; ++h) lengths_[h] = head(layer, h).length;
        EvictionLayerStats& st = stats_[layer];
        if (!decode_due && !(prefill && eviction_->over_budget(layer, st.tokens_seen, lengths_.data()))) continue;
        updated = true;
        const Clock::time_point t0 = Clock::now();
        eviction_->update_scores(layer, lengths_.data());
        eviction_->plan(layer, st.tokens_seen, lengths_.data(), &plans_, &st, &row_reader_);
        st.policy_us += micros_since(t0);
        for (int h = 0; h < cfg_.n_kv_heads; ++h) {
            if (plans_[h].empty()) continue;
            // Validated like any plan, against the floors as shrunk for the budget.
            int sink = 0, recent = 1;
            eviction_->floor_tokens(st.tokens_seen, lengths_[h], &sink, &recent, layer);
            evict_with_floors(layer, h, plans_[h], sink, recent);
            evicted = true;
        }
    }
    if (updated) eviction_->count_update();
    return evicted;
}

bool KvCache::evict_global(bool due, bool prefill) {
    const EvictionConfig& c = eviction_->config();
    const int n = c.layer_end - c.layer_start, H = cfg_.n_kv_heads;
    seen_.resize(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
        seen_[i] = stats_[c.layer_start + i].tokens_seen;
        for (int h = 0; h < H; ++h) lengths_[static_cast<size_t>(i) * H + h] = head(c.layer_start + i, h).length;
    }
    // Otherwise only when the model as a whole is over its budget; a decode plan leaves headroom.
    if (!due && !eviction_->over_budget_global(seen_.data(), lengths_.data())) return false;
    const Clock::time_point t0 = Clock::now();
    for (int i = 0; i < n; ++i)
        if (eviction_->collects(c.layer_start + i))
            eviction_->update_scores(c.layer_start + i, lengths_.data() + static_cast<size_t>(i) * H);
    eviction_->plan_global(seen_.data(), lengths_.data(), &plans_, stats_.data(), &row_reader_, !prefill);
    // One plan for all layers: its time is shared equally among them.
    const double us = micros_since(t0) / eviction_->evicting_layers();
    bool evicted = false;
    for (int i = 0; i < n; ++i) {
        const int layer = c.layer_start + i;
        if (!eviction_->collects(layer)) continue;
        stats_[layer].policy_us += us;
        for (int h = 0; h < H; ++h) {
            const std::vector<TokenRun>& plan = plans_[static_cast<size_t>(i) * H + h];
            if (plan.empty()) continue;
            int sink = 0, recent = 1;
            eviction_->floor_tokens(seen_[i], lengths_[static_cast<size_t>(i) * H + h], &sink, &recent, layer);
            evict_with_floors(layer, h, plan, sink, recent);
            evicted = true;
        }
    }
    eviction_->count_update();
    return evicted;
}

void KvCache::evict(int layer, int h, const std::vector<TokenRun>& runs) {
    const EvictionConfig* c = eviction_config();  // a bad layer or head is std::out_of_range (head()), not an invalid plan
    head(layer, h);
    require(window(layer) == 0, "evict: layer " + std::to_string(layer) +
                                    " has a sliding window (its keys must stay consecutive positions)");
    evict_with_floors(layer, h, runs, c ? c->sink_tokens : 0, c ? c->recent_tokens : 1);
}

void KvCache::evict_with_floors(int layer, int h, const std::vector<TokenRun>& runs, int sink_tokens,
                                int recent_tokens) {
    Head& hs = head(layer, h);
    const std::string error = plan_error(runs, hs.length, sink_tokens, recent_tokens);
    if (!error.empty()) {
        ++stats_[layer].invalid_plans;
        throw std::invalid_argument("evict: layer " + std::to_string(layer) + " head " + std::to_string(h) + ": " +
                                    error);
    }
    const Clock::time_point t0 = Clock::now();
    const int old_length = hs.length;
    const size_t old_blocks = hs.k_blocks.size();
    const bool aligned = block_aligned(runs, cfg_.block_tokens, old_length);
    if (store_) store_->compact(layer, h, runs, aligned);
    if (aligned) drop_blocks(hs, runs);
    else move_rows(hs, runs);
    if (eviction_ && eviction_->collects(layer)) eviction_->compact(layer, h, runs, old_length);
    EvictionLayerStats& st = stats_[layer];
    ++st.evictions;
    st.blocks_freed += static_cast<int64_t>(2 * (old_blocks - hs.k_blocks.size()));
    st.compact_us += micros_since(t0);
}

void KvCache::drop_blocks(Head& hs, const std::vector<TokenRun>& runs) {
    const int bt = cfg_.block_tokens;
    size_t kept = 0, r = 0;
    int64_t length = 0;
    for (const TokenRun& run : runs) length += run.length;
    freed_k_.clear();
    freed_v_.clear();
    for (size_t b = 0; b < hs.k_blocks.size(); ++b) {
        const int64_t start = static_cast<int64_t>(b) * bt;
        while (r < runs.size() && runs[r].offset + runs[r].length <= start) ++r;
        if (r < runs.size() && runs[r].offset <= start) {
            hs.k_blocks[kept] = hs.k_blocks[b];
            hs.v_blocks[kept] = hs.v_blocks[b];
            ++kept;
        } else {
            freed_k_.push_back(hs.k_blocks[b]);
            freed_v_.push_back(hs.v_blocks[b]);
        }
    }
    // The lists only shrink, so their capacity (max_blocks) stays and append never reallocates.
    hs.k_blocks.resize(kept);
    hs.v_blocks.resize(kept);
    hs.length = static_cast<int>(length);
    pack_blocks(hs.k_blocks, freed_k_);
    pack_blocks(hs.v_blocks, freed_v_);
    for (void* b : freed_k_) pool_.release(b);
    for (void* b : freed_v_) pool_.release(b);
}

// Why pack: dropping blocks in place leaves the survivors scattered one or two per page, and the
// attention kernel, which streams a head's blocks, then pays a TLB miss and a cold DRAM access per
// block with no hardware prefetch: at ~1100 kept keys a decode step took twice as long as over
// the same number of contiguous keys. Packing keeps a head's blocks one run (the next append
// continues right behind it, see BlockPool::allocate) at the cost of copying the survivors that
// lie above an evicted block, once per eviction.
//
// Safe in place: with the raw blocks p_0 < p_1 < ... in list order and S the sorted union of them
// and `freed`, the j-th destination S[j] <= p_j, and S[j] is either free or the old address of a
// block already moved (p_i, i < j). Lists whose raw blocks are not in address order (the store can
// interleave blocks it allocated later) are left as they are.
void KvCache::pack_blocks(std::vector<void*>& list, std::vector<void*>& freed) {
    const auto addr = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
    uintptr_t last = 0;
    slots_.clear();
    for (void* p : list) {
        if (!p) continue;  // compressed: held by the store
        if (addr(p) <= last) return;
        last = addr(p);
        slots_.push_back(p);
    }
    for (void* p : freed)
        if (p) slots_.push_back(p);
    std::sort(slots_.begin(), slots_.end(), [&](const void* a, const void* b) { return addr(a) < addr(b); });
    size_t j = 0;
    for (void*& p : list) {
        if (!p) continue;
        void* dst = slots_[j++];
        if (dst != p) {
            std::memcpy(dst, p, pool_.block_bytes());
            p = dst;
        }
    }
    freed.assign(slots_.begin() + static_cast<std::ptrdiff_t>(j), slots_.end());
}

void KvCache::move_list_rows(std::vector<void*>& blocks, int64_t src, int64_t dst, int64_t n) const {
    const int64_t bt = cfg_.block_tokens;
    while (n > 0) {
        const int64_t rows = std::min({bt - src % bt, bt - dst % bt, n});
        // memmove: within one block the destination may overlap the source (dst < src).
        std::memmove(static_cast<uint8_t*>(blocks[dst / bt]) + (dst % bt) * row_bytes_,
                     static_cast<const uint8_t*>(blocks[src / bt]) + (src % bt) * row_bytes_,
                     static_cast<size_t>(rows) * row_bytes_);
        src += rows;
        dst += rows;
        n -= rows;
    }
}

void KvCache::move_rows(Head& hs, const std::vector<TokenRun>& runs) {
    int64_t dst = 0;
    for (const TokenRun& r : runs) {
        // Runs are sorted and disjoint, so dst <= r.offset: rows only move down, front to back.
        if (r.offset != dst) {
            move_list_rows(hs.k_blocks, r.offset, dst, r.length);
            move_list_rows(hs.v_blocks, r.offset, dst, r.length);
        }
        dst += r.length;
    }
    release_tail(hs, static_cast<int>(dst));
}

size_t KvCache::kept_bytes() const {
    size_t blocks = 0;
    for (const Head& hs : heads_) blocks += hs.k_blocks.size() + hs.v_blocks.size();
    return blocks * pool_.block_bytes();
}

EvictionStats KvCache::eviction_stats() const {
    EvictionStats s;
    s.layers.resize(cfg_.n_layers);
    const size_t token_bytes = static_cast<size_t>(cfg_.n_kv_heads) * row_bytes_ * 2;  // K and V, every head
    const size_t f16_token_bytes = static_cast<size_t>(cfg_.n_kv_heads) * kv_row_bytes(KvDtype::F16, cfg_.head_dim) * 2;
    for (int layer = 0; layer < cfg_.n_layers; ++layer) {
        EvictionStats::Layer& l = s.layers[layer];
        l.counters = stats_[layer];
        for (int h = 0; h < cfg_.n_kv_heads; ++h) {
            const Head& hs = head(layer, h);
            l.held.push_back(hs.length);
            for (size_t b = 0; b < hs.k_blocks.size(); ++b)  // compressed blocks are null: not pool bytes
                l.bytes_held += ((hs.k_blocks[b] != nullptr) + (hs.v_blocks[b] != nullptr)) * pool_.block_bytes();
        }
        // Without compression a window layer holds its window (llama.cpp's SWA cache does).
        const int64_t seen = stats_[layer].tokens_seen, w = window(layer);
        const size_t tokens = static_cast<size_t>(w > 0 && w < seen ? w : seen);
        s.bytes_uncompressed += tokens * token_bytes;
        s.bytes_f16 += tokens * f16_token_bytes;
        s.policy_us += stats_[layer].policy_us;
        s.compact_us += stats_[layer].compact_us;
    }
    s.bytes_held = pool_.bytes_held();
    s.lossy_ratio = ratio_of(s.bytes_uncompressed, s.bytes_held);
    s.whole_model_ratio = ratio_of(s.bytes_f16, s.bytes_held);
    s.updates = eviction_ ? eviction_->updates() : 0;
    return s;
}

std::vector<float> KvCache::eviction_scores(int layer, int* n_blocks, bool reconstruction) const {
    if (!eviction_) throw std::invalid_argument("KvCache: eviction is not enabled");
    check_layer(layer);
    int n = 0;
    for (int h = 0; h < cfg_.n_kv_heads; ++h) n = std::max(n, static_cast<int>(head(layer, h).k_blocks.size()));
    std::vector<float> scores(static_cast<size_t>(cfg_.n_kv_heads) * n, std::numeric_limits<float>::quiet_NaN());
    for (int h = 0; h < cfg_.n_kv_heads; ++h)
        for (int b = 0; b < static_cast<int>(head(layer, h).k_blocks.size()); ++b)
            scores[static_cast<size_t>(h) * n + b] =
                reconstruction ? eviction_->reconstruction_score(layer, h, b) : eviction_->score(layer, h, b);
    *n_blocks = n;
    return scores;
}

}  // namespace mnn_h2o
