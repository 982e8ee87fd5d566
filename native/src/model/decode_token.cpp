#include "mnn_h2o/model/decode_token.h"

#include <chrono>
#include <stdexcept>
#include <string>

namespace mnn_h2o {

namespace {

// The cache's attention on the layers' team for one token; taken back however the token ends.
class TeamLoan {
public:
    TeamLoan(KvCache& cache, SpinTeam& team) : cache_(cache), team_(team) { cache_.lend_team(&team_); }
    ~TeamLoan() {
        cache_.lend_team(nullptr);
        team_.rest();
    }
    TeamLoan(const TeamLoan&) = delete;
    TeamLoan& operator=(const TeamLoan&) = delete;

private:
    KvCache& cache_;
    SpinTeam& team_;
};

void require_same(int a, int b, const char* what) {
    if (a != b)
        throw std::invalid_argument("decode_token: the layers have " + std::to_string(a) + " " + what +
                                    ", the cache " + std::to_string(b));
}

}  // namespace

TokenTimes decode_token(DecodeLayers& layers, KvCache& cache, float* h, const float* cos, const float* sin, float* q,
                        float* k, float* v, float* attn, Isa isa, const LayerObserver& observe, const float* local_cos,
                        const float* local_sin, float* logits) {
    const DecodeShape& s = layers.shape();
    const KvCacheConfig& c = cache.config();
    require_same(layers.n_layers(), c.n_layers, "layers");
    require_same(s.n_heads, c.n_heads, "query heads");
    require_same(s.n_kv_heads, c.n_kv_heads, "kv heads");
    require_same(s.head_dim, c.head_dim, "head_dim");
    for (int i = 0; i < c.n_layers; ++i)
        if (cache.window(i) > 0 && !(local_cos && local_sin))
            throw std::invalid_argument("decode_token: layer " + std::to_string(i) +
                                        " has a sliding window and no window layers' RoPE table was given");
    if (logits && !layers.has_head())
        throw std::invalid_argument("decode_token: logits asked of layers that hold no output matrix (set_head)");
    using Clock = std::chrono::steady_clock;
    const auto seconds = [](Clock::time_point a, Clock::time_point b) {
        return std::chrono::duration<double>(b - a).count();
    };
    TokenTimes times;
    std::vector<float> scores;
    TeamLoan loan(cache, layers.team());
    Clock::time_point t0 = Clock::now();
    for (int i = 0; i < layers.n_layers(); ++i) {
        const bool local = cache.window(i) > 0;
        layers.forward(i, h, i > 0 ? attn : nullptr, local ? local_cos : cos, local ? local_sin : sin, q, k, v, isa,
                       /*rest=*/false);
        const Clock::time_point t1 = Clock::now();
        cache.step(i, q, k, v, 1, attn);
        const Clock::time_point t2 = Clock::now();
        times.dense_s += seconds(t0, t1);
        times.attention_s += seconds(t1, t2);
        t0 = t2;
        if (observe) {
            scores.assign(static_cast<size_t>(s.n_kv_heads), 0.f);
            if (observe(i, h, scores)) cache.set_token_scores(i, scores.data(), 1);
            t0 = Clock::now();
            times.observe_s += seconds(t2, t0);
        }
    }
    if (logits) {
        // The head finishes the last layer in place: on a copy, so that h stays that layer's input.
        std::vector<float> last(h, h + s.hidden);
        layers.logits(last.data(), attn, logits, isa);
        times.head_s = seconds(t0, Clock::now());
    }
    return times;
}

}  // namespace mnn_h2o
