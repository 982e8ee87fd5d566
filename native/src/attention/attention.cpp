// Attention dispatch: picks the kernel set of the requested ISA and splits the work over threads.
//
// Many query rows per kv head (prefill): tasks are (kv head, tile of rows); each tile is computed
// exactly by one kernel call. Few rows (decode): tasks are (kv head, key range); each produces an
// unnormalised softmax state that is merged here exactly, block scores included.
#include "mnn_h2o/attention/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "attention_kernels.h"
#include "mnn_h2o/runtime/team.h"

namespace mnn_h2o {

namespace {

constexpr int kMaxGroup = 64;      // query heads per kv head
constexpr int kMaxTileRows = 64;   // rows of a kernel set's prefill tile
constexpr size_t kSliceAlign = 16; // per-thread scratch slices start on 64-byte boundaries

// A prefill tile costs the same whatever its fill, and per query row the decode kernel costs about
// 1.3-1.4x a full tile row (measured with AVX-512 and AVX2 on Zen 4, 2k context). So tiles win
// once the rows fill at least this fraction of the tiles they need.
constexpr int kTileMinFillNum = 3, kTileMinFillDen = 4;

bool use_tiles(const AttentionProblem& p, int tile_rows) {
    const long long rows = static_cast<long long>(p.n_q) * p.group;
    const long long padded = (rows + tile_rows - 1) / tile_rows * tile_rows;
    return rows * kTileMinFillDen >= padded * kTileMinFillNum;
}

const kernels::KernelSet* kernel_set(Isa isa) {
    switch (isa) {
        case Isa::Scalar: return &kernels::scalar_kernels();
        case Isa::Avx2:
#if defined(MNN_H2O_HAVE_X86_KERNELS)
            if (cpu_features().avx2_f16c_fma) return &kernels::avx2_kernels();
#endif
            return nullptr;
        case Isa::Avx512:
#if defined(MNN_H2O_HAVE_X86_KERNELS)
            if (cpu_features().avx512) {
                if (cpu_features().avx512_bf16) return &kernels::avx512bf16_kernels();
                return cpu_features().avx512_vnni ? &kernels::avx512vnni_kernels() : &kernels::avx512_kernels();
            }
#endif
            return nullptr;
        case Isa::Neon:
#if defined(__aarch64__)
            if (cpu_features().neon) return &kernels::neon_kernels();
#endif
            return nullptr;
    }
    return nullptr;
}

const kernels::KernelSet& checked_kernel_set(Isa isa) {
    const kernels::KernelSet* set = kernel_set(isa);
    if (!set) throw std::invalid_argument(std::string("ISA '") + isa_name(isa) + "' is not available on this CPU/build");
    return *set;
}

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

void fail(const std::string& what) { throw std::invalid_argument("attention: " + what); }

void validate(const AttentionProblem& p) {
    if (p.n_kv_heads < 1) fail("n_kv_heads must be >= 1");
    if (p.group < 1 || p.group > kMaxGroup) fail("group must be in [1, " + std::to_string(kMaxGroup) + "]");
    if (p.head_dim < 16 || p.head_dim > 256 || p.head_dim % 16) fail("head_dim must be a multiple of 16 in [16, 256]");
    if (p.block_tokens < 16 || p.block_tokens % 16) fail("block_tokens must be a positive multiple of 16");
    if (!kv_dtype_valid(static_cast<int>(p.dtype))) fail("unknown dtype");
    const std::string shape_error = kv_dtype_shape_error(p.dtype, p.head_dim);
    if (!shape_error.empty()) fail(shape_error);
    if (!p.heads || !p.q || !p.out) fail("null heads, q or out");
    if (p.n_q < 1) fail("n_q must be >= 1");
    if (p.split_keys < 0 || p.split_kv_heads < 0) fail("split_keys and split_kv_heads must be >= 0");
    if (p.window < 0) fail("window must be >= 0, got " + std::to_string(p.window));
    if (p.window && p.block_scores) fail("a sliding window takes no scores (its keys are not evicted)");
    if (p.window_scores && !p.block_scores) fail("window_scores needs block_scores");
    if (p.block_max && !p.block_scores) fail("block_max needs block_scores");
    if (p.q8_rows && (kv_storage_dtype(p.dtype) != KvDtype::Q8 || p.n_q < 2))
        fail("q8_rows are for a q8 cache's prompt queries (attention_queries)");
    if (p.window_scores && (p.window_queries < 1 || p.window_queries > p.n_q))
        fail("window_queries must be in [1, n_q], got " + std::to_string(p.window_queries));
    for (int h = 0; h < p.n_kv_heads; ++h) {
        const KvHeadView& kv = p.heads[h];
        if (kv.n_keys < p.n_q)
            fail("kv head " + std::to_string(h) + " holds " + std::to_string(kv.n_keys) + " tokens, fewer than the " +
                 std::to_string(p.n_q) + " queries (append the new tokens before attending)");
        if (!kv.k_blocks || !kv.v_blocks) fail("null block list");
        if (p.block_scores && p.scores_stride < static_cast<size_t>((kv.n_keys + p.block_tokens - 1) / p.block_tokens))
            fail("scores_stride " + std::to_string(p.scores_stride) + " is smaller than the " +
                 std::to_string((kv.n_keys + p.block_tokens - 1) / p.block_tokens) + " blocks of kv head " +
                 std::to_string(h));
    }
    const size_t elems = static_cast<size_t>(p.n_q) * p.n_kv_heads * p.group * p.head_dim;
    const auto q0 = reinterpret_cast<uintptr_t>(p.q), o0 = reinterpret_cast<uintptr_t>(p.out);
    if (q0 < o0 + elems * sizeof(float) && o0 < q0 + elems * sizeof(float)) fail("out overlaps q");
}

int max_keys_of(const AttentionProblem& p) {
    int max_keys = 0;
    for (int h = 0; h < p.n_kv_heads; ++h) max_keys = std::max(max_keys, p.heads[h].n_keys);
    return max_keys;
}

int split_keys_of(const AttentionProblem& p) { return std::max(p.split_keys, max_keys_of(p)); }

long long query_keys(const AttentionProblem& p) { return static_cast<long long>(p.n_q) * split_keys_of(p); }

// The team, or nullptr where the tasks are better run one after the other on the caller.
Team* team_for(const AttentionProblem& p, Team* pool) {
    return pool && (pool->polling() || query_keys(p) >= kParallelMinQueryKeys) ? pool : nullptr;
}

template <class Fn>
void for_tasks(Team* pool, int n_tasks, const Fn& fn) {
    if (pool) pool->parallel_for(n_tasks, fn);
    else
        for (int t = 0; t < n_tasks; ++t) fn(t, 0);
}

void tiled(const AttentionProblem& p, const kernels::KernelSet& ks, const kernels::Shape& shape,
           const uint8_t* q8_rows, int n_threads, Team* pool, AttentionWorkspace& ws, KeySource* source) {
    const int G = p.group, hd = p.head_dim, n_heads = p.n_kv_heads * G, R = ks.tile_rows;
    if (R > kMaxTileRows) throw std::logic_error("attention: kernel tile larger than kMaxTileRows");
    const int rows_per_head = p.n_q * G;
    const int tiles_per_head = (rows_per_head + R - 1) / R;
    const int n_tasks = p.n_kv_heads * tiles_per_head;
    const int max_keys = max_keys_of(p);
    const int max_blocks = (max_keys + p.block_tokens - 1) / p.block_tokens;

    const size_t slice = round_up(ks.tile_scratch_floats(shape, max_blocks), kSliceAlign);
    if (ws.per_thread.size() < slice * n_threads) ws.per_thread.resize(slice * n_threads);
    if (p.block_scores) ws.tile_scores.assign(static_cast<size_t>(n_tasks) * max_blocks, 0.f);
    if (p.window_scores) ws.tile_window.assign(static_cast<size_t>(n_tasks) * max_blocks, 0.f);
    if (p.block_max) ws.tile_max.assign(static_cast<size_t>(n_tasks) * max_blocks, 0.f);
    // Rows are query-major (row = t * G + g), so the window's rows are the last ones of a head.
    const int window_row = p.window_scores ? (p.n_q - p.window_queries) * G : rows_per_head;
    const size_t q8_row_bytes = kv_row_bytes(KvDtype::Q8, hd);

    const auto run_tile = [&](int task, int thread) {
        const int h = task / tiles_per_head, r0 = task % tiles_per_head * R;
        const int n_rows = std::min(R, rows_per_head - r0);
        const float* q_rows[kMaxTileRows];
        const uint8_t* q8_row_ptrs[kMaxTileRows];
        float* out_rows[kMaxTileRows];
        int limits[kMaxTileRows], starts[kMaxTileRows];
        for (int i = 0; i < n_rows; ++i) {
            const int t = (r0 + i) / G, qh = h * G + (r0 + i) % G;
            const size_t offset = (static_cast<size_t>(t) * n_heads + qh) * hd;
            q_rows[i] = p.q + offset;
            if (q8_rows) q8_row_ptrs[i] = q8_rows + offset / hd * q8_row_bytes;
            out_rows[i] = p.out + offset;
            limits[i] = p.heads[h].n_keys - p.n_q + t + 1;
            starts[i] = p.window ? std::max(0, limits[i] - p.window) : 0;
        }
        const bool window = p.window_scores && r0 + n_rows > window_row;
        kernels::TileArgs args{shape,
                               &p.heads[h],
                               q_rows,
                               q8_rows ? q8_row_ptrs : nullptr,
                               out_rows,
                               limits,
                               n_rows,
                               ws.per_thread.data() + slice * thread,
                               p.block_scores ? ws.tile_scores.data() + static_cast<size_t>(task) * max_blocks : nullptr,
                               window ? ws.tile_window.data() + static_cast<size_t>(task) * max_blocks : nullptr,
                               std::max(0, window_row - r0),
                               p.block_max ? ws.tile_max.data() + static_cast<size_t>(task) * max_blocks : nullptr,
                               p.window ? starts : nullptr};
        ks.tile(args);
    };
    Team* tile_pool = team_for(p, pool);
    if (source) {
        for (int h = 0; h < p.n_kv_heads; ++h) {
            source->prepare(h, 0, p.heads[h].n_keys);
            for_tasks(tile_pool, tiles_per_head,
                      [&](int tile, int thread) { run_tile(h * tiles_per_head + tile, thread); });
        }
    } else {
        for_tasks(tile_pool, n_tasks, run_tile);
    }

    if (p.block_scores) {
        for (int task = 0; task < n_tasks; ++task) {
            float* dst = p.block_scores + static_cast<size_t>(task / tiles_per_head) * p.scores_stride;
            const float* src = ws.tile_scores.data() + static_cast<size_t>(task) * max_blocks;
            const int h_blocks = (p.heads[task / tiles_per_head].n_keys + p.block_tokens - 1) / p.block_tokens;
            for (int b = 0; b < h_blocks; ++b) dst[b] += src[b];
            if (p.block_max) {
                float* mdst = p.block_max + static_cast<size_t>(task / tiles_per_head) * p.scores_stride;
                const float* msrc = ws.tile_max.data() + static_cast<size_t>(task) * max_blocks;
                for (int b = 0; b < h_blocks; ++b) mdst[b] = std::max(mdst[b], msrc[b]);
            }
            if (!p.window_scores) continue;
            float* wdst = p.window_scores + static_cast<size_t>(task / tiles_per_head) * p.scores_stride;
            const float* wsrc = ws.tile_window.data() + static_cast<size_t>(task) * max_blocks;
            for (int b = 0; b < h_blocks; ++b) wdst[b] += wsrc[b];
        }
    }
}

void decoded(const AttentionProblem& p, const kernels::KernelSet& ks, const kernels::Shape& shape, int n_threads,
             Team* pool, AttentionWorkspace& ws, KeySource* source) {
    const int G = p.group, hd = p.head_dim, n_heads = p.n_kv_heads * G, bt = p.block_tokens;
    const int max_keys = split_keys_of(p);
    const int max_blocks = (max_keys + bt - 1) / bt;
    const long long products = query_keys(p) * std::max(p.split_kv_heads, p.n_kv_heads) * G * hd;
    const int splits = n_threads > 1 && products >= kSplitMinProducts ? std::min(n_threads, max_blocks) : 1;
    const int n_tasks = p.n_kv_heads * splits;
    // Split s of a head with nb blocks covers blocks [s*nb/splits, (s+1)*nb/splits).
    const auto split_begin = [&](int nb, int s) { return static_cast<int>(static_cast<long long>(nb) * s / splits); };
    const int max_split_keys = ((max_blocks + splits - 1) / splits) * bt;

    const size_t slice = round_up(ks.decode_scratch_floats(shape, G, max_split_keys), kSliceAlign);
    if (ws.per_thread.size() < slice * n_threads) ws.per_thread.resize(slice * n_threads);
    // Per (head, split, query, row): m, l and o, laid out as three arrays.
    const size_t n_states = static_cast<size_t>(n_tasks) * p.n_q * G;
    const size_t n_block_rows = static_cast<size_t>(p.n_kv_heads) * p.n_q * G;
    const size_t block_floats = n_block_rows * max_blocks;
    const size_t need = n_states * (2 + hd) + (p.block_scores ? block_floats : 0) + (p.block_max ? block_floats : 0);
    if (ws.partials.size() < need) ws.partials.resize(need);
    float* ms = ws.partials.data();
    float* ls = ms + n_states;
    float* os = ls + n_states;
    float* block_sums = os + n_states * hd;         // [head][query][row][block]
    float* block_peaks = block_sums + block_floats;  // the same layout (block_max)

    const auto split_keys = [&](int task, int* key_begin, int* key_end) {
        const int nb = (p.heads[task / splits].n_keys + bt - 1) / bt, s = task % splits;
        *key_begin = split_begin(nb, s) * bt;
        *key_end = std::min(split_begin(nb, s + 1) * bt, p.heads[task / splits].n_keys);
    };
    const auto run_split = [&](int task, int thread) {
        const int h = task / splits;
        const KvHeadView& kv = p.heads[h];
        int split_begin_key, key_end_split;
        split_keys(task, &split_begin_key, &key_end_split);
        const float* q_rows[kMaxGroup];
        for (int t = 0; t < p.n_q; ++t) {
            const size_t state = (static_cast<size_t>(task) * p.n_q + t) * G;
            const int visible = kv.n_keys - p.n_q + t + 1;
            const int key_end = std::min(key_end_split, visible);
            // A window's first key; the kernel's range starts at its block (key_begin stays a
            // multiple of block_tokens) and masks the keys before it.
            const int first = std::max(split_begin_key, p.window ? visible - p.window : 0);
            const int key_begin = std::max(split_begin_key, first / bt * bt);
            if (first >= key_end) {  // nothing of this split is visible
                for (int g = 0; g < G; ++g) {
                    ms[state + g] = -std::numeric_limits<float>::infinity();
                    ls[state + g] = 0.f;
                }
                continue;
            }
            for (int g = 0; g < G; ++g) q_rows[g] = p.q + (static_cast<size_t>(t) * n_heads + h * G + g) * hd;
            const size_t rows_at = ((static_cast<size_t>(h) * p.n_q + t) * G) * max_blocks + key_begin / bt;
            kernels::DecodeArgs args{shape,
                                     &kv,
                                     q_rows,
                                     G,
                                     key_begin,
                                     key_end,
                                     ws.per_thread.data() + slice * thread,
                                     ms + state,
                                     ls + state,
                                     os + state * hd,
                                     p.block_scores ? block_sums + rows_at : nullptr,
                                     static_cast<size_t>(max_blocks),
                                     p.block_max ? block_peaks + rows_at : nullptr,
                                     first};
            ks.decode(args);
        }
    };
    if (source) {
        // Threads would need every split's keys at once; one split at a time needs one's.
        for (int task = 0; task < n_tasks; ++task) {
            int key_begin, key_end;
            split_keys(task, &key_begin, &key_end);
            source->prepare(task / splits, key_begin, std::max(key_begin, key_end));
            run_split(task, 0);
        }
    } else {
        for_tasks(splits > 1 ? team_for(p, pool) : nullptr, n_tasks, run_split);
    }

    for (int h = 0; h < p.n_kv_heads; ++h) {
        const int nb = (p.heads[h].n_keys + bt - 1) / bt;
        for (int t = 0; t < p.n_q; ++t) {
            const int visible = p.heads[h].n_keys - p.n_q + t + 1;
            for (int g = 0; g < G; ++g) {
                const auto state = [&](int s) { return ((static_cast<size_t>(h) * splits + s) * p.n_q + t) * G + g; };
                float m = -std::numeric_limits<float>::infinity(), l = 0.f;
                for (int s = 0; s < splits; ++s) m = std::max(m, ms[state(s)]);
                for (int s = 0; s < splits; ++s)
                    if (ls[state(s)] > 0.f) l += ls[state(s)] * std::exp(ms[state(s)] - m);
                float* out = p.out + (static_cast<size_t>(t) * n_heads + h * G + g) * hd;
                std::fill(out, out + hd, 0.f);
                for (int s = 0; s < splits; ++s) {
                    if (!(ls[state(s)] > 0.f)) continue;  // empty range
                    const float f = std::exp(ms[state(s)] - m) / l;
                    const float* o = os + state(s) * hd;
                    for (int d = 0; d < hd; ++d) out[d] += f * o[d];
                    if (!p.block_scores) continue;
                    const int b_end = (std::min(split_begin(nb, s + 1) * bt, visible) + bt - 1) / bt;
                    const float* src = block_sums + ((static_cast<size_t>(h) * p.n_q + t) * G + g) * max_blocks;
                    float* dst = p.block_scores + static_cast<size_t>(h) * p.scores_stride;
                    for (int b = split_begin(nb, s); b < b_end; ++b) dst[b] += f * src[b];
                    if (p.block_max) {
                        const float* peak = block_peaks + ((static_cast<size_t>(h) * p.n_q + t) * G + g) * max_blocks;
                        float* mdst = p.block_max + static_cast<size_t>(h) * p.scores_stride;
                        for (int b = split_begin(nb, s); b < b_end; ++b) mdst[b] = std::max(mdst[b], f * peak[b]);
                    }
                    if (!p.window_scores || t < p.n_q - p.window_queries) continue;
                    float* wdst = p.window_scores + static_cast<size_t>(h) * p.scores_stride;
                    for (int b = split_begin(nb, s); b < b_end; ++b) wdst[b] += f * src[b];
                }
            }
        }
    }
}

}  // namespace

bool isa_available(Isa isa) { return kernel_set(isa) != nullptr; }

const char* attention_kernels_name(Isa isa) {
    const kernels::KernelSet* set = kernel_set(isa);
    return set ? set->name : nullptr;
}

void attention(const AttentionProblem& problem, Isa isa, Team* pool, AttentionWorkspace& ws, KeySource* source) {
    const kernels::KernelSet& ks = checked_kernel_set(isa);
    validate(problem);
    const kernels::Shape shape{problem.head_dim, problem.block_tokens, kv_storage_dtype(problem.dtype),
                               1.f / std::sqrt(static_cast<float>(problem.head_dim))};
    // The kernels read the rounded queries as floats; the VNNI tile reads their codes.
    AttentionProblem p = problem;
    if (!p.q8_rows) {
        p.q = attention_queries(shape.dtype, p.q, p.n_q, p.n_kv_heads * p.group, p.head_dim, ws.q8_rows, ws.q_rounded);
        if (p.q != problem.q) p.q8_rows = ws.q8_rows.data();
    }
    const uint8_t* q8_rows = p.q8_rows;
    const int n_threads = pool ? pool->size() : 1;
    if (use_tiles(p, ks.tile_rows)) tiled(p, ks, shape, q8_rows, n_threads, pool, ws, source);
    else decoded(p, ks, shape, n_threads, pool, ws, source);
}

// By the cache's own reference code, so that every ISA gets the same bytes.
const float* attention_queries(KvDtype dtype, const float* q, int n_q, int n_heads, int head_dim,
                               std::vector<uint8_t>& codes, std::vector<float>& rounded) {
    if (kv_storage_dtype(dtype) != KvDtype::Q8 || n_q < 2) return q;
    const size_t n_rows = static_cast<size_t>(n_q) * n_heads;
    codes.resize(n_rows * kv_row_bytes(KvDtype::Q8, head_dim));
    rounded.resize(n_rows * head_dim);
    kv_rows_from_f32(KvDtype::Q8, q, codes.data(), n_rows, head_dim);
    kv_rows_to_f32(KvDtype::Q8, codes.data(), rounded.data(), n_rows, head_dim);
    return rounded.data();
}

// Float types: the SIMD sets convert whole vectors of 16, and rows are multiples of 16 long.
// Quantised types: the reference code of kv_dtype.cpp on every ISA, so the codes are the same
// bytes everywhere (appending a token costs a few hundred ns of it per layer).
void convert_from_f32(Isa isa, KvDtype dtype, const float* src, void* dst, size_t n_rows, int head_dim) {
    const kernels::KernelSet& ks = checked_kernel_set(isa);
    const size_t n = n_rows * static_cast<size_t>(head_dim);
    if (kv_dtype_quantised(dtype) || n % 16) kv_rows_from_f32(dtype, src, dst, n_rows, head_dim);
    else ks.from_f32(dtype, src, dst, n);
}

void convert_to_f32(Isa isa, KvDtype dtype, const void* src, float* dst, size_t n_rows, int head_dim) {
    const kernels::KernelSet& ks = checked_kernel_set(isa);
    const size_t n = n_rows * static_cast<size_t>(head_dim);
    if (kv_dtype_quantised(dtype) || n % 16) kv_rows_to_f32(dtype, src, dst, n_rows, head_dim);
    else ks.to_f32(dtype, src, dst, n);
}

void rotate_rows(Isa isa, float* rows, size_t n_rows, int n) {
    if (n < 1 || (n & (n - 1))) throw std::invalid_argument("rotate_rows: n must be a power of two");
    checked_kernel_set(isa).hadamard(rows, n_rows, n, hadamard_scale(n));
}

}  // namespace mnn_h2o
