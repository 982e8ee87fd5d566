// DecodeLayers on a small random model (Q4_K, Q6_K and Q4_1 parts, a qkv bias, a Q6_K head): a
// prompt chunk's forward_rows against forward row by row (batched products round the activation
// per block of 32, the one-row ones in the k-quant form: close, not equal), one and two threads
// bit for bit, a chunk below the batched products' 16 rows exactly forward's; logits_rows
// likewise, for llama's form and for Gemma 3's (QK-norm, sandwich norms, GELU, Q narrower than
// hidden); bad calls and forms refused; decode_token (model/decode_token.h: every layer and its cache step in
// one call, the attention on the layers' team, the logits too when asked for) bit for bit the
// layer-by-layer calls, past the keys where the attention splits over both threads, with a Q6_K head
// and with a q8_0 one (Q8Matrix, float activation: its logits against float64 too). Run under ASan /
// UBSan in the sanitizer tier.
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mnn_h2o/cache/fp16.h"
#include "mnn_h2o/cache/kv_cache.h"
#include "mnn_h2o/dense/decode_layers.h"
#include "mnn_h2o/dense/weight_types.h"
#include "mnn_h2o/model/decode_token.h"

#include "test_support.h"

using namespace mnn_h2o;

namespace {

std::vector<uint8_t> random_blocks(WeightType type, int rows, int cols, std::mt19937& rng) {
    const WeightTypeTraits& t = weight_traits(type);
    std::uniform_int_distribution<int> byte(0, 255);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<uint8_t> b(static_cast<size_t>(rows) * weight_row_bytes(t, cols));
    for (auto& v : b) v = static_cast<uint8_t>(byte(rng));
    auto put = [&](uint8_t* p, float v) {
        const uint16_t h = fp32_to_fp16(v);
        std::memcpy(p, &h, 2);
    };
    for (size_t k = 0; k < b.size() / t.block_bytes; ++k) {
        uint8_t* p = &b[k * t.block_bytes];
        if (type == WeightType::Q6_K) {
            put(p + 208, normal(rng) * 0.0004f);
        } else if (type == WeightType::Q4_1) {
            put(p, std::fabs(normal(rng)) * 0.004f);
            put(p + 2, normal(rng) * 0.02f);
        } else {
            put(p, std::fabs(normal(rng)) * 0.0015f);
            put(p + 2, std::fabs(normal(rng)) * 0.0015f);
        }
    }
    return b;
}

WeightMatrix matrix(std::vector<std::pair<WeightType, int>> parts, int cols, std::mt19937& rng) {
    std::vector<WeightMatrix::Part> ps;
    std::vector<std::vector<uint8_t>> bytes;
    bytes.reserve(parts.size());  // the views below point into these
    for (auto [type, rows] : parts) {
        bytes.push_back(random_blocks(type, rows, cols, rng));
        ps.push_back({type, rows, bytes.back().data(), bytes.back().size()});
    }
    return WeightMatrix(cols, ps);
}

double rel(const float* a, const float* b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; ++i) {
        d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
        s += static_cast<double>(b[i]) * b[i];
    }
    return std::sqrt(d / (s > 0 ? s : 1));
}

constexpr int kVocab = 1000;

struct Model {
    DecodeShape shape;
    std::unique_ptr<DecodeLayers> layers;
    std::vector<float> out_norm;
    std::shared_ptr<Q8Matrix> q8_rows;  // the head, where it is q8_0 rows
};

std::vector<int8_t> random_codes(std::mt19937& rng, int n) {
    std::uniform_int_distribution<int> code(-127, 127);
    std::vector<int8_t> c(static_cast<size_t>(n));
    for (int8_t& x : c) x = static_cast<int8_t>(code(rng));
    return c;
}

std::vector<uint16_t> random_scales(std::mt19937& rng, int n) {
    std::uniform_real_distribution<float> scale(0.001f, 0.01f);
    std::vector<uint16_t> s(static_cast<size_t>(n));
    for (uint16_t& x : s) x = fp32_to_fp16(scale(rng));
    return s;
}

std::vector<float> norm_weights(std::mt19937& rng, int n) {
    std::vector<float> w = random_vec(rng, n, 0.2f);
    for (float& v : w) v += 1.f;
    return w;
}

// Llama / Qwen2's form (a qkv bias, SwiGLU), or with gemma Gemma 3's (QK-norm, sandwich norms,
// GELU, Q narrower than the hidden size, no bias).
// The head: a Q6_K matrix, or with q8_head q8_0 rows times the float activation (Q8Matrix).
Model make(int threads, bool gemma = false, bool q8_head = false, bool head = true) {
    std::mt19937 rng(5);  // the same weights for every thread count
    DecodeShape s;
    s.hidden = 512;
    s.n_heads = gemma ? 2 : 4;
    s.n_kv_heads = gemma ? 1 : 2;
    s.head_dim = 128;
    s.ffn = 768;
    s.rms_eps = 1e-5f;
    s.form = {{"qkv_bias", gemma ? "false" : "true"}, {"norm", "rms"}, {"mlp", gemma ? "geglu" : "swiglu"},
              {"qk_norm", gemma ? "true" : "false"}, {"post_norms", gemma ? "true" : "false"},
              {"q_width", gemma ? "heads" : "hidden"}, {"embedding_scale", "none"}, {"global_every", "0"},
              {"local_rope_base", "0.0"}};
    std::vector<DecodeLayerWeights> ws;
    for (int i = 0; i < 2; ++i) {
        DecodeLayerWeights w;
        w.attn_norm = norm_weights(rng, s.hidden);
        w.ffn_norm = norm_weights(rng, s.hidden);
        const int nq = s.n_heads * s.head_dim, nk = s.n_kv_heads * s.head_dim;
        w.qkv = matrix({{WeightType::Q4_K, nq + nk}, {WeightType::Q6_K, nk}}, s.hidden, rng);
        if (gemma) {
            w.q_norm = norm_weights(rng, s.head_dim);
            w.k_norm = norm_weights(rng, s.head_dim);
            w.post_attn_norm = norm_weights(rng, s.hidden);
            w.post_ffn_norm = norm_weights(rng, s.hidden);
        } else {
            w.qkv_bias = random_vec(rng, nq + 2 * nk, 0.1f);
        }
        w.wo = matrix({{WeightType::Q4_K, s.hidden}}, nq, rng);
        w.gate = matrix({{WeightType::Q4_K, s.ffn}}, s.hidden, rng);
        w.up = matrix({{WeightType::Q4_1, s.ffn}}, s.hidden, rng);
        w.down = matrix({{WeightType::Q6_K, s.hidden}}, s.ffn, rng);
        ws.push_back(std::move(w));
    }
    Model m{s, std::make_unique<DecodeLayers>(s, std::move(ws), threads)};
    std::vector<float> out_norm = random_vec(rng, s.hidden, 0.1f);
    for (float& v : out_norm) v += 1.f;
    if (!head) {
    } else if (q8_head) {
        m.q8_rows = std::make_shared<Q8Matrix>(kVocab, s.hidden, random_codes(rng, kVocab * s.hidden),
                                               random_scales(rng, kVocab * s.hidden / kQ8Block), 1);
        m.layers->set_head(out_norm, m.q8_rows);
    } else {
        m.layers->set_head(out_norm, matrix({{WeightType::Q6_K, kVocab}}, s.hidden, rng));
    }
    m.out_norm = out_norm;
    return m;
}

// decode_token against forward (rest between calls) and KvCache::step layer by layer on a cache of
// its own: h and the attention output equal bit for bit at every token, over enough tokens that
// the attention splits its keys (from kSplitMinProducts: on the lent team's threads, and on the
// cache's own pool's caller alone until kParallelMinQueryKeys, then on its threads too).
void one_call_is_the_layers_one_by_one(int threads, bool q8_head) {
    Model a = make(threads, false, q8_head), b = make(threads, false, q8_head);
    const DecodeShape& s = a.shape;
    // One thread never splits the keys: a few tokens show the call is the calls.
    const int n_tokens = threads > 1 ? static_cast<int>(kParallelMinQueryKeys) + 80 : 100;
    KvCache own(kv_config(2, s.n_kv_heads, s.head_dim, s.n_heads, KvDtype::Q8, 16, n_tokens, threads));
    KvCache lent(own.config());
    const size_t nq = static_cast<size_t>(s.n_heads) * s.head_dim, nk = static_cast<size_t>(s.n_kv_heads) * s.head_dim;
    std::vector<float> q(nq), k(nk), v(nk), attn_a(nq), attn_b(nq), cos(s.head_dim), sin(s.head_dim);
    std::vector<float> logits_a(kVocab), logits_b(kVocab);
    std::mt19937 rng(11);
    bool same = true;
    for (int t = 0; t < n_tokens && same; ++t) {
        std::vector<float> ha = random_vec(rng, s.hidden), hb = ha;
        for (int j = 0; j < s.head_dim; ++j) {
            const double th = t * std::pow(10000.0, -2.0 * (j % (s.head_dim / 2)) / s.head_dim);
            cos[j] = static_cast<float>(std::cos(th));
            sin[j] = static_cast<float>(std::sin(th));
        }
        for (int i = 0; i < 2; ++i) {
            a.layers->forward(i, ha.data(), i ? attn_a.data() : nullptr, cos.data(), sin.data(), q.data(), k.data(),
                              v.data(), best_isa(), true);
            own.step(i, q.data(), k.data(), v.data(), 1, attn_a.data());
        }
        std::vector<float> finished = ha;  // logits finishes the last layer in place
        a.layers->logits(finished.data(), attn_a.data(), logits_a.data(), best_isa());
        // Every other token asks for the logits in the call: without them the call is the layers alone.
        const bool head = t % 2 == 0;
        const TokenTimes times = decode_token(*b.layers, lent, hb.data(), cos.data(), sin.data(), q.data(), k.data(),
                                              v.data(), attn_b.data(), best_isa(), {}, nullptr, nullptr,
                                              head ? logits_b.data() : nullptr);
        same = std::memcmp(ha.data(), hb.data(), ha.size() * sizeof(float)) == 0 &&
               std::memcmp(attn_a.data(), attn_b.data(), nq * sizeof(float)) == 0 &&
               (!head || std::memcmp(logits_a.data(), logits_b.data(), kVocab * sizeof(float)) == 0);
        CHECK(same, "%d threads, %s head, token %d: decode_token differs from the layers one by one", threads,
              q8_head ? "q8" : "Q6_K", t);
        CHECK(head == (times.head_s > 0), "token %d: head time %g", t, times.head_s);
    }
    CHECK(lent.team() != &b.layers->team(), "%d threads: the layers' team still lent after the token", threads);
    // An observer's scores go to the cache: one without predicted eviction refuses them, and the
    // token's error leaves the team returned.
    std::vector<float> h = random_vec(rng, s.hidden);
    const LayerObserver hand_scores = [](int, const float*, std::vector<float>& scores) {
        scores.assign(scores.size(), 0.5f);
        return true;
    };
    KvCache fresh(own.config());
    CHECK(throws<std::invalid_argument>([&] {
              decode_token(*b.layers, fresh, h.data(), cos.data(), sin.data(), q.data(), k.data(), v.data(),
                           attn_b.data(), best_isa(), hand_scores);
          }),
          "scores for a cache that takes none");
    CHECK(fresh.team() != &b.layers->team(), "%d threads: the team still lent after an error", threads);
    int seen = 0;
    const LayerObserver count = [&seen](int, const float*, std::vector<float>&) { return ++seen < 0; };
    KvCache counted(own.config());
    decode_token(*b.layers, counted, h.data(), cos.data(), sin.data(), q.data(), k.data(), v.data(), attn_b.data(),
                 best_isa(), count);
    CHECK(seen == 2, "the observer saw %d layers, want 2", seen);
    Model headless = make(threads, false, false, /*head=*/false);
    KvCache for_headless(own.config());
    CHECK(throws<std::invalid_argument>([&] {
              decode_token(*headless.layers, for_headless, h.data(), cos.data(), sin.data(), q.data(), k.data(),
                           v.data(), attn_b.data(), best_isa(), {}, nullptr, nullptr, logits_b.data());
          }),
          "logits of layers without a head");
    CHECK(for_headless.length(0, 0) == 0, "layers without a head: the token went into the cache");
    KvCache three_layers(kv_config(3, s.n_kv_heads, s.head_dim, s.n_heads, KvDtype::Q8, 16, 64, threads));
    CHECK(throws<std::invalid_argument>([&] {
              decode_token(*b.layers, three_layers, h.data(), cos.data(), sin.data(), q.data(), k.data(), v.data(),
                           attn_b.data(), best_isa());
          }),
          "a cache of another model");
}

// The layer's form (decode_layers.h): an option missing, unknown, or of a value these layers do
// not implement is refused by name, and the biases must match qkv_bias.
void form_refusals(const DecodeShape& good) {
    std::mt19937 rng(3);
    auto layer = [&](bool bias) {
        DecodeLayerWeights w;
        w.attn_norm.assign(good.hidden, 1.f);
        w.ffn_norm.assign(good.hidden, 1.f);
        const int nq = good.n_heads * good.head_dim, nk = good.n_kv_heads * good.head_dim;
        w.qkv = matrix({{WeightType::Q4_K, nq + 2 * nk}}, good.hidden, rng);
        if (bias) w.qkv_bias.assign(nq + 2 * nk, 0.f);
        w.wo = matrix({{WeightType::Q4_K, good.hidden}}, nq, rng);
        w.gate = matrix({{WeightType::Q4_K, good.ffn}}, good.hidden, rng);
        w.up = matrix({{WeightType::Q4_K, good.ffn}}, good.hidden, rng);
        w.down = matrix({{WeightType::Q4_K, good.hidden}}, good.ffn, rng);
        return w;
    };
    auto refused = [&](DecodeShape s, bool bias, const char* want) {
        try {
            std::vector<DecodeLayerWeights> ws;
            ws.push_back(layer(bias));
            DecodeLayers l(s, std::move(ws), 1);
        } catch (const std::invalid_argument& e) {
            CHECK(std::string(e.what()).find(want) != std::string::npos, "message '%s' lacks '%s'", e.what(), want);
            return;
        }
        CHECK(false, "a form was accepted where '%s' was expected", want);
    };
    DecodeShape s = good;
    s.form["norm"] = "layer";
    refused(s, true, "do not implement norm layer");
    s = good;
    s.form["global_every"] = "4";  // the caller's (which layers have windows): the engine does 0 and 6
    refused(s, true, "do not implement global_every 4");
    s = good;
    s.form["qk_norm"] = "true";
    refused(s, true, "q_norm and k_norm must have head_dim values");
    s = good;
    s.form["post_norms"] = "true";
    refused(s, true, "post_attn_norm and post_ffn_norm must have hidden values");
    s = good;
    s.n_heads /= 2;  // n_heads x head_dim no longer the hidden size
    refused(s, true, "q_width hidden needs n_heads * head_dim == hidden");
    s = good;
    s.form.erase("mlp");
    refused(s, true, "has no mlp");
    s = good;
    s.form["sliding_window"] = "512";
    refused(s, true, "the option sliding_window");
    s = good;
    s.form["qkv_bias"] = "false";
    refused(s, true, "qkv_bias given where the form has none");
    refused(good, false, "one value per qkv row");
    std::vector<DecodeLayerWeights> ws;
    ws.push_back(layer(false));
    s = good;
    s.form["qkv_bias"] = "false";
    DecodeLayers ok(s, std::move(ws), 1);  // llama's form: no biases
    CHECK(ok.n_layers() == 1, "the llama form");
}

struct Rows {
    std::vector<float> h, q, k, v;
};

// Layer 1 of a chunk of n rows (finishing layer 0 from attn first), by forward_rows or row by row.
Rows run(DecodeLayers& l, const DecodeShape& s, int n, bool batched, const std::vector<float>& h0,
         const std::vector<float>& attn, const std::vector<float>& cos, const std::vector<float>& sin) {
    const size_t nq = s.n_heads * s.head_dim, nk = s.n_kv_heads * s.head_dim, hd = s.head_dim;
    Rows r{std::vector<float>(h0.begin(), h0.begin() + static_cast<long>(n) * s.hidden),
           std::vector<float>(n * nq), std::vector<float>(n * nk), std::vector<float>(n * nk)};
    if (batched) {
        l.forward_rows(1, n, r.h.data(), attn.data(), cos.data(), sin.data(), r.q.data(), r.k.data(), r.v.data(),
                       best_isa());
    } else {
        for (int i = 0; i < n; ++i)
            l.forward(1, r.h.data() + i * s.hidden, attn.data() + i * nq, cos.data() + i * hd, sin.data() + i * hd,
                      r.q.data() + i * nq, r.k.data() + i * nk, r.v.data() + i * nk, best_isa(), true);
    }
    return r;
}


// forward_rows against forward row by row, one thread against two, logits_rows against logits.
void rows_against_forward(bool gemma) {
    Model one = make(1, gemma), two = make(2, gemma);
    const DecodeShape& s = one.shape;
    const char* form = gemma ? "gemma3's form" : "llama's form";
    std::mt19937 rng(9);
    const int n_max = 21;
    const size_t nq = s.n_heads * s.head_dim;
    const std::vector<float> h0 = random_vec(rng, n_max * s.hidden), attn = random_vec(rng, n_max * nq);
    std::vector<float> cos(n_max * s.head_dim), sin(n_max * s.head_dim);
    for (int i = 0; i < n_max; ++i)
        for (int j = 0; j < s.head_dim; ++j) {
            const double th = (40 + i) * std::pow(10000.0, -2.0 * (j % (s.head_dim / 2)) / s.head_dim);
            cos[i * s.head_dim + j] = static_cast<float>(std::cos(th));
            sin[i * s.head_dim + j] = static_cast<float>(std::sin(th));
        }
    for (int n : {21, 3}) {
        const Rows a = run(*one.layers, s, n, true, h0, attn, cos, sin);
        const Rows b = run(*two.layers, s, n, true, h0, attn, cos, sin);
        const Rows ref = run(*one.layers, s, n, false, h0, attn, cos, sin);
        const std::vector<float>* pa[] = {&a.h, &a.q, &a.k, &a.v};
        const std::vector<float>* pb[] = {&b.h, &b.q, &b.k, &b.v};
        const std::vector<float>* pr[] = {&ref.h, &ref.q, &ref.k, &ref.v};
        const char* names[] = {"h", "q", "k", "v"};
        for (int t = 0; t < 4; ++t) {
            CHECK(std::memcmp(pa[t]->data(), pb[t]->data(), pa[t]->size() * sizeof(float)) == 0,
                  "%s n %d %s: one and two threads differ", form, n, names[t]);
            const double e = rel(pa[t]->data(), pr[t]->data(), pa[t]->size());
            if (n >= kMinRows) {
                // A row by itself rounds its activation once for the k-quant parts (q4_matrix.h), a
                // chunk's rows twice (batched_product.h): they differ by one rounding's noise.
                CHECK(e < 2e-2, "%s n %d %s: batched %g from row by row", form, n, names[t], e);
            } else {
                CHECK(e == 0, "%s n %d %s: below %d rows not forward's (%g)", form, n, names[t], kMinRows, e);
            }
        }
    }
    // logits_rows against logits row by row.
    const int n = 18;
    std::vector<float> ha(h0.begin(), h0.begin() + n * s.hidden), hb = ha;
    std::vector<float> la(static_cast<size_t>(n) * kVocab), lb(la.size());
    one.layers->logits_rows(n, ha.data(), attn.data(), la.data(), best_isa());
    for (int i = 0; i < n; ++i) one.layers->logits(hb.data() + i * s.hidden, attn.data() + i * nq, lb.data() + i * kVocab, best_isa());
    CHECK(rel(la.data(), lb.data(), la.size()) < 2e-2, "%s: logits_rows %g from logits", form,
          rel(la.data(), lb.data(), la.size()));
    if (gemma) return;
    std::vector<float> q(nq);
    CHECK(throws<std::invalid_argument>([&] { one.layers->forward_rows(0, 1, ha.data(), attn.data(), cos.data(), sin.data(), q.data(), q.data(), q.data(), best_isa()); }),
          "layer 0 with an attention to finish");
    CHECK(throws<std::out_of_range>([&] { one.layers->forward_rows(2, 1, ha.data(), nullptr, cos.data(), sin.data(), q.data(), q.data(), q.data(), best_isa()); }),
          "a layer past the last");
    CHECK(throws<std::invalid_argument>([&] { one.layers->forward_rows(1, 0, ha.data(), attn.data(), cos.data(), sin.data(), q.data(), q.data(), q.data(), best_isa()); }),
          "no rows");
}

// A q8_0 head: the logits are its rows times the final norm of the finished last layer (logits
// leaves that layer's output in h), against float64; a chunk's logits_rows the rows' logits.
void q8_head_is_its_rows_times_the_final_norm() {
    Model m = make(2, false, true);
    const DecodeShape& s = m.shape;
    const size_t nq = static_cast<size_t>(s.n_heads) * s.head_dim;
    std::mt19937 rng(17);
    const int n = 18;
    const std::vector<float> h0 = random_vec(rng, n * s.hidden), attn = random_vec(rng, n * nq);
    std::vector<float> h = h0, out(static_cast<size_t>(n) * kVocab);
    for (int r = 0; r < n; ++r) m.layers->logits(h.data() + r * s.hidden, attn.data() + r * nq, out.data() + r * kVocab, best_isa());
    std::vector<float> x(s.hidden), values(static_cast<size_t>(kVocab) * s.hidden);
    for (int r = 0; r < kVocab; ++r) {
        const int32_t id = r;
        m.q8_rows->rows_of(&id, 1, values.data() + static_cast<size_t>(r) * s.hidden);
    }
    std::vector<float> ref(out.size());
    for (int t = 0; t < n; ++t) {
        const float* ht = h.data() + t * s.hidden;
        double ss = 0;
        for (int i = 0; i < s.hidden; ++i) ss += static_cast<double>(ht[i]) * ht[i];
        const double inv = 1.0 / std::sqrt(ss / s.hidden + s.rms_eps);
        for (int r = 0; r < kVocab; ++r) {
            double y = 0;
            for (int i = 0; i < s.hidden; ++i) y += ht[i] * inv * m.out_norm[i] * values[static_cast<size_t>(r) * s.hidden + i];
            ref[static_cast<size_t>(t) * kVocab + r] = static_cast<float>(y);
        }
    }
    const double e = rel(out.data(), ref.data(), out.size());
    CHECK(e < 1e-5, "q8 head: logits %g from the rows times the final norm (float64)", e);
    std::vector<float> hb = h0, rows(out.size());
    m.layers->logits_rows(n, hb.data(), attn.data(), rows.data(), best_isa());
    CHECK(rel(rows.data(), out.data(), out.size()) < 2e-2, "q8 head: logits_rows %g from logits",
          rel(rows.data(), out.data(), out.size()));
    CHECK(m.layers->vocab() == kVocab && m.layers->has_head(), "q8 head: vocab %d", m.layers->vocab());
    CHECK(throws<std::invalid_argument>([&] {
              m.layers->set_head(m.out_norm, std::make_shared<Q8Matrix>(kVocab, s.hidden + 32,
                                                                        random_codes(rng, kVocab * (s.hidden + 32)),
                                                                        random_scales(rng, kVocab * (s.hidden + 32) / kQ8Block), 1));
          }),
          "a q8 head of another width");
    CHECK(throws<std::invalid_argument>([&] { m.layers->set_head(m.out_norm, std::shared_ptr<const Q8Matrix>()); }),
          "no q8 head");
}

}  // namespace

int main() {
    form_refusals(make(1).shape);
    rows_against_forward(false);
    rows_against_forward(true);
    for (int threads : {1, 2})
        for (bool q8_head : {false, true}) one_call_is_the_layers_one_by_one(threads, q8_head);
    q8_head_is_its_rows_times_the_final_norm();
    std::printf("test_decode_layers: %s (best isa %s)\n", g_failures ? "FAILED" : "ok", isa_name(best_isa()));
    return g_failures != 0;
}
