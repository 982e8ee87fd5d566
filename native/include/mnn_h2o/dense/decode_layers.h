// The decoder layers' dense math in our core, for one decode token or a prompt chunk's rows: what
// MNN's layer modules do (mnn_h2o/export.py, mnn_h2o/decoder_layer.py), on the GGUF's own blocks
// (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K: dense/weight_types.h).
//
// Why not MNN for decode: the wheel's int4 kernels are AVX2 only and spend much of a one-row
// product synchronising their threads (a layer module ~200 us at 512 tokens of context, 30 per
// token); here the products are VNNI / maddubs dot products (Q4Matrix, WeightMatrix) shared by a
// SpinTeam, so the dense part of a token takes about a third of MNN's (docs/results.md). For a
// prompt chunk (forward_rows) the products are batched (dense/batched_product.h): faster than
// MNN's modules on the measured models, and MNN's modules (its own int8 copy of the weights)
// need not be loaded at all.
//
// Layer i's call continues from where the engine's module i starts: it finishes layer i - 1 from
// its attention output (h += attn Wo; h += (SiLU(x Wgate) * x Wup) Wdown with x = RMSNorm(h)), then
// starts layer i (x = RMSNorm(h); q, k, v = x Wq, x Wk, x Wv (+ bias); RoPE on q and k, rotate-half).
// Gemma 3's form adds: q and k RMS-normed per head before RoPE (qk_norm), attn Wo and the MLP's
// output RMS-normed before their residual adds (post_norms), GELU (tanh) for SiLU (mlp geglu), and
// n_heads x head_dim apart from hidden (q_width heads). Its other options are the caller's: the
// embedding's scale, which RoPE table each layer's cos / sin come from, the window of its cache.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mnn_h2o/dense/batched_product.h"
#include "mnn_h2o/dense/weight_matrix.h"
#include "mnn_h2o/head/q8_matrix.h"
#include "mnn_h2o/runtime/cpu_features.h"
#include "mnn_h2o/runtime/spin_team.h"

namespace mnn_h2o {

// The decoder layer's options (mnn_h2o/architecture.py describes each architecture by them) and
// the values these layers implement: a model asking for another value is refused by name, never
// run with this layer's math.
struct LayerOption {
    const char* name;
    std::vector<std::string> values;
};
const std::vector<LayerOption>& decode_layer_options();

struct DecodeShape {
    int hidden = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, ffn = 0;
    float rms_eps = 1e-5f;
    // Every option of decode_layer_options() by name ("qkv_bias" -> "true"); qkv_bias true: every
    // layer has one bias per qkv row, false: none.
    std::map<std::string, std::string> form;
};

struct DecodeLayerWeights {
    std::vector<float> attn_norm, ffn_norm;  // [hidden]
    WeightMatrix qkv;                        // [(n_heads + 2 n_kv_heads) head_dim, hidden]: q, k, v rows
    std::vector<float> qkv_bias;             // empty, or one per qkv row
    WeightMatrix wo;                         // [hidden, n_heads head_dim]
    WeightMatrix gate, up;                   // [ffn, hidden]
    WeightMatrix down;                       // [hidden, ffn]
    std::vector<float> q_norm, k_norm;                // qk_norm true: [head_dim] each; else empty
    std::vector<float> post_attn_norm, post_ffn_norm;  // post_norms true: [hidden] each; else empty
};

class DecodeLayers {
public:
    // Throws std::invalid_argument on a shape that does not fit (every matrix and vector checked),
    // or a form with an option missing, unknown or of a value not implemented (naming it).
    DecodeLayers(DecodeShape shape, std::vector<DecodeLayerWeights> layers, int n_threads);

    int n_layers() const { return static_cast<int>(layers_.size()); }
    const DecodeShape& shape() const { return shape_; }
    size_t bytes() const;  // the weights held
    // The threads of the products; a decode token lends them to the cache's attention too
    // (model/decode_token.h).
    SpinTeam& team() { return team_; }

    // One token through layer i's module: if attn (layer i - 1's attention output, n_heads x
    // head_dim) is given, finishes layer i - 1 into h first (i > 0); then layer i's q (n_heads x
    // head_dim), k and v (n_kv_heads x head_dim) from h, q and k rotated by cos / sin (head_dim
    // each, the token's position). h is [hidden], updated in place. rest: the team's workers sleep
    // after the call; false keeps them polling for the next call (decode_token, whose attention
    // runs on this team too). Not for concurrent calls.
    void forward(int i, float* h, const float* attn, const float* cos, const float* sin, float* q, float* k,
                 float* v, Isa isa, bool rest);

    // The output end on the same team: the final norm's weights and the [vocab, hidden] output
    // matrix, as GGUF blocks (a k-quant: the activation rounded as the layers round it) or as
    // q8_0 rows times the float activation (head/q8_matrix.h: a Q8_0 output matrix, whose rows
    // the caller may read a tied embedding from; at the head an activation's rounding reaches the
    // logits directly, and a Q8_0 row's signed codes have no centre to take its error at). Throws
    // std::invalid_argument on a shape that does not fit.
    void set_head(std::vector<float> out_norm, WeightMatrix head);
    void set_head(std::vector<float> out_norm, std::shared_ptr<const Q8Matrix> head);
    bool has_head() const { return vocab() > 0; }
    // Whether a matrix (the head included) is held as k-quant blocks.
    bool reads_kquant() const { return xq_.kquant_form || attn_q_.kquant_form || act_q_.kquant_form; }
    int vocab() const { return q8_head_ ? q8_head_->rows() : head_.rows(); }
    // The last layer's end from its attention output (into h, in place), the final norm and the
    // logits (vocab values): a token's tail and lm_head in one call. The workers rest after it.
    void logits(float* h, const float* attn, float* out, Isa isa);

    // A prompt chunk of n tokens through layer i's module, as forward does for each row: h
    // [n][hidden], attn (or nullptr) [n][n_heads head_dim], cos and sin [n][head_dim] (each
    // row's position), q [n][n_heads head_dim], k and v [n][n_kv_heads head_dim]. From kMinRows
    // rows the products are batched (dense/batched_product.h: the weights' integers unpacked once
    // for every row, each activation row rounded once to int8 per block of 32); below, each row
    // takes forward's one-row products. The
    // workers rest after the call (the chunk's attention uses its own threads).
    void forward_rows(int i, int n, float* h, const float* attn, const float* cos, const float* sin, float* q,
                      float* k, float* v, Isa isa);
    // logits for n rows (out [n][vocab]), batched as forward_rows is.
    void logits_rows(int n, float* h, const float* attn, float* out, Isa isa);

private:
    void finish(int layer, float* h, const float* attn, Isa isa);
    void finish_rows(int layer, int n, float* h, const float* attn, Isa isa);
    void start_rows(int layer, int n, const float* h, const float* cos, const float* sin, float* q, float* k,
                    float* v, Isa isa);
    // y [n][m.rows()] = x m^T for the rows of x, the rows of m split into tasks on the team.
    void product_rows(const WeightMatrix& m, const Q8Rows& x, float* y, Isa isa);
    // n rows of cols values (row i at x + i * cols) rounded once per block into out, on the team.
    void quantize_rows(const float* x, int n, int cols, Q8Rows& out);
    void grow_rows(int n);  // the chunk scratch below for n rows
    void start(int layer, const float* h, const float* cos, const float* sin, float* q, float* k, float* v,
               Isa isa);
    void rms_norm(const float* h, const std::vector<float>& w, float* out) const;
    // One row's q, k, v from its qkv product: q and k per-head normed (qk_norm), then rotated.
    void split_qkv(const DecodeLayerWeights& w, const float* qkv, const float* cos, const float* sin, float* q,
                   float* k, float* v) const;
    // Rows per task of a product of `rows` rows split into per_thread tasks a thread: a multiple of unit.
    int task_rows(int rows, int unit, int per_thread) const;
    // y = m x, its rows split into tasks on the team.
    void product(const WeightMatrix& m, const Q8Activation& x, float* y, Isa isa);
    // The output matrix's logits of n final-normed rows x [n][hidden] into y [n][vocab], on the team.
    void head_product(const float* x, int n, float* y, Isa isa);
    // The final norm has hidden values, the output matrix [rows > 0, hidden]: else invalid_argument.
    void check_head_shape(const std::vector<float>& out_norm, int rows, int cols) const;

    DecodeShape shape_;
    bool geglu_ = false, qk_norm_ = false, post_norms_ = false;  // from shape_.form
    std::vector<DecodeLayerWeights> layers_;
    std::vector<float> out_norm_;
    WeightMatrix head_;
    std::shared_ptr<const Q8Matrix> q8_head_;  // or this (set_head)
    SpinTeam team_;
    // Scratch for one token (hence no concurrent calls).
    std::vector<float> x_, y_, qkv_, gate_, up_, act_;
    Q8Activation xq_, attn_q_, act_q_;
    // Scratch for one prompt chunk, grown to the largest chunk seen: [n][hidden] twice,
    // [n][qkv rows], [n][ffn] twice.
    int rows_capacity_ = 0;
    std::vector<float> xs_, ys_, qkvs_, gates_, ups_;
    Q8Rows x_rows_, attn_rows_, act_rows_;
};

}  // namespace mnn_h2o
