// predicted_kvzip's map in the core (eviction/token_scorer.h) against the formula in float64, its
// layer range, and the shapes and weights it refuses (tests/test_token_scorer.py checks it against
// the Python reference that fits it).
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <vector>

#include "mnn_h2o/eviction/token_scorer.h"

#include "test_support.h"

using namespace mnn_h2o;

static void test_against_float64() {
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.f, 1.f);
    for (int hidden : {5, 64, 1536}) {  // 5: no whole group of eight lanes
        const int L = 3, H = 2, n = 4;
        std::vector<float> w(static_cast<size_t>(L) * (hidden + 1) * H), h(static_cast<size_t>(n) * hidden);
        for (float& x : w) x = 0.05f * dist(rng);
        for (float& x : h) x = 40.f * dist(rng);
        TokenScorer scorer(w, L, hidden, H, 1, 3);
        std::vector<float> out(static_cast<size_t>(H) * n, -1.f);
        CHECK(!scorer.scores(0, h.data(), n, out.data()) && out[0] == -1.f, "layer 0 is outside [1, 3)");
        CHECK(scorer.scores(2, h.data(), n, out.data()), "layer 2 scores");
        double worst = 0.0;
        for (int r = 0; r < n; ++r) {
            const float* x = h.data() + static_cast<size_t>(r) * hidden;
            double sq = 0.0;
            for (int d = 0; d < hidden; ++d) sq += double(x[d]) * x[d];
            const double rms = std::sqrt(sq / hidden + 1e-6);
            for (int k = 0; k < H; ++k) {
                double logit = w[(static_cast<size_t>(2) * (hidden + 1) + hidden) * H + k];
                for (int d = 0; d < hidden; ++d) logit += x[d] / rms * w[(static_cast<size_t>(2) * (hidden + 1) + d) * H + k];
                const double want = std::exp(std::min(logit, 0.0));
                worst = std::max(worst, std::fabs(out[static_cast<size_t>(k) * n + r] - want) / want);
            }
        }
        CHECK(worst < 1e-5, "hidden %d: relative error %g against float64", hidden, worst);
    }
}

static void test_refusals() {
    const std::vector<float> w(2 * 9 * 1, 0.f);
    CHECK(throws<std::invalid_argument>([&] { TokenScorer(w, 2, 8, 2, 0, 2); }), "weights of another shape");
    CHECK(throws<std::invalid_argument>([&] { TokenScorer(w, 2, 8, 1, 1, 3); }), "layers beyond the model");
    CHECK(throws<std::invalid_argument>([&] { TokenScorer(w, 2, 8, 1, 1, 1); }), "an empty layer range");
    std::vector<float> bad = w;
    bad[3] = std::nanf("");
    CHECK(throws<std::invalid_argument>([&] { TokenScorer(bad, 2, 8, 1, 0, 2); }), "a NaN weight");
}

int main() {
    test_against_float64();
    test_refusals();
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all token scorer tests passed\n");
    return 0;
}
