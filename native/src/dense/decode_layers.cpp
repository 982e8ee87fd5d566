#include "mnn_h2o/dense/decode_layers.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "../runtime/exp_polynomial.h"

namespace mnn_h2o {

namespace {

// Tasks per thread of each product. One: each thread streams its half of the rows contiguously.
// The products are memory bound; tasks of 64 rows handed out in turn made the threads' streams
// jump (1.7x slower per token here, 2 to 4 tasks per thread 7-20% slower). A worker that is not
// awake costs nothing but its share: the caller takes its task too.
constexpr int kTasksPerThread = 1;
// A prompt chunk's products are compute bound and each 16-row panel is unpacked once whatever the
// task: many small tasks, taken in turn, let a thread that ran faster (the other vCPU stolen by
// the host, a panel of Q6_K rows) take more. With one task per thread the caller waited for the
// worker ~16% of its time in a 1.5B prompt (perf, 2048 tokens).
constexpr int kPromptTasksPerThread = 8;

void check(bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("DecodeLayers: " + what);
}

void check_matrix(const WeightMatrix& m, int rows, int cols, const std::string& name) {
    check(m.rows() == rows && m.cols() == cols, name + " is [" + std::to_string(m.rows()) + ", " +
                                                    std::to_string(m.cols()) + "], the shape needs [" +
                                                    std::to_string(rows) + ", " + std::to_string(cols) + "]");
}

// 1 / RMS of n values (the norm's scale before its weights), in the order rms_norm sums them.
float inv_rms(const float* x, int n, float eps) {
    float ss = 0.f;
    for (int i = 0; i < n; ++i) ss += x[i] * x[i];
    return 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
}

// heads rows of hd values from in to out, each RMS-normed by norm (or, empty, copied), then
// rotated (rotate-half) by cos / sin in place.
void norm_rope_heads(const float* in, float* out, int heads, int hd, const std::vector<float>& norm, float eps,
                     const float* cos, const float* sin) {
    const int half = hd / 2;
    for (int hh = 0; hh < heads; ++hh) {
        const float* x = in + hh * hd;
        float* o = out + hh * hd;
        if (norm.empty()) {
            std::copy(x, x + hd, o);
        } else {
            const float inv = inv_rms(x, hd, eps);
            for (int j = 0; j < hd; ++j) o[j] = x[j] * inv * norm[static_cast<size_t>(j)];
        }
        for (int j = 0; j < half; ++j) {
            const float a = o[j], b = o[j + half];
            o[j] = a * cos[j] - b * sin[j];
            o[j + half] = b * cos[j + half] + a * sin[j + half];
        }
    }
}

// exp(x), clamped to [-87, 88] (enough for SiLU: past it the sigmoid is 0 or 1 in float), by
// runtime/exp_polynomial.h. No call and no branch, so the loops that call it vectorise (libm's
// expf was 5% of a 1.5B prompt, one call a value).
inline float exp_clamped(float x) {
    namespace e = exp_polynomial;
    constexpr float kRound = 12582912.f;  // 1.5 * 2^23: adding and subtracting rounds to an integer
    x = std::min(88.f, std::max(-87.f, x));
    const float n = (x * e::kLog2e + kRound) - kRound;
    const float r = (x - n * e::kLn2High) + n * e::kLn2Low;
    float p = e::kP[0];
    for (int i = 1; i < 6; ++i) p = p * r + e::kP[i];
    const float y = p * r * r + (r + 1.f);
    const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in [-126, 127]
    float scale;
    std::memcpy(&scale, &bits, 4);
    return y * scale;
}

float silu_times(float g, float u) { return g / (1.f + exp_clamped(-g)) * u; }

// GELU's tanh approximation times u; tanh(t) = 1 - 2 / (exp(2t) + 1), which the clamped exp keeps
// finite at both ends (-1 and 1).
float gelu_times(float g, float u) {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    const float t = kSqrt2OverPi * (g + 0.044715f * g * g * g);
    const float tanh_t = 1.f - 2.f / (exp_clamped(2.f * t) + 1.f);
    return 0.5f * g * (1.f + tanh_t) * u;
}

// out[j] = SiLU(g[j]) * u[j], or GELU(g[j]) * u[j] (geglu), j < n; out may be g. One loop per
// function, so each vectorises without a branch inside.
void gate_values(bool geglu, int n, const float* g, const float* u, float* out) {
    if (geglu) {
        for (int j = 0; j < n; ++j) out[j] = gelu_times(g[j], u[j]);
    } else {
        for (int j = 0; j < n; ++j) out[j] = silu_times(g[j], u[j]);
    }
}

}  // namespace

const std::vector<LayerOption>& decode_layer_options() {
    // embedding_scale, global_every and local_rope_base are the caller's (the embedding, the RoPE
    // table each layer's cos / sin come from, the cache's window): listed here with the values
    // the engine implements, so the export refuses these layers for a model it cannot run.
    static const std::vector<LayerOption> options = {
        {"qkv_bias", {"false", "true"}}, {"norm", {"rms"}}, {"mlp", {"swiglu", "geglu"}}, {"qk_norm", {"false", "true"}},
        {"post_norms", {"false", "true"}}, {"q_width", {"hidden", "heads"}}, {"embedding_scale", {"none", "sqrt_hidden"}},
        {"global_every", {"0", "6"}}, {"local_rope_base", {"0.0", "10000.0"}},
    };
    return options;
}

DecodeLayers::DecodeLayers(DecodeShape shape, std::vector<DecodeLayerWeights> layers, int n_threads)
    : shape_(shape), layers_(std::move(layers)), team_(n_threads) {
    const DecodeShape& s = shape_;
    for (const LayerOption& o : decode_layer_options()) {
        const auto it = s.form.find(o.name);
        check(it != s.form.end(), std::string("the layer's form has no ") + o.name);
        bool known = false;
        for (const std::string& v : o.values) known = known || v == it->second;
        check(known, std::string("these layers do not implement ") + o.name + " " + it->second);
    }
    for (const auto& kv : s.form) {
        bool known = false;
        for (const LayerOption& o : decode_layer_options()) known = known || kv.first == o.name;
        check(known, "these layers do not implement the option " + kv.first);
    }
    const bool bias = s.form.at("qkv_bias") == "true";
    geglu_ = s.form.at("mlp") == "geglu";
    qk_norm_ = s.form.at("qk_norm") == "true";
    post_norms_ = s.form.at("post_norms") == "true";
    check(s.hidden > 0 && s.n_heads > 0 && s.n_kv_heads > 0 && s.head_dim > 0 && s.ffn > 0 && s.rms_eps > 0.f,
          "every size and the epsilon must be positive");
    check(s.head_dim % 2 == 0 && s.n_heads % s.n_kv_heads == 0, "head_dim must be even, n_heads a multiple of n_kv_heads");
    check(s.hidden % kQ4Block == 0 && s.ffn % kQ4Block == 0 && (s.n_heads * s.head_dim) % kQ4Block == 0,
          "hidden, ffn and n_heads * head_dim must be multiples of 32");
    check(s.form.at("q_width") == "heads" || s.n_heads * s.head_dim == s.hidden,
          "q_width hidden needs n_heads * head_dim == hidden");
    check(!layers_.empty(), "no layers");
    const int qkv_rows = (s.n_heads + 2 * s.n_kv_heads) * s.head_dim;
    for (size_t i = 0; i < layers_.size(); ++i) {
        const DecodeLayerWeights& w = layers_[i];
        const std::string l = "layer " + std::to_string(i) + ": ";
        check(w.attn_norm.size() == static_cast<size_t>(s.hidden) && w.ffn_norm.size() == static_cast<size_t>(s.hidden),
              l + "norms must have hidden values");
        check_matrix(w.qkv, qkv_rows, s.hidden, l + "qkv");
        check(w.qkv_bias.size() == (bias ? static_cast<size_t>(qkv_rows) : 0u),
              l + (bias ? "qkv_bias must have one value per qkv row" : "qkv_bias given where the form has none"));
        check_matrix(w.wo, s.hidden, s.n_heads * s.head_dim, l + "wo");
        check_matrix(w.gate, s.ffn, s.hidden, l + "gate");
        check_matrix(w.up, s.ffn, s.hidden, l + "up");
        check_matrix(w.down, s.hidden, s.ffn, l + "down");
        const size_t hd = qk_norm_ ? static_cast<size_t>(s.head_dim) : 0u, hid = post_norms_ ? static_cast<size_t>(s.hidden) : 0u;
        check(w.q_norm.size() == hd && w.k_norm.size() == hd,
              l + (qk_norm_ ? "q_norm and k_norm must have head_dim values" : "q_norm / k_norm given where qk_norm is false"));
        check(w.post_attn_norm.size() == hid && w.post_ffn_norm.size() == hid,
              l + (post_norms_ ? "post_attn_norm and post_ffn_norm must have hidden values"
                               : "post norms given where post_norms is false"));
    }
    // Each activation gets the k-quant form only where a k-quant matrix reads it, the pair form
    // only where a Q4 / Q5_0 / Q8_0 one does, and a prompt chunk's rows their second rounding only
    // where a Q4_0 / Q4_1 one does.
    xq_.kquant_form = attn_q_.kquant_form = act_q_.kquant_form = false;
    xq_.pair_form = attn_q_.pair_form = act_q_.pair_form = false;
    x_rows_.residual = attn_rows_.residual = act_rows_.residual = false;
    for (const DecodeLayerWeights& w : layers_) {
        for (const WeightMatrix* m : {&w.qkv, &w.gate, &w.up}) {
            xq_.kquant_form = xq_.kquant_form || m->reads_kquant_form();
            xq_.pair_form = xq_.pair_form || m->reads_pair_form();
            x_rows_.residual = x_rows_.residual || m->reads_twice_rounded();
        }
        attn_q_.kquant_form = attn_q_.kquant_form || w.wo.reads_kquant_form();
        attn_q_.pair_form = attn_q_.pair_form || w.wo.reads_pair_form();
        attn_rows_.residual = attn_rows_.residual || w.wo.reads_twice_rounded();
        act_q_.kquant_form = act_q_.kquant_form || w.down.reads_kquant_form();
        act_q_.pair_form = act_q_.pair_form || w.down.reads_pair_form();
        act_rows_.residual = act_rows_.residual || w.down.reads_twice_rounded();
    }
    x_.resize(static_cast<size_t>(s.hidden));
    y_.resize(static_cast<size_t>(s.hidden));
    qkv_.resize(static_cast<size_t>(qkv_rows));
    gate_.resize(static_cast<size_t>(s.ffn));
    up_.resize(static_cast<size_t>(s.ffn));
    act_.resize(static_cast<size_t>(s.ffn));
    xq_.resize(s.hidden);
    attn_q_.resize(s.n_heads * s.head_dim);
    act_q_.resize(s.ffn);
}

size_t DecodeLayers::bytes() const {
    size_t n = head_.bytes() + (q8_head_ ? q8_head_->bytes() : 0) + out_norm_.size() * sizeof(float);
    for (const DecodeLayerWeights& w : layers_)
        n += w.qkv.bytes() + w.wo.bytes() + w.gate.bytes() + w.up.bytes() + w.down.bytes() +
             (w.attn_norm.size() + w.ffn_norm.size() + w.qkv_bias.size() + w.q_norm.size() + w.k_norm.size() +
              w.post_attn_norm.size() + w.post_ffn_norm.size()) * sizeof(float);
    return n;
}

void DecodeLayers::check_head_shape(const std::vector<float>& out_norm, int rows, int cols) const {
    check(out_norm.size() == static_cast<size_t>(shape_.hidden), "the final norm must have hidden values");
    check(rows > 0 && cols == shape_.hidden, "the output matrix is [" + std::to_string(rows) + ", " +
                                                 std::to_string(cols) + "], the shape needs [vocab, " +
                                                 std::to_string(shape_.hidden) + "]");
}

void DecodeLayers::set_head(std::vector<float> out_norm, WeightMatrix head) {
    check_head_shape(out_norm, head.rows(), head.cols());
    out_norm_ = std::move(out_norm);
    head_ = std::move(head);
    q8_head_.reset();
    x_rows_.residual = x_rows_.residual || head_.reads_twice_rounded();  // it reads a chunk's final norms too
    // The head reads the final norm's activation: it gets the forms the head reads too.
    const bool kquant = xq_.kquant_form || head_.reads_kquant_form(), pair = xq_.pair_form || head_.reads_pair_form();
    if (kquant != xq_.kquant_form || pair != xq_.pair_form) {
        xq_.kquant_form = kquant;
        xq_.pair_form = pair;
        xq_.resize(shape_.hidden);
    }
}

void DecodeLayers::set_head(std::vector<float> out_norm, std::shared_ptr<const Q8Matrix> head) {
    check(head != nullptr, "no output matrix");
    check_head_shape(out_norm, head->rows(), head->cols());
    out_norm_ = std::move(out_norm);
    head_ = WeightMatrix();
    q8_head_ = std::move(head);
}

void DecodeLayers::head_product(const float* x, int n, float* y, Isa isa) {
    if (q8_head_) {
        const Q8Matrix& m = *q8_head_;
        const int rows = m.rows(), step = task_rows(rows, kQ4Block, kTasksPerThread);
        team_.run((rows + step - 1) / step, [&](int task) {
            const int r0 = task * step;
            m.multiply_rows(x, n, r0, std::min(rows, r0 + step), y, isa);
        });
        return;
    }
    if (n == 1) {
        xq_.quantize(x, shape_.hidden);
        product(head_, xq_, y, isa);
        return;
    }
    quantize_rows(x, n, shape_.hidden, x_rows_);
    product_rows(head_, x_rows_, y, isa);
}

void DecodeLayers::logits(float* h, const float* attn, float* out, Isa isa) {
    if (!has_head()) throw std::invalid_argument("DecodeLayers::logits: no output matrix (set_head)");
    finish(n_layers() - 1, h, attn, isa);
    rms_norm(h, out_norm_, x_.data());
    head_product(x_.data(), 1, out, isa);
    team_.rest();
}

void DecodeLayers::rms_norm(const float* h, const std::vector<float>& w, float* out) const {
    const int n = shape_.hidden;
    const float inv = inv_rms(h, n, shape_.rms_eps);
    for (int i = 0; i < n; ++i) out[i] = h[i] * inv * w[static_cast<size_t>(i)];
}

void DecodeLayers::split_qkv(const DecodeLayerWeights& w, const float* qkv, const float* cos, const float* sin,
                             float* q, float* k, float* v) const {
    const DecodeShape& s = shape_;
    const int nq = s.n_heads * s.head_dim, nk = s.n_kv_heads * s.head_dim;
    norm_rope_heads(qkv, q, s.n_heads, s.head_dim, w.q_norm, s.rms_eps, cos, sin);
    norm_rope_heads(qkv + nq, k, s.n_kv_heads, s.head_dim, w.k_norm, s.rms_eps, cos, sin);
    std::copy(qkv + nq + nk, qkv + nq + 2 * nk, v);
}

int DecodeLayers::task_rows(int rows, int unit, int per_thread) const {
    const int tasks = per_thread * team_.size();
    return (rows + tasks * unit - 1) / (tasks * unit) * unit;  // whole units
}

void DecodeLayers::product(const WeightMatrix& m, const Q8Activation& x, float* y, Isa isa) {
    const int rows = m.rows(), step = task_rows(rows, kQ4Block, kTasksPerThread);
    team_.run((rows + step - 1) / step, [&](int task) {
        const int r0 = task * step;
        const int r1 = std::min(rows, r0 + step);
        m.multiply_rows(x, r0, r1, y + r0, isa);
    });
}

void DecodeLayers::finish(int layer, float* h, const float* attn, Isa isa) {
    const DecodeShape& s = shape_;
    const DecodeLayerWeights& w = layers_[static_cast<size_t>(layer)];
    attn_q_.quantize(attn, s.n_heads * s.head_dim);
    product(w.wo, attn_q_, y_.data(), isa);
    if (post_norms_) rms_norm(y_.data(), w.post_attn_norm, y_.data());
    for (int i = 0; i < s.hidden; ++i) h[i] += y_[static_cast<size_t>(i)];
    rms_norm(h, w.ffn_norm, x_.data());
    xq_.quantize(x_.data(), s.hidden);
    // Gate and up rows of a task meet in SiLU(gate) * up, and the task rounds its own blocks of
    // that product, so the down projection's input is ready when the last task ends: whole blocks
    // of 32, and whole super-blocks of 256 where the row has the activation's k-quant form (each
    // is rounded from its 256 values at once: q4_matrix.h).
    const int ffn = s.ffn, step = task_rows(ffn, act_q_.seq_codes.empty() ? kQ4Block : 256, kTasksPerThread);
    team_.run((ffn + step - 1) / step, [&](int task) {
        const int r0 = task * step;
        const int r1 = std::min(ffn, r0 + step);
        w.gate.multiply_rows(xq_, r0, r1, gate_.data() + r0, isa);
        w.up.multiply_rows(xq_, r0, r1, up_.data() + r0, isa);
        gate_values(geglu_, r1 - r0, gate_.data() + r0, up_.data() + r0, act_.data() + r0);
        act_q_.quantize_blocks(act_.data(), r0 / kQ4Block, r1 / kQ4Block);
    });
    product(w.down, act_q_, y_.data(), isa);
    if (post_norms_) rms_norm(y_.data(), w.post_ffn_norm, y_.data());
    for (int i = 0; i < s.hidden; ++i) h[i] += y_[static_cast<size_t>(i)];
}

void DecodeLayers::start(int layer, const float* h, const float* cos, const float* sin, float* q, float* k,
                         float* v, Isa isa) {
    const DecodeShape& s = shape_;
    const DecodeLayerWeights& w = layers_[static_cast<size_t>(layer)];
    rms_norm(h, w.attn_norm, x_.data());
    xq_.quantize(x_.data(), s.hidden);
    product(w.qkv, xq_, qkv_.data(), isa);
    if (!w.qkv_bias.empty())
        for (size_t i = 0; i < qkv_.size(); ++i) qkv_[i] += w.qkv_bias[i];
    split_qkv(w, qkv_.data(), cos, sin, q, k, v);
}

void DecodeLayers::forward(int i, float* h, const float* attn, const float* cos, const float* sin, float* q,
                           float* k, float* v, Isa isa, bool rest) {
    if (i < 0 || i >= n_layers()) throw std::out_of_range("DecodeLayers::forward: layer " + std::to_string(i));
    if (attn != nullptr) {
        if (i == 0) throw std::invalid_argument("DecodeLayers::forward: layer 0 has no previous layer to finish");
        finish(i - 1, h, attn, isa);
    }
    start(i, h, cos, sin, q, k, v, isa);
    if (rest) team_.rest();
}

// --- a prompt chunk ------------------------------------------------------------------------------

void DecodeLayers::grow_rows(int n) {
    if (n <= rows_capacity_) return;
    const DecodeShape& s = shape_;
    const size_t rows = static_cast<size_t>(n);
    xs_.resize(rows * s.hidden);
    ys_.resize(rows * s.hidden);
    qkvs_.resize(rows * (s.n_heads + 2 * s.n_kv_heads) * s.head_dim);
    gates_.resize(rows * s.ffn);
    ups_.resize(rows * s.ffn);
    rows_capacity_ = n;
}

void DecodeLayers::quantize_rows(const float* x, int n, int cols, Q8Rows& out) {
    out.resize(n, cols);
    const int step = (n + team_.size() - 1) / team_.size();
    team_.run((n + step - 1) / step, [&](int task) {
        out.quantize_rows(x, cols, task * step, std::min(n, (task + 1) * step));
    });
}

void DecodeLayers::product_rows(const WeightMatrix& m, const Q8Rows& x, float* y, Isa isa) {
    const int rows = m.rows(), step = task_rows(rows, kPanelRows, kPromptTasksPerThread);
    team_.run((rows + step - 1) / step, [&](int task) {
        const int r0 = task * step;
        multiply_batch(m, x, r0, std::min(rows, r0 + step), y, rows, isa);
    });
}

void DecodeLayers::finish_rows(int layer, int n, float* h, const float* attn, Isa isa) {
    const DecodeShape& s = shape_;
    const DecodeLayerWeights& w = layers_[static_cast<size_t>(layer)];
    const size_t hid = static_cast<size_t>(s.hidden), ffn = static_cast<size_t>(s.ffn);
    quantize_rows(attn, n, s.n_heads * s.head_dim, attn_rows_);
    product_rows(w.wo, attn_rows_, ys_.data(), isa);
    if (post_norms_)
        for (int r = 0; r < n; ++r) rms_norm(ys_.data() + r * hid, w.post_attn_norm, ys_.data() + r * hid);
    for (size_t i = 0; i < static_cast<size_t>(n) * hid; ++i) h[i] += ys_[i];
    for (int r = 0; r < n; ++r) rms_norm(h + r * hid, w.ffn_norm, xs_.data() + r * hid);
    quantize_rows(xs_.data(), n, s.hidden, x_rows_);
    // Gate and up rows of a task meet in SiLU(gate) * up (or GELU) for every token (into gates_).
    const int step = task_rows(s.ffn, kPanelRows, kPromptTasksPerThread);
    team_.run((s.ffn + step - 1) / step, [&](int task) {
        const int r0 = task * step, r1 = std::min(s.ffn, r0 + step);
        multiply_batch(w.gate, x_rows_, r0, r1, gates_.data(), s.ffn, isa);
        multiply_batch(w.up, x_rows_, r0, r1, ups_.data(), s.ffn, isa);
        for (int r = 0; r < n; ++r) {
            const size_t at = static_cast<size_t>(r) * ffn + static_cast<size_t>(r0);
            gate_values(geglu_, r1 - r0, gates_.data() + at, ups_.data() + at, gates_.data() + at);
        }
    });
    quantize_rows(gates_.data(), n, s.ffn, act_rows_);
    product_rows(w.down, act_rows_, ys_.data(), isa);
    if (post_norms_)
        for (int r = 0; r < n; ++r) rms_norm(ys_.data() + r * hid, w.post_ffn_norm, ys_.data() + r * hid);
    for (size_t i = 0; i < static_cast<size_t>(n) * hid; ++i) h[i] += ys_[i];
}

void DecodeLayers::start_rows(int layer, int n, const float* h, const float* cos, const float* sin, float* q,
                              float* k, float* v, Isa isa) {
    const DecodeShape& s = shape_;
    const DecodeLayerWeights& w = layers_[static_cast<size_t>(layer)];
    const size_t hid = static_cast<size_t>(s.hidden), hd = static_cast<size_t>(s.head_dim);
    const size_t nq = s.n_heads * hd, nk = s.n_kv_heads * hd, width = nq + 2 * nk;
    for (int r = 0; r < n; ++r) rms_norm(h + r * hid, w.attn_norm, xs_.data() + r * hid);
    quantize_rows(xs_.data(), n, s.hidden, x_rows_);
    product_rows(w.qkv, x_rows_, qkvs_.data(), isa);
    for (int r = 0; r < n; ++r) {
        float* row = qkvs_.data() + r * width;
        if (!w.qkv_bias.empty())
            for (size_t j = 0; j < width; ++j) row[j] += w.qkv_bias[j];
        split_qkv(w, row, cos + r * hd, sin + r * hd, q + r * nq, k + r * nk, v + r * nk);
    }
}

void DecodeLayers::forward_rows(int i, int n, float* h, const float* attn, const float* cos, const float* sin,
                                float* q, float* k, float* v, Isa isa) {
    if (i < 0 || i >= n_layers()) throw std::out_of_range("DecodeLayers::forward_rows: layer " + std::to_string(i));
    if (n < 1) throw std::invalid_argument("DecodeLayers::forward_rows: no rows");
    if (attn != nullptr && i == 0)
        throw std::invalid_argument("DecodeLayers::forward_rows: layer 0 has no previous layer to finish");
    const DecodeShape& s = shape_;
    const size_t hid = static_cast<size_t>(s.hidden), hd = static_cast<size_t>(s.head_dim);
    const size_t nq = s.n_heads * hd, nk = s.n_kv_heads * hd;
    if (n < kMinRows) {
        for (int r = 0; r < n; ++r)
            forward(i, h + r * hid, attn != nullptr ? attn + r * nq : nullptr, cos + r * hd, sin + r * hd, q + r * nq,
                    k + r * nk, v + r * nk, isa, false);
    } else {
        grow_rows(n);
        if (attn != nullptr) finish_rows(i - 1, n, h, attn, isa);
        start_rows(i, n, h, cos, sin, q, k, v, isa);
    }
    team_.rest();
}

void DecodeLayers::logits_rows(int n, float* h, const float* attn, float* out, Isa isa) {
    if (!has_head()) throw std::invalid_argument("DecodeLayers::logits_rows: no output matrix (set_head)");
    if (n < 1) throw std::invalid_argument("DecodeLayers::logits_rows: no rows");
    const DecodeShape& s = shape_;
    const size_t hid = static_cast<size_t>(s.hidden), nq = static_cast<size_t>(s.n_heads * s.head_dim);
    const size_t vocab = static_cast<size_t>(this->vocab());
    if (n < kMinRows) {
        for (int r = 0; r < n; ++r) logits(h + r * hid, attn + r * nq, out + r * vocab, isa);
        return;
    }
    grow_rows(n);
    finish_rows(n_layers() - 1, n, h, attn, isa);
    for (int r = 0; r < n; ++r) rms_norm(h + r * hid, out_norm_, xs_.data() + r * hid);
    head_product(xs_.data(), n, out, isa);
    team_.rest();
}

}  // namespace mnn_h2o
