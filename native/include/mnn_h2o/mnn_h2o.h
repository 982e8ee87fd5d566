/* mnn_h2o C API: the native core (KV cache with its attention op, Gear codec) for C, C++, JNI or
 * any FFI, without Python.
 *
 * Conventions
 *  - Objects are opaque handles made by *_create and released by *_destroy (NULL is ignored).
 *  - Functions that can fail return mnn_h2o_status (MNN_H2O_OK = 0); on failure
 *    mnn_h2o_last_error() gives a message. The message is per thread and stays valid until the
 *    next failing call on that thread. No C++ exception ever leaves this API.
 *  - Integers are fixed width; sizes are size_t. Float arrays are row-major float32.
 *  - A handle is used by one thread at a time (distinct handles are independent). A KV cache
 *    runs its own worker threads inside attend/step (config.threads).
 *  - Plain C99 header: no C++ types, usable from C and from extern "C" FFI layers.
 *
 * Build: link the static library mnn_h2o_core (and libstdc++ / libc++, pthread, dl), or the
 * shared library libmnn_h2o (CMake option MNN_H2O_SHARED), which exports these functions only.
 * Example: native/examples/c_api_demo.c.
 */
#ifndef MNN_H2O_C_API_H
#define MNN_H2O_C_API_H

#include <stddef.h>
#include <stdint.h>

/* MNN_H2O_<SECTION>_FIELDS: the config keys of each struct below, generated from the schema. */
#include "mnn_h2o/config_schema.h"

#if defined(_WIN32)
#define MNN_H2O_API
#elif defined(__GNUC__) || defined(__clang__)
#define MNN_H2O_API __attribute__((visibility("default")))
#else
#define MNN_H2O_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define MNN_H2O_VERSION_MAJOR 0
#define MNN_H2O_VERSION_MINOR 1
#define MNN_H2O_VERSION_PATCH 0

/* ---- Status ------------------------------------------------------------------------------ */

typedef enum mnn_h2o_status {
    MNN_H2O_OK = 0,
    MNN_H2O_ERR_INVALID_ARGUMENT = 1, /* null pointer, bad configuration, index out of range */
    MNN_H2O_ERR_OUT_OF_MEMORY = 2,    /* nothing was changed */
    MNN_H2O_ERR_CAPACITY = 3,         /* a KV head would exceed max_tokens; nothing appended */
    MNN_H2O_ERR_UNSUPPORTED = 4,      /* e.g. an ISA this CPU/build lacks */
    MNN_H2O_ERR_INTERNAL = 5,         /* unexpected failure (a bug): see mnn_h2o_last_error() */
    /* Gear codec */
    MNN_H2O_ERR_OUTPUT_TOO_SMALL = 10, /* the output buffer cannot hold the result */
    MNN_H2O_ERR_TRUNCATED = 11,        /* the frame ends inside a field or a payload */
    MNN_H2O_ERR_BAD_MAGIC = 12,        /* not a Gear frame */
    MNN_H2O_ERR_BAD_VERSION = 13,      /* a Gear version this decoder does not know */
    MNN_H2O_ERR_BAD_HEADER = 14,       /* header fields out of range or header check mismatch */
    MNN_H2O_ERR_CORRUPT = 15,          /* a stream or map that breaks the format */
    MNN_H2O_ERR_CHECKSUM = 16,         /* decoded, but the data is not what was encoded */
    MNN_H2O_ERR_ZSTD_UNAVAILABLE = 17  /* the frame uses zstd and libzstd.so.1 is not loadable */
} mnn_h2o_status;

/* Short constant name of a status ("ok", "invalid_argument", ...). */
MNN_H2O_API const char* mnn_h2o_status_name(mnn_h2o_status status);

/* Message of the last failed call on this thread ("" if none). */
MNN_H2O_API const char* mnn_h2o_last_error(void);

/* ---- Library ----------------------------------------------------------------------------- */

/* "MAJOR.MINOR.PATCH" of the library actually linked. */
MNN_H2O_API const char* mnn_h2o_version(void);

typedef enum mnn_h2o_isa {
    MNN_H2O_ISA_SCALAR = 0,
    MNN_H2O_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    MNN_H2O_ISA_AVX512 = 2, /* AVX-512 F/BW/VL */
    MNN_H2O_ISA_NEON = 3    /* AArch64 */
} mnn_h2o_isa;

/* The ISA the attention kernels use: the widest compiled in and supported by this CPU, capped
 * by the environment variable MNN_H2O_ISA=scalar|avx2|avx512|neon. */
MNN_H2O_API mnn_h2o_isa mnn_h2o_best_isa(void);
MNN_H2O_API const char* mnn_h2o_isa_name(mnn_h2o_isa isa); /* "scalar", "avx2", "avx512", "neon" */
MNN_H2O_API int mnn_h2o_isa_available(mnn_h2o_isa isa);    /* 1 if compiled in and supported */
/* The Gear codec's byte loops are chosen at compile time: "neon" on AArch64, else "scalar". */
MNN_H2O_API const char* mnn_h2o_codec_isa_name(void);

/* ---- KV cache ---------------------------------------------------------------------------- */

typedef enum mnn_h2o_dtype {
    MNN_H2O_DTYPE_F16 = 0,
    MNN_H2O_DTYPE_BF16 = 1,
    MNN_H2O_DTYPE_F32 = 2,
    MNN_H2O_DTYPE_Q8 = 3,  /* int8 codes + an fp16 scale per 32 elements (docs/kv_cache.md) */
    MNN_H2O_DTYPE_Q4 = 4,  /* 4-bit codes + an fp16 scale per 32 elements */
    MNN_H2O_DTYPE_Q4R = 5, /* q4 of Hadamard-rotated rows (head_dim a power of two) */
    MNN_H2O_DTYPE_Q8R = 6  /* q8 of Hadamard-rotated rows (head_dim a power of two) */
} mnn_h2o_dtype;

/* The model's shape and capacity, then one field per config key runtime.* that reaches the core
 * (threads: attention threads counting the caller; dtype: runtime.kv_dtype, an mnn_h2o_dtype;
 * block_tokens: tokens per memory block), in the schema's order (config_schema.h): their
 * defaults (mnn_h2o_kv_config_init) and allowed values are those of docs/config.md, generated
 * from the one schema (mnn_h2o/config.py). */
#define MNN_H2O_C_FIELD(field, key, CType, CppType) CType field;
typedef struct mnn_h2o_kv_config {
    int32_t n_layers;
    int32_t n_kv_heads;
    int32_t n_heads;      /* query heads, a multiple of n_kv_heads (GQA), at most 64 per kv head */
    int32_t head_dim;     /* multiple of 16 in [16, 256] */
    int32_t max_tokens;   /* per (layer, kv head), in [1, 2^24] */
    MNN_H2O_RUNTIME_FIELDS(MNN_H2O_C_FIELD)
} mnn_h2o_kv_config;

/* Defaults: the schema's dtype, block_tokens and threads, max_tokens 8192; the model dimensions
 * are 0 and must be set. */
MNN_H2O_API void mnn_h2o_kv_config_init(mnn_h2o_kv_config* config);

/* The keys and values of every layer and kv head, in blocks from an mmap pool (memory goes back
 * to the OS on truncate/reset), with the attention op over them (scale 1/sqrt(head_dim), exact
 * softmax). Layouts:
 *   k, v     [n_tokens][n_kv_heads][head_dim]
 *   q        [n_q][n_heads][head_dim]          (RoPE applied)
 *   out      [n_q][n_heads * head_dim]         (must not overlap q)
 *   block_scores (optional, H2O signal) [n_kv_heads][scores_stride]: entry b of kv head h gains
 *     the softmax mass block b received, summed over the queries and the group's query heads;
 *     scores_stride >= mnn_h2o_kv_cache_max_blocks() always suffices. Pass NULL and 0 to skip. */
typedef struct mnn_h2o_kv_cache mnn_h2o_kv_cache;

MNN_H2O_API mnn_h2o_status mnn_h2o_kv_cache_create(const mnn_h2o_kv_config* config, mnn_h2o_kv_cache** cache);
/* The same with sliding-window layers (Gemma 3's local layers): windows[layer] tokens (config->
 * n_layers entries, each >= 0), 0 for a global layer. A window layer attends each query to the
 * newest `window` tokens up to itself and frees the blocks no later query can see: it holds at
 * most window - 1 + block_tokens - 1 tokens between steps; eviction and the lossless store act on the
 * global layers (docs/kv_cache.md). */
MNN_H2O_API mnn_h2o_status mnn_h2o_kv_cache_create_windowed(const mnn_h2o_kv_config* config, const int32_t* windows,
                                                            mnn_h2o_kv_cache** cache);
/* A layer's window in tokens: 0 for a global layer, -1 for a null cache or a layer out of range. */
MNN_H2O_API int32_t mnn_h2o_kv_cache_window(const mnn_h2o_kv_cache* cache, int32_t layer);
MNN_H2O_API void mnn_h2o_kv_cache_destroy(mnn_h2o_kv_cache* cache);
MNN_H2O_API mnn_h2o_status mnn_h2o_kv_cache_get_config(const mnn_h2o_kv_cache* cache, mnn_h2o_kv_config* config);

/* Appends n_tokens tokens to every kv head of layer (converted to the cache dtype). */
MNN_H2O_API mnn_h2o_status mnn_h2o_kv_cache_append(mnn_h2o_kv_cache* cache, int32_t layer, const float* k,
                                                   const float* v, int32_t n_tokens);

/* Attention of the n_q newest positions over layer's cache: query i sees the first
 * length - n_q + i + 1 tokens of its kv head. */
MNN_H2O_API mnn_h2o_status mnn_h2o_kv_cache_attend(mnn_h2o_kv_cache* cache, int32_t layer, const float* q,
                                                   int32_t n_q, float* out, float* block_scores,
                                                   size_t scores_stride);

/* append then attend of the same n_tokens positions (one call per layer per decode step). All
 * arguments are checked before anything is appended. */
MNN_H2O_API mnn_h2o_status mnn_h2o_kv_cache_step(mnn_h2o_kv_cache* cache, int32_t layer, const float* q,
                                                 const float* k, const float* v, int32_t n_tokens, float* out,
                                                 float* block_scores, size_t scores_stride);

/* Tokens held by one (layer, kv head). */
MNN_H2O_API mnn_h2o_status mnn_h2o_kv_cache_length(const mnn_h2o_kv_cache* cache, int32_t layer, int32_t head,
                                                   int32_t* length);

/* Copies one head's length() keys and values out as float32 [length][head_dim] each. */
MNN_H2O_API mnn_h2o_status mnn_h2o_kv_cache_read(const mnn_h2o_kv_cache* cache, int32_t layer, int32_t head,
                                                 float* k_out, float* v_out);

/* Keeps the first n_tokens tokens of one head; the blocks past them go back to the OS. */
MNN_H2O_API mnn_h2o_status mnn_h2o_kv_cache_truncate(mnn_h2o_kv_cache* cache, int32_t layer, int32_t head,
                                                     int32_t n_tokens);

/* Empties every head and returns all memory. */
MNN_H2O_API mnn_h2o_status mnn_h2o_kv_cache_reset(mnn_h2o_kv_cache* cache);

/* Bytes of KV blocks held (exact), and address space mapped by the pool. 0 for NULL. */
MNN_H2O_API size_t mnn_h2o_kv_cache_bytes_held(const mnn_h2o_kv_cache* cache);
MNN_H2O_API size_t mnn_h2o_kv_cache_bytes_mapped(const mnn_h2o_kv_cache* cache);

/* Blocks of one head at max_tokens: a scores_stride that always suffices. 0 for NULL. */
MNN_H2O_API int32_t mnn_h2o_kv_cache_max_blocks(const mnn_h2o_kv_cache* cache);

/* ---- eviction ------------------------------------------------------------------------------ */
/* Heavy-hitter eviction inside the KV cache (KvCache::enable_eviction and friends, docs/eviction.md): with
 * eviction on, step() collects each block's attention mass on the evicting layers, and
 * mnn_h2o_kv_cache_end_step() (once per forward, after all layers) evicts low-scoring blocks of
 * heads over their budget; their memory goes back to the OS. */

/* One field per config key h2o.* that reaches the core, in the schema's order (config_schema.h):
 * its default (mnn_h2o_eviction_config_init) and allowed values are those of docs/config.md,
 * generated from the one schema (mnn_h2o/config.py), which says what each does. A name
 * (policy, layer_budget) is a C string (NULL: the default); a bool (per_head_budget) is 0 or 1.
 * Start from mnn_h2o_eviction_config_init and set what you need: that stays right when keys are
 * added. */
typedef struct mnn_h2o_eviction_config {
    MNN_H2O_EVICTION_FIELDS(MNN_H2O_C_FIELD)
} mnn_h2o_eviction_config;
#undef MNN_H2O_C_FIELD

/* The i-th eviction policy name of the native registry (docs/eviction.md "Policies"), or NULL past
 * the last: the names mnn_h2o_eviction_config.policy accepts. */
MNN_H2O_API const char* mnn_h2o_policy_name(int32_t i);

/* The defaults of the config keys h2o.* (docs/config.md); the strings are static. */
MNN_H2O_API void mnn_h2o_eviction_config_init(mnn_h2o_eviction_config* config);

/* Turns eviction on, or replaces its config (scores and schedule restart). An invalid config is
 * MNN_H2O_ERR_INVALID_ARGUMENT naming the field; the previous state is kept then. */
MNN_H2O_API mnn_h2o_status mnn_h2o_kv_cache_enable_eviction(mnn_h2o_kv_cache* cache, const mnn_h2o_eviction_config* config);
/* Turns eviction off; the tokens held stay. */
MNN_H2O_API mnn_h2o_status mnn_h2o_kv_cache_disable_eviction(mnn_h2o_kv_cache* cache);
/* The active config (layer_end resolved) into *config, or MNN_H2O_ERR_INVALID_ARGUMENT when
 * eviction is off. config->policy points into the cache: valid until the next enable/disable. */
MNN_H2O_API mnn_h2o_status mnn_h2o_kv_cache_get_eviction_config(const mnn_h2o_kv_cache* cache,
                                                           mnn_h2o_eviction_config* config);

/* Call once after all layers of a forward of n_tokens tokens (prefill != 0 for a prompt chunk).
 * Runs the policy update when due; *evicted (optional) gets 1 if any block was evicted. With
 * eviction off it does nothing (*evicted = 0). */
MNN_H2O_API mnn_h2o_status mnn_h2o_kv_cache_end_step(mnn_h2o_kv_cache* cache, int32_t n_tokens, int32_t prefill,
                                                     int32_t* evicted);

/* Tokens [offset, offset + length) of a head. */
typedef struct mnn_h2o_token_run {
    int64_t offset;
    int64_t length;
} mnn_h2o_token_run;

/* Applies an explicit plan to one head: keeps the tokens of runs[0, n_runs) (sorted, disjoint,
 * inside the head, keeping the sink/recent floors and the last token) and releases the rest. An
 * invalid plan changes nothing and is MNN_H2O_ERR_INVALID_ARGUMENT. */
MNN_H2O_API mnn_h2o_status mnn_h2o_kv_cache_evict(mnn_h2o_kv_cache* cache, int32_t layer, int32_t head,
                                                  const mnn_h2o_token_run* runs, size_t n_runs);

/* Whole-model statistics since create/reset (kept whether or not eviction is on). */
typedef struct mnn_h2o_eviction_stats {
    size_t bytes_held;         /* K and V blocks held, all layers */
    size_t bytes_uncompressed; /* what every token seen would take in the cache dtype */
    double lossy_ratio;        /* bytes_uncompressed / bytes_held (1 when both are 0) */
    size_t bytes_f16;          /* what every token seen would take as fp16 rows */
    double whole_model_ratio;  /* bytes_f16 / bytes_held: eviction and quantisation together */
    double policy_us;          /* time scoring and choosing blocks */
    double compact_us;         /* time applying plans */
    int64_t updates;           /* end_step calls that ran a policy update */
    int64_t evictions;         /* plans applied, all layers (one per compacted head) */
    int64_t blocks_freed;      /* pool blocks released by them */
    int64_t invalid_plans;     /* plans rejected by mnn_h2o_kv_cache_evict */
} mnn_h2o_eviction_stats;

typedef struct mnn_h2o_eviction_layer_stats {
    int64_t tokens_seen;   /* tokens appended to the layer */
    int64_t evictions;
    int64_t blocks_freed;
    int64_t invalid_plans;
    double policy_us;
    double compact_us;
    size_t bytes_held;     /* K and V blocks of the layer */
    /* (head, update) pairs left alone: below_trigger, within_budget, floors_exceed_target,
     * target_unreachable */
    int64_t skipped[4];
} mnn_h2o_eviction_layer_stats;

MNN_H2O_API mnn_h2o_status mnn_h2o_kv_cache_eviction_stats(const mnn_h2o_kv_cache* cache, mnn_h2o_eviction_stats* stats);
MNN_H2O_API mnn_h2o_status mnn_h2o_kv_cache_eviction_layer_stats(const mnn_h2o_kv_cache* cache, int32_t layer,
                                                            mnn_h2o_eviction_layer_stats* stats);

/* The EMA block scores of layer, [n_kv_heads][*n_blocks] floats, NaN where a head holds no such
 * block or it has not been scored yet. *n_blocks is always set (when eviction is on); if scores is
 * NULL or capacity (in floats) is below n_kv_heads * *n_blocks nothing is written and the result
 * is MNN_H2O_ERR_OUTPUT_TOO_SMALL: call with NULL first to size the buffer. Eviction off:
 * MNN_H2O_ERR_INVALID_ARGUMENT. */
MNN_H2O_API mnn_h2o_status mnn_h2o_kv_cache_eviction_scores(const mnn_h2o_kv_cache* cache, int32_t layer, float* scores,
                                                       size_t capacity, int32_t* n_blocks);

/* ---- Gear codec -------------------------------------------------------------------------- */
/* Lossless codec for FP16/BF16/FP32 arrays [..., tokens, channels], and for the KV cache's q8 /
 * q4 rows (docs/gear_format.md). Each frame carries an XXH64 of the data, checked by every
 * decode. */

typedef enum mnn_h2o_elem_type {
    MNN_H2O_ELEM_F16 = 1,
    MNN_H2O_ELEM_BF16 = 2,
    MNN_H2O_ELEM_F32 = 3,
    MNN_H2O_ELEM_Q8 = 4, /* rows of channels int8 codes, then a binary16 scale per 32 (channels % 32 == 0) */
    MNN_H2O_ELEM_Q4 = 5  /* rows of channels / 2 bytes of 4-bit codes, then the scales */
} mnn_h2o_elem_type;

#define MNN_H2O_CODEC_MAX_DIMS 8

/* Predictor bits for mnn_h2o_codec_options.predictors (raw is always allowed). */
#define MNN_H2O_PREDICT_RAW 0x1u
#define MNN_H2O_PREDICT_XOR 0x2u
#define MNN_H2O_PREDICT_DELTA 0x4u
#define MNN_H2O_PREDICT_CENTRE 0x8u
#define MNN_H2O_PREDICT_ALL 0xFu

typedef struct mnn_h2o_codec_options {
    uint32_t predictors;   /* MNN_H2O_PREDICT_* mask */
    int32_t allow_rle;     /* 0/1 */
    int32_t allow_zstd;    /* 0/1; ignored when libzstd.so.1 cannot be loaded */
    int32_t zstd_level;
    uint32_t block_tokens; /* tokens per block inside a frame; 0 = one block per slice */
    int32_t dedup;         /* 0/1: code repeated token rows once */
} mnn_h2o_codec_options;

/* Defaults: all predictors, RLE and zstd allowed, zstd level 1, block_tokens 0, dedup on. */
MNN_H2O_API void mnn_h2o_codec_options_init(mnn_h2o_codec_options* options);

/* Encoder/decoder with reusable scratch memory (no allocation once warm). */
typedef struct mnn_h2o_codec mnn_h2o_codec;

/* options may be NULL for the defaults. */
MNN_H2O_API mnn_h2o_status mnn_h2o_codec_create(const mnn_h2o_codec_options* options, mnn_h2o_codec** codec);
MNN_H2O_API void mnn_h2o_codec_destroy(mnn_h2o_codec* codec);

/* Bytes enough for any frame of this array under the codec's options (0 if the shape is
 * invalid). dims are outermost first; ndim in [1, MNN_H2O_CODEC_MAX_DIMS]. */
MNN_H2O_API size_t mnn_h2o_codec_bound(const mnn_h2o_codec* codec, mnn_h2o_elem_type type, uint32_t ndim,
                                       const uint32_t* dims);

/* Encodes data (row-major rows of type, little-endian) into out[0, capacity); *written gets
 * the frame size. capacity >= mnn_h2o_codec_bound() always suffices. */
MNN_H2O_API mnn_h2o_status mnn_h2o_codec_encode(mnn_h2o_codec* codec, const void* data, mnn_h2o_elem_type type,
                                                uint32_t ndim, const uint32_t* dims, uint8_t* out,
                                                size_t capacity, size_t* written);

typedef struct mnn_h2o_frame_info {
    int32_t elem_type; /* mnn_h2o_elem_type */
    uint32_t ndim;
    uint32_t dims[MNN_H2O_CODEC_MAX_DIMS];
    uint32_t block_tokens;
    uint64_t data_checksum; /* XXH64 of the decoded bytes */
    size_t header_size;
    size_t decoded_size; /* bytes the decoded array takes */
} mnn_h2o_frame_info;

/* Reads and checks a frame's header only (to size the output before decoding). */
MNN_H2O_API mnn_h2o_status mnn_h2o_codec_frame_info(const uint8_t* frame, size_t size, mnn_h2o_frame_info* info);

/* Decodes a whole frame into out[0, capacity); the output is bit-exact and checksum-verified on
 * success (unspecified on failure). *decoded_size (optional, may be NULL) gets the byte count. */
MNN_H2O_API mnn_h2o_status mnn_h2o_codec_decode(mnn_h2o_codec* codec, const uint8_t* frame, size_t size, void* out,
                                                size_t capacity, size_t* decoded_size);

/* 1 when libzstd.so.1 was loaded (zstd frames can be written and read), else 0 (RLE only). */
MNN_H2O_API int mnn_h2o_zstd_available(void);

#ifdef __cplusplus
}
#endif

#endif /* MNN_H2O_C_API_H */
