// The eviction policies and their registry (eviction_policy.h). Each policy turns what the state
// gives it of one kv head (ScoreContext) into a priority per block; budgets, floors and selection
// are shared. Priorities of different heads meet in a shared layer budget, so every score here is
// an attention probability or a distribution over the head's blocks (docs/eviction.md "Policies").
#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include "mnn_h2o/config_schema.h"
#include "mnn_h2o/eviction/eviction_policy.h"

namespace mnn_h2o {

namespace {

// H2O: blocks that received the most attention (EMA of the normalised mass) are heavy hitters.
class H2oPolicy final : public EvictionPolicy {
public:
    void rank(const ScoreContext& head, float* priority) override {
        std::copy(head.ema, head.ema + head.n_blocks, priority);
    }
};

// SnapKV: the attention of the observation window (the prompt's last W queries, which usually
// hold the question) decides. SnapKV max-pools its token scores with a kernel of 7 so that
// neighbours of a hit survive; a 16-token block already keeps its neighbours together.
class SnapKvPolicy final : public EvictionPolicy {
public:
    void rank(const ScoreContext& head, float* priority) override {
        std::copy(head.window, head.window + head.n_blocks, priority);
    }
    PolicySignals signals() const override { return {true, false, false, false}; }
};

// TOVA: the attention of the latest query alone (a window of one).
class TovaPolicy final : public EvictionPolicy {
public:
    void rank(const ScoreContext& head, float* priority) override {
        std::copy(head.window, head.window + head.n_blocks, priority);
    }
    PolicySignals signals() const override { return {true, false, false, false}; }
    int window_queries(int) const override { return 1; }
};

// Row arithmetic at plan time reads every key or value a head holds, so it must not serialise on
// the add latency: 16 independent partial sums (head_dim is a multiple of 16) let the compiler
// vectorise what a single running sum cannot (measured: about 10x on keydiff's update).
constexpr int kLanes = 16;

inline float dot(const float* a, const float* b, int n) {
    float acc[kLanes] = {};
    for (int d = 0; d < n; d += kLanes)
        for (int j = 0; j < kLanes; ++j) acc[j] += a[d + j] * b[d + j];
    float s = 0.f;
    for (float x : acc) s += x;
    return s;
}

// sum_d k_d * (m_d + v_d * k_d): a linear and a diagonal quadratic form in one pass.
inline float dot_quad(const float* k, const float* m, const float* v, int n) {
    float acc[kLanes] = {};
    for (int d = 0; d < n; d += kLanes)
        for (int j = 0; j < kLanes; ++j) acc[j] += k[d + j] * (m[d + j] + v[d + j] * k[d + j]);
    float s = 0.f;
    for (float x : acc) s += x;
    return s;
}

// Scores of tokens pooled to blocks as a mean (the partial last block counts its tokens only).
void block_means(const ScoreContext& head, const float* per_token, float* per_block) {
    for (int b = 0; b < head.n_blocks; ++b) {
        const int t0 = b * head.block_tokens, t1 = std::min(head.length, t0 + head.block_tokens);
        double sum = 0.0;
        for (int t = t0; t < t1; ++t) sum += per_token[t];
        per_block[b] = t1 > t0 ? static_cast<float>(sum / (t1 - t0)) : 0.f;
    }
}

// Priorities as a distribution over the head's blocks (comparable between heads); all-zero
// scores stay zero.
void to_distribution(float* p, int n) {
    double sum = 0.0;
    for (int b = 0; b < n; ++b) sum += p[b];
    if (!(sum > 0.0)) return;
    for (int b = 0; b < n; ++b) p[b] = static_cast<float>(p[b] / sum);
}

// KeyDiff (query-agnostic): keys that differ from the head's typical key are the ones some query
// will single out, keys close to it get average attention anyway. Token score (1 - cos(k,
// anchor)) / 2 with the anchor the mean of the normalised keys; a block's score is its tokens'
// mean, then a distribution over the head's blocks.
class KeyDiffPolicy final : public EvictionPolicy {
public:
    void rank(const ScoreContext& head, float* priority) override {
        const int n = head.length, hd = head.head_dim;
        token_.assign(static_cast<size_t>(n), 0.f);
        anchor_.assign(static_cast<size_t>(hd), 0.f);
        for (int t = 0; t < n; ++t) {
            const float* k = head.k_rows + static_cast<size_t>(t) * hd;
            const float sq = dot(k, k, hd);
            token_[t] = sq > 0.f ? 1.f / std::sqrt(sq) : 0.f;  // inverse norm, for now
            for (int d = 0; d < hd; ++d) anchor_[d] += k[d] * token_[t];
        }
        const float norm = std::sqrt(dot(anchor_.data(), anchor_.data(), hd));
        for (float& a : anchor_) a = norm > 0.f ? a / norm : 0.f;
        for (int t = 0; t < n; ++t) {
            const float* k = head.k_rows + static_cast<size_t>(t) * hd;
            token_[t] = 0.5f * (1.f - dot(k, anchor_.data(), hd) * token_[t]);
        }
        block_means(head, token_.data(), priority);
        to_distribution(priority, head.n_blocks);
    }
    PolicySignals signals() const override { return {false, false, true, false}; }

private:
    std::vector<float> token_, anchor_;
};

// VATP (value-aware token pruning): a block's attention EMA times its tokens' mean ||v||
// relative to the head's mean ||v||, so a heavily attended block whose values are near zero
// contributes little to the output and goes first. (The paper uses the L1 norm; L2 is
// rotation-invariant, so rotated dtypes score alike.) The scale stays that of the EMA.
class VatpPolicy final : public EvictionPolicy {
public:
    void rank(const ScoreContext& head, float* priority) override {
        const int n = head.length, hd = head.head_dim;
        token_.resize(static_cast<size_t>(n));
        double total = 0.0;
        for (int t = 0; t < n; ++t) {
            const float* v = head.v_rows + static_cast<size_t>(t) * hd;
            token_[t] = std::sqrt(dot(v, v, hd));
            total += token_[t];
        }
        block_means(head, token_.data(), priority);
        const double mean = n > 0 ? total / n : 0.0;
        for (int b = 0; b < head.n_blocks; ++b)
            priority[b] = mean > 0.0 ? static_cast<float>(head.ema[b] * (priority[b] / mean)) : head.ema[b];
    }
    PolicySignals signals() const override { return {false, false, false, true}; }

private:
    std::vector<float> token_;
};

// Expected attention (an approximation of kvpress's ExpectedAttentionPress): the recent queries
// of each query head as a Gaussian N(mu, diag(var)); the expected unnormalised weight of key k,
// E exp(q.k / sqrt(d)) = exp(mu.k / sqrt(d) + 1/2 sum_d var_d k_d^2 / d), normalised over the
// head's keys (log-sum-exp), summed per block and averaged over the group's query heads: a
// distribution over the blocks. The paper first rotates the mean query forward to the positions
// of the coming queries (RoPE); that is omitted here: the statistics are of the queries as they
// were, at their own positions.
class ExpectedAttentionPolicy final : public EvictionPolicy {
public:
    void rank(const ScoreContext& head, float* priority) override {
        const int n = head.length, hd = head.head_dim, nb = head.n_blocks;
        if (head.q_count == 0) {  // no query seen yet: nothing to expect, fall back to the EMA
            std::copy(head.ema, head.ema + nb, priority);
            return;
        }
        std::fill(priority, priority + nb, 0.f);
        logit_.resize(static_cast<size_t>(n));
        const float inv_sqrt_d = 1.f / std::sqrt(static_cast<float>(hd)), half_inv_d = 0.5f / static_cast<float>(hd);
        mean_.resize(static_cast<size_t>(hd));
        var_.resize(static_cast<size_t>(hd));
        for (int g = 0; g < head.group; ++g) {
            for (int d = 0; d < hd; ++d) {
                mean_[d] = head.q_mean[static_cast<size_t>(g) * hd + d] * inv_sqrt_d;
                var_[d] = head.q_var[static_cast<size_t>(g) * hd + d] * half_inv_d;
            }
            float m = -std::numeric_limits<float>::infinity();
            for (int t = 0; t < n; ++t) {
                logit_[t] = dot_quad(head.k_rows + static_cast<size_t>(t) * hd, mean_.data(), var_.data(), hd);
                m = std::max(m, logit_[t]);
            }
            double sum = 0.0;
            for (int t = 0; t < n; ++t) sum += logit_[t] = std::exp(logit_[t] - m);
            const float w = static_cast<float>(1.0 / (sum * head.group));
            for (int t = 0; t < n; ++t) priority[t / head.block_tokens] += logit_[t] * w;
        }
    }
    PolicySignals signals() const override { return {false, true, true, false}; }

private:
    std::vector<float> logit_, mean_, var_;
};

// KVzip (query-agnostic): after a prompt the engine asks the model to repeat it (a context
// reconstruction pass through the same kernels); a block's score is the largest probability any
// reconstruction query gave any of its keys, so what the model needs to reproduce the context
// stays. Those peaks are probabilities, compared as they are across heads and layers (KVzip's
// global budget; kvpress does the same). Blocks no pass has scored yet (tokens written since the
// last pass: the decode) rank above every scored block, so the context pays for the decode.
class KvzipPolicy final : public EvictionPolicy {
public:
    void rank(const ScoreContext& head, float* priority) override {
        for (int b = 0; b < head.n_blocks; ++b)
            priority[b] = std::isnan(head.reconstruction[b]) ? std::numeric_limits<float>::infinity()
                                                              : head.reconstruction[b];
    }
    PolicySignals signals() const override {
        PolicySignals s;
        s.reconstruction = true;
        return s;
    }
};

// KVzip without its pass (KVzap's idea, arXiv 2601.07891): each token's reconstruction score is
// predicted from its hidden state by a map the engine fitted to kvzip's own scores
// (mnn_h2o/token_scorer.py) and given as the token enters the cache; ranked as kvzip's. Blocks
// without a score (tokens written before scoring was on) rank first, as kvzip's unscored do.
class PredictedKvzipPolicy final : public EvictionPolicy {
public:
    void rank(const ScoreContext& head, float* priority) override { kvzip_.rank(head, priority); }
    PolicySignals signals() const override {
        PolicySignals s = kvzip_.signals();
        s.predicted = true;
        return s;
    }

private:
    KvzipPolicy kvzip_;
};

// StreamingLLM: no scores; the budget beyond the floors goes to the most recent blocks.
class StreamingPolicy final : public EvictionPolicy {
public:
    void rank(const ScoreContext& head, float* priority) override {
        for (int b = 0; b < head.n_blocks; ++b) priority[b] = static_cast<float>(b);
    }
};

// A control: the same budget spent on uniformly random blocks. Priorities are 24 random bits, so
// they are exact floats and the choice does not depend on the standard library's distributions.
class RandomPolicy final : public EvictionPolicy {
public:
    explicit RandomPolicy(uint64_t seed) : seed_(seed), rng_(seed) {}
    void rank(const ScoreContext& head, float* priority) override {
        for (int b = 0; b < head.n_blocks; ++b) priority[b] = static_cast<float>(rng_() >> 40);
    }
    void reset() override { rng_.seed(seed_); }
    // The generator's state as the standard's text form: exact and portable.
    std::string state() const override {
        std::ostringstream os;
        os << rng_;
        return os.str();
    }
    void set_state(const std::string& state) override {
        std::istringstream is(state);
        std::mt19937_64 rng;
        is >> rng;
        if (is.fail()) throw std::invalid_argument("random policy: its saved generator state does not parse");
        rng_ = rng;
    }

private:
    uint64_t seed_;
    std::mt19937_64 rng_;
};

struct Entry {
    const char* name;
    std::unique_ptr<EvictionPolicy> (*make)(uint64_t seed);
};

template <class P>
std::unique_ptr<EvictionPolicy> make_plain(uint64_t) {
    return std::make_unique<P>();
}

std::unique_ptr<EvictionPolicy> make_random(uint64_t seed) { return std::make_unique<RandomPolicy>(seed); }

// The one list of policy classes, by name.
constexpr Entry kRegistry[] = {
    {"h2o", make_plain<H2oPolicy>},
    {"snapkv", make_plain<SnapKvPolicy>},
    {"tova", make_plain<TovaPolicy>},
    {"keydiff", make_plain<KeyDiffPolicy>},
    {"vatp", make_plain<VatpPolicy>},
    {"expected_attention", make_plain<ExpectedAttentionPolicy>},
    {"streaming", make_plain<StreamingPolicy>},
    {"random", make_random},
    {"kvzip", make_plain<KvzipPolicy>},
    {"predicted_kvzip", make_plain<PredictedKvzipPolicy>},
};

// The names are eviction.policy's choices, in their order (mnn_h2o/config.py, config_schema.h): adding a
// policy is a class and an entry here and its name there.
constexpr bool registry_is_the_schemas() {
    using Policy = schema::eviction::policy;
    if (std::size(kRegistry) != static_cast<size_t>(Policy::kChoiceCount)) return false;
    for (size_t i = 0; i < std::size(kRegistry); ++i)
        if (std::string_view(kRegistry[i].name) != Policy::kChoices[i]) return false;
    return true;
}
static_assert(registry_is_the_schemas(), "the policy registry's names are eviction.policy's choices");

}  // namespace

const std::vector<std::string>& policy_list() {
    static const std::vector<std::string> names = [] {
        std::vector<std::string> v;
        for (const Entry& e : kRegistry) v.emplace_back(e.name);
        return v;
    }();
    return names;
}

const char* policy_names() {
    static const std::string text = [] {
        const std::vector<std::string>& v = policy_list();
        std::string s;
        for (size_t i = 0; i < v.size(); ++i) s += (i == 0 ? "" : i + 1 == v.size() ? " or " : ", ") + ("'" + v[i] + "'");
        return s;
    }();
    return text.c_str();
}

bool is_policy_name(const std::string& name) {
    for (const Entry& e : kRegistry)
        if (name == e.name) return true;
    return false;
}

std::unique_ptr<EvictionPolicy> make_policy(const std::string& name, uint64_t seed) {
    for (const Entry& e : kRegistry)
        if (name == e.name) return e.make(seed);
    throw std::invalid_argument("policy must be " + std::string(policy_names()) + ", got '" + name + "'");
}

}  // namespace mnn_h2o
