/* The mnn_h2o C API from plain C99: a decode loop over a dummy model, then a Gear codec round
 * trip of what the cache holds, then the same loop with H2O eviction on.
 *
 * The "model" has no weights: each token's input is pseudo-random, and every layer turns the
 * previous layer's attention output into its q, k and v with fixed mixes, so the loop runs the
 * real call sequence of a decoder (prefill, then one step() per layer per token, end_step() after
 * the last layer) over data that depends on the cache contents. It prints the bytes the cache
 * holds, a checksum of the outputs, the attention mass per block of the last layer, the codec's
 * compression of one head's keys, and what eviction saves.
 *
 *   c_api_demo [decode_steps]      (default 96; exit status 0 when every check passed)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mnn_h2o/mnn_h2o.h"

#define N_LAYERS 4
#define N_KV_HEADS 2
#define N_HEADS 8
#define HEAD_DIM 64
#define PROMPT_TOKENS 37
#define MAX_TOKENS 512

static int failures = 0;

/* Reports a failed call with the library's message; the demo goes on. */
static int ok(mnn_h2o_status s, const char* what) {
    if (s == MNN_H2O_OK) return 1;
    fprintf(stderr, "FAIL %s: %s (%s)\n", what, mnn_h2o_status_name(s), mnn_h2o_last_error());
    ++failures;
    return 0;
}

static void check(int cond, const char* what) {
    if (!cond) {
        fprintf(stderr, "FAIL %s\n", what);
        ++failures;
    }
}

/* xorshift64*: the same numbers on every platform. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float uniform(void) { /* in [-1, 1) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((rng_state * 0x2545F4914F6CDD1Dull) >> 40) / (float)(1 << 23) - 1.0f;
}

/* FNV-1a over the outputs rounded to 1e-3, so the checksum does not depend on the last bits of
 * the ISA's summation order (it still may in rare rounding ties). */
static uint64_t checksum = 0xCBF29CE484222325ull;
static void add_to_checksum(const float* x, size_t n) {
    size_t i;
    for (i = 0; i < n; ++i) {
        const float scaled = x[i] * 1000.0f;
        const int32_t r = (int32_t)(scaled + (scaled >= 0 ? 0.5f : -0.5f));
        checksum = (checksum ^ (uint32_t)r) * 0x100000001B3ull;
    }
}

/* One layer's q [n][N_HEADS][HEAD_DIM] and k, v [n][N_KV_HEADS][HEAD_DIM] from its input x
 * [n][N_HEADS * HEAD_DIM] (the previous layer's attention output, or the token embedding). */
static void project(const float* x, int n, int layer, float* q, float* k, float* v) {
    const int qw = N_HEADS * HEAD_DIM, kw = N_KV_HEADS * HEAD_DIM;
    int t, i;
    for (t = 0; t < n; ++t) {
        const float* xt = x + (size_t)t * qw;
        for (i = 0; i < qw; ++i) q[(size_t)t * qw + i] = 2.0f * xt[(i + 7 * layer) % qw] + 0.1f * uniform();
        for (i = 0; i < kw; ++i) {
            k[(size_t)t * kw + i] = xt[i] + xt[(i * 3 + layer) % qw] + 0.1f * uniform();
            v[(size_t)t * kw + i] = xt[(i + kw) % qw] - 0.5f * xt[i] + 0.1f * uniform();
        }
    }
}

/* Runs n tokens (prefill when n > 1) through every layer, then end_step() (which evicts when H2O
 * is on and an update is due). scores: the last layer's attention mass per block, accumulated
 * over calls. */
static void forward(mnn_h2o_kv_cache* cache, int n, float* scores, size_t stride) {
    const size_t qn = (size_t)n * N_HEADS * HEAD_DIM, kn = (size_t)n * N_KV_HEADS * HEAD_DIM;
    float* x = malloc(qn * sizeof *x);
    float* q = malloc(qn * sizeof *q);
    float* out = malloc(qn * sizeof *out);
    float* k = malloc(kn * sizeof *k);
    float* v = malloc(kn * sizeof *v);
    size_t i;
    int layer;
    if (!x || !q || !out || !k || !v) {
        check(0, "malloc");
        goto done;
    }
    for (i = 0; i < qn; ++i) x[i] = uniform();
    for (layer = 0; layer < N_LAYERS; ++layer) {
        project(x, n, layer, q, k, v);
        if (!ok(mnn_h2o_kv_cache_step(cache, layer, q, k, v, n, out, layer == N_LAYERS - 1 ? scores : NULL,
                                      layer == N_LAYERS - 1 ? stride : 0),
                "step"))
            goto done;
        memcpy(x, out, qn * sizeof *x);
    }
    add_to_checksum(out, qn);
    ok(mnn_h2o_kv_cache_end_step(cache, n, n > 1, NULL), "end_step");
done:
    free(x);
    free(q);
    free(out);
    free(k);
    free(v);
}

static void decode_loop(int steps, int with_eviction) {
    mnn_h2o_kv_config cfg;
    mnn_h2o_kv_cache* cache = NULL;
    float* scores;
    size_t stride;
    int32_t len = -1;
    int s, b, best = 0;

    mnn_h2o_kv_config_init(&cfg);
    cfg.n_layers = N_LAYERS;
    cfg.n_kv_heads = N_KV_HEADS;
    cfg.n_heads = N_HEADS;
    cfg.head_dim = HEAD_DIM;
    cfg.dtype = MNN_H2O_DTYPE_F16;
    cfg.block_tokens = 16;
    cfg.max_tokens = MAX_TOKENS;
    cfg.threads = 2;
    if (!ok(mnn_h2o_kv_cache_create(&cfg, &cache), "kv_cache_create")) return;
    if (with_eviction) {
        /* Layers 1..3 keep 40% of the tokens seen, always the first 16 and the last 16. */
        mnn_h2o_eviction_config e;
        mnn_h2o_eviction_config_init(&e);
        e.policy = "h2o";
        e.sink_tokens = 16;
        e.recent_tokens = 16;
        e.target_keep_ratio = 0.4;
        e.layer_start = 1;
        e.trigger_min_tokens = 48;
        e.update_interval = 8;
        if (!ok(mnn_h2o_kv_cache_enable_eviction(cache, &e), "enable_eviction")) {
            mnn_h2o_kv_cache_destroy(cache);
            return;
        }
        printf("-- with H2O eviction (keep ratio 0.4 on layers 1-%d)\n", N_LAYERS - 1);
    } else {
        printf("-- without eviction\n");
    }

    stride = (size_t)mnn_h2o_kv_cache_max_blocks(cache);
    scores = calloc(N_KV_HEADS * stride, sizeof *scores);
    if (!scores) {
        check(0, "calloc");
        mnn_h2o_kv_cache_destroy(cache);
        return;
    }

    forward(cache, PROMPT_TOKENS, scores, stride);
    printf("prefill %d tokens: %zu bytes held (%zu mapped)\n", PROMPT_TOKENS, mnn_h2o_kv_cache_bytes_held(cache),
           mnn_h2o_kv_cache_bytes_mapped(cache));
    for (s = 0; s < steps; ++s) forward(cache, 1, scores, stride);

    if (with_eviction) {
        mnn_h2o_eviction_stats st;
        int32_t len0 = -1;
        ok(mnn_h2o_kv_cache_length(cache, 0, 0, &len0), "length");
        ok(mnn_h2o_kv_cache_length(cache, N_LAYERS - 1, 0, &len), "length");
        if (ok(mnn_h2o_kv_cache_eviction_stats(cache, &st), "eviction_stats")) {
            printf("decode %d steps: layer 0 holds %d tokens, layer %d holds %d; %zu bytes held, "
                   "%zu uncompressed (%.2fx), %lld heads compacted, %lld blocks freed\n",
                   steps, (int)len0, N_LAYERS - 1, (int)len, mnn_h2o_kv_cache_bytes_held(cache),
                   st.bytes_uncompressed, st.lossy_ratio, (long long)st.evictions, (long long)st.blocks_freed);
            check(len0 == PROMPT_TOKENS + steps, "layer 0 does not evict");
            check(steps < 64 || (st.evictions > 0 && len < len0), "eviction happened");
        }
        free(scores);
        mnn_h2o_kv_cache_destroy(cache);
        return;
    }
    ok(mnn_h2o_kv_cache_length(cache, N_LAYERS - 1, 0, &len), "length");
    check(len == PROMPT_TOKENS + steps, "length after decode");
    /* K and V of every (layer, kv head), ceil(len / 16) blocks each of 16 x 64 x 2 bytes. */
    check(mnn_h2o_kv_cache_bytes_held(cache) ==
              (size_t)2 * N_LAYERS * N_KV_HEADS * ((len + 15) / 16) * 16 * HEAD_DIM * 2,
          "bytes held");
    printf("decode %d steps: length %d, %zu bytes held, checksum %016llx\n", steps, (int)len,
           mnn_h2o_kv_cache_bytes_held(cache), (unsigned long long)checksum);
    for (b = 1; b * 16 < len; ++b)
        if (scores[b] > scores[best]) best = b;
    printf("layer %d kv head 0: block %d received the most attention (%.2f of %d query-head rows)\n",
           N_LAYERS - 1, best, scores[best], (PROMPT_TOKENS + steps) * (N_HEADS / N_KV_HEADS));

    /* Errors come back as a status and a message, never as a crash or an exception. */
    {
        float dummy[N_HEADS * HEAD_DIM];
        const mnn_h2o_status st = mnn_h2o_kv_cache_attend(cache, N_LAYERS, dummy, 1, dummy, NULL, 0);
        check(st == MNN_H2O_ERR_INVALID_ARGUMENT, "bad layer is an invalid argument");
        printf("attend on layer %d: %s (\"%s\")\n", N_LAYERS, mnn_h2o_status_name(st), mnn_h2o_last_error());
    }

    /* Codec round trip of layer 0, kv head 0's keys as the cache holds them (f16 values, read
     * back as float32). */
    {
        const size_t n = (size_t)len * HEAD_DIM;
        float* k = malloc(n * sizeof *k);
        float* v = malloc(n * sizeof *v);
        float* back = malloc(n * sizeof *back);
        uint8_t* frame = NULL;
        mnn_h2o_codec* codec = NULL;
        uint32_t dims[2];
        size_t bound, written = 0, decoded = 0;
        mnn_h2o_frame_info info;
        dims[0] = (uint32_t)len;
        dims[1] = HEAD_DIM;
        if (k && v && back && ok(mnn_h2o_kv_cache_read(cache, 0, 0, k, v), "read") &&
            ok(mnn_h2o_codec_create(NULL, &codec), "codec_create")) {
            bound = mnn_h2o_codec_bound(codec, MNN_H2O_ELEM_F32, 2, dims);
            frame = malloc(bound);
            if (frame && ok(mnn_h2o_codec_encode(codec, k, MNN_H2O_ELEM_F32, 2, dims, frame, bound, &written), "encode") &&
                ok(mnn_h2o_codec_frame_info(frame, written, &info), "frame_info") &&
                ok(mnn_h2o_codec_decode(codec, frame, written, back, n * sizeof *back, &decoded), "decode")) {
                check(info.decoded_size == n * sizeof *k && decoded == info.decoded_size, "decoded size");
                check(memcmp(back, k, n * sizeof *k) == 0, "codec round trip is bit-exact");
                printf("codec (%s loops, zstd %s): keys %u x %u f32, %zu -> %zu bytes (%.2fx), round trip %s\n",
                       mnn_h2o_codec_isa_name(), mnn_h2o_zstd_available() ? "loaded" : "unavailable, RLE",
                       (unsigned)dims[0], (unsigned)dims[1], n * sizeof *k, written,
                       (double)(n * sizeof *k) / (double)written,
                       memcmp(back, k, n * sizeof *k) == 0 ? "exact" : "MISMATCH");
                /* A damaged frame is an error, never wrong data. */
                frame[written / 2] ^= 0x10;
                check(mnn_h2o_codec_decode(codec, frame, written, back, n * sizeof *back, NULL) != MNN_H2O_OK,
                      "damaged frame is refused");
            }
        } else {
            check(0, "codec setup");
        }
        free(frame);
        free(k);
        free(v);
        free(back);
        mnn_h2o_codec_destroy(codec);
    }

    ok(mnn_h2o_kv_cache_reset(cache), "reset");
    check(mnn_h2o_kv_cache_bytes_held(cache) == 0, "reset returns every block");
    printf("after reset: %zu bytes held\n", mnn_h2o_kv_cache_bytes_held(cache));
    free(scores);
    mnn_h2o_kv_cache_destroy(cache);
}

int main(int argc, char** argv) {
    const int steps = argc > 1 ? atoi(argv[1]) : 96;
    if (steps < 0 || PROMPT_TOKENS + steps > MAX_TOKENS) {
        fprintf(stderr, "usage: %s [decode_steps <= %d]\n", argv[0], MAX_TOKENS - PROMPT_TOKENS);
        return 2;
    }
    printf("mnn_h2o %s, attention isa %s, codec isa %s\n", mnn_h2o_version(), mnn_h2o_isa_name(mnn_h2o_best_isa()),
           mnn_h2o_codec_isa_name());
    decode_loop(steps, 0);
    decode_loop(steps, 1);
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
