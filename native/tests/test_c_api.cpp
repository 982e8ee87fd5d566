// The C API (mnn_h2o/mnn_h2o.h): same results as the C++ classes it wraps, every error as a
// status with a message (never an exception), null handles, per-thread last error.
#include "mnn_h2o/mnn_h2o.h"

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <thread>
#include <vector>

#include "mnn_h2o/config_schema.h"
#include "mnn_h2o/runtime/cpu_features.h"
#include "mnn_h2o/codec/gear_codec.h"
#include "mnn_h2o/cache/kv_cache.h"

#include "test_support.h"

static bool error_mentions(const char* text) { return std::strstr(mnn_h2o_last_error(), text) != nullptr; }

static void test_library() {
    char want[32];
    std::snprintf(want, sizeof want, "%d.%d.%d", MNN_H2O_VERSION_MAJOR, MNN_H2O_VERSION_MINOR, MNN_H2O_VERSION_PATCH);
    CHECK(std::strcmp(mnn_h2o_version(), want) == 0, "version %s", mnn_h2o_version());
    CHECK(static_cast<int>(mnn_h2o_best_isa()) == static_cast<int>(mnn_h2o::best_isa()), "best isa");
    CHECK(std::strcmp(mnn_h2o_isa_name(mnn_h2o_best_isa()), mnn_h2o::isa_name(mnn_h2o::best_isa())) == 0, "isa name");
    CHECK(mnn_h2o_isa_available(MNN_H2O_ISA_SCALAR) == 1, "scalar always available");
    CHECK(mnn_h2o_isa_available(static_cast<mnn_h2o_isa>(42)) == 0, "unknown isa");
    CHECK(std::strcmp(mnn_h2o_isa_name(static_cast<mnn_h2o_isa>(42)), "unknown") == 0, "unknown isa name");
#if defined(__aarch64__)
    CHECK(std::strcmp(mnn_h2o_codec_isa_name(), "neon") == 0, "codec isa %s", mnn_h2o_codec_isa_name());
#else
    CHECK(std::strcmp(mnn_h2o_codec_isa_name(), "scalar") == 0, "codec isa %s", mnn_h2o_codec_isa_name());
#endif
    CHECK(mnn_h2o_zstd_available() == (mnn_h2o::gear::zstd_available() ? 1 : 0), "zstd");
    CHECK(std::strcmp(mnn_h2o_status_name(MNN_H2O_ERR_CHECKSUM), "checksum") == 0, "status name");
    CHECK(std::strcmp(mnn_h2o_status_name(static_cast<mnn_h2o_status>(999)), "unknown") == 0, "unknown status");
    std::printf("mnn_h2o %s: attention %s, codec %s, zstd %s\n", mnn_h2o_version(),
                mnn_h2o_isa_name(mnn_h2o_best_isa()), mnn_h2o_codec_isa_name(),
                mnn_h2o_zstd_available() ? "loaded" : "missing");
}

static mnn_h2o_kv_config small_config() {
    mnn_h2o_kv_config c;
    mnn_h2o_kv_config_init(&c);
    c.n_layers = 2;
    c.n_kv_heads = 2;
    c.n_heads = 4;
    c.head_dim = 32;
    c.dtype = MNN_H2O_DTYPE_F16;
    c.block_tokens = 16;
    c.max_tokens = 100;
    c.threads = 1;
    return c;
}

static std::vector<float> randoms(std::mt19937& g, size_t n) {
    std::normal_distribution<float> d(0.f, 1.f);
    std::vector<float> v(n);
    for (float& x : v) x = d(g);
    return v;
}

// The C API and KvCache fed the same data give bit-identical outputs, scores and bytes.
static void test_kv_cache_matches_cpp() {
    mnn_h2o_kv_config c = small_config();
    mnn_h2o_kv_config defaults;
    mnn_h2o_kv_config_init(&defaults);
    // The schema's defaults (config_schema.h): a C API of its own ones fails here.
    namespace runtime = mnn_h2o::schema::runtime;
    CHECK(std::string(mnn_h2o::kv_dtype_name(static_cast<mnn_h2o::KvDtype>(defaults.dtype))) == runtime::kv_dtype::kDefault &&
              defaults.block_tokens == runtime::block_tokens::kDefault &&
              defaults.threads == runtime::threads::kDefault && defaults.max_tokens == mnn_h2o::KvCacheConfig{}.max_tokens,
          "config defaults");

    mnn_h2o_kv_cache* cache = nullptr;
    CHECK(mnn_h2o_kv_cache_create(&c, &cache) == MNN_H2O_OK && cache, "create: %s", mnn_h2o_last_error());
    if (!cache) return;
    mnn_h2o_kv_config back;
    CHECK(mnn_h2o_kv_cache_get_config(cache, &back) == MNN_H2O_OK && std::memcmp(&back, &c, sizeof c) == 0,
          "get_config");

    mnn_h2o::KvCacheConfig cc;
    cc.n_layers = c.n_layers;
    cc.n_kv_heads = c.n_kv_heads;
    cc.n_heads = c.n_heads;
    cc.head_dim = c.head_dim;
    cc.dtype = static_cast<mnn_h2o::KvDtype>(c.dtype);
    cc.block_tokens = c.block_tokens;
    cc.max_tokens = c.max_tokens;
    cc.threads = c.threads;
    mnn_h2o::KvCache ref(cc);
    CHECK(mnn_h2o_kv_cache_max_blocks(cache) == ref.max_blocks(), "max_blocks");

    std::mt19937 g(1);
    const size_t stride = static_cast<size_t>(ref.max_blocks());
    std::vector<float> s(c.n_kv_heads * stride, 0.f), s_ref(s);
    for (int n : {20, 1, 1, 3}) {
        for (int layer = 0; layer < c.n_layers; ++layer) {
            const auto q = randoms(g, static_cast<size_t>(n) * c.n_heads * c.head_dim);
            const auto k = randoms(g, static_cast<size_t>(n) * c.n_kv_heads * c.head_dim);
            const auto v = randoms(g, k.size());
            std::vector<float> out(q.size()), out_ref(q.size());
            if (layer == 0) {
                CHECK(mnn_h2o_kv_cache_step(cache, layer, q.data(), k.data(), v.data(), n, out.data(), s.data(),
                                            stride) == MNN_H2O_OK,
                      "step: %s", mnn_h2o_last_error());
                ref.step(layer, q.data(), k.data(), v.data(), n, out_ref.data(), s_ref.data(), stride);
            } else {
                CHECK(mnn_h2o_kv_cache_append(cache, layer, k.data(), v.data(), n) == MNN_H2O_OK, "append");
                CHECK(mnn_h2o_kv_cache_attend(cache, layer, q.data(), n, out.data(), nullptr, 0) == MNN_H2O_OK,
                      "attend: %s", mnn_h2o_last_error());
                ref.append(layer, k.data(), v.data(), n);
                ref.attend(layer, q.data(), n, out_ref.data());
            }
            CHECK(out == out_ref, "layer %d n=%d: output differs from KvCache", layer, n);
        }
    }
    CHECK(s == s_ref, "block scores differ from KvCache");
    int32_t len = -1;
    CHECK(mnn_h2o_kv_cache_length(cache, 1, 1, &len) == MNN_H2O_OK && len == 25, "length %d", len);
    CHECK(mnn_h2o_kv_cache_bytes_held(cache) == ref.bytes_held() && ref.bytes_held() > 0, "bytes_held");
    CHECK(mnn_h2o_kv_cache_bytes_mapped(cache) == ref.bytes_mapped(), "bytes_mapped");

    std::vector<float> k(static_cast<size_t>(len) * c.head_dim), v(k.size()), k_ref(k.size()), v_ref(k.size());
    CHECK(mnn_h2o_kv_cache_read(cache, 1, 1, k.data(), v.data()) == MNN_H2O_OK, "read");
    ref.read(1, 1, k_ref.data(), v_ref.data());
    CHECK(k == k_ref && v == v_ref, "read back");

    const size_t before = mnn_h2o_kv_cache_bytes_held(cache);
    CHECK(mnn_h2o_kv_cache_truncate(cache, 1, 1, 10) == MNN_H2O_OK, "truncate");
    CHECK(mnn_h2o_kv_cache_length(cache, 1, 1, &len) == MNN_H2O_OK && len == 10, "length after truncate");
    CHECK(mnn_h2o_kv_cache_bytes_held(cache) < before, "truncate releases blocks");

    // Errors: status + message, cache unchanged.
    std::vector<float> big(static_cast<size_t>(200) * c.n_kv_heads * c.head_dim);
    CHECK(mnn_h2o_kv_cache_append(cache, 0, big.data(), big.data(), 200) == MNN_H2O_ERR_CAPACITY &&
              error_mentions("mnn_h2o_kv_cache_append"),
          "over max_tokens: %s", mnn_h2o_last_error());
    CHECK(mnn_h2o_kv_cache_length(cache, 0, 0, &len) == MNN_H2O_OK && len == 25, "nothing appended");
    CHECK(mnn_h2o_kv_cache_length(cache, 2, 0, &len) == MNN_H2O_ERR_INVALID_ARGUMENT && error_mentions("layer"),
          "layer out of range: %s", mnn_h2o_last_error());
    CHECK(mnn_h2o_kv_cache_length(cache, 0, -1, &len) == MNN_H2O_ERR_INVALID_ARGUMENT, "head out of range");
    CHECK(mnn_h2o_kv_cache_length(cache, 0, 0, nullptr) == MNN_H2O_ERR_INVALID_ARGUMENT &&
              error_mentions("length is null"),
          "null length");
    CHECK(mnn_h2o_kv_cache_attend(cache, 0, nullptr, 1, k.data(), nullptr, 0) == MNN_H2O_ERR_INVALID_ARGUMENT,
          "null q: %s", mnn_h2o_last_error());
    CHECK(mnn_h2o_kv_cache_read(cache, 0, 0, nullptr, v.data()) == MNN_H2O_ERR_INVALID_ARGUMENT, "null k_out");
    CHECK(mnn_h2o_kv_cache_truncate(cache, 0, 0, 26) == MNN_H2O_ERR_INVALID_ARGUMENT, "truncate past length");

    CHECK(mnn_h2o_kv_cache_reset(cache) == MNN_H2O_OK && mnn_h2o_kv_cache_bytes_held(cache) == 0, "reset");
    mnn_h2o_kv_cache_destroy(cache);
}

// Every element type through the C API: q8 holds 68-byte rows (head_dim 64), and its
// whole-model ratio counts the f16 size of every token.
static void test_kv_cache_dtypes() {
    for (int32_t dt : {MNN_H2O_DTYPE_F16, MNN_H2O_DTYPE_BF16, MNN_H2O_DTYPE_F32, MNN_H2O_DTYPE_Q8, MNN_H2O_DTYPE_Q4,
                       MNN_H2O_DTYPE_Q4R, MNN_H2O_DTYPE_Q8R}) {
        mnn_h2o_kv_config c = small_config();
        c.head_dim = 64;
        c.dtype = dt;
        mnn_h2o_kv_cache* cache = nullptr;
        CHECK(mnn_h2o_kv_cache_create(&c, &cache) == MNN_H2O_OK, "dtype %d: %s", dt, mnn_h2o_last_error());
        if (!cache) continue;
        std::mt19937 g(dt);
        const std::vector<float> k = randoms(g, 32 * 2 * 64), v = randoms(g, 32 * 2 * 64), q = randoms(g, 4 * 64);
        std::vector<float> out(4 * 64);
        CHECK(mnn_h2o_kv_cache_append(cache, 0, k.data(), v.data(), 32) == MNN_H2O_OK, "append");
        CHECK(mnn_h2o_kv_cache_attend(cache, 0, q.data(), 1, out.data(), nullptr, 0) == MNN_H2O_OK, "attend");
        mnn_h2o_eviction_stats st;
        CHECK(mnn_h2o_kv_cache_eviction_stats(cache, &st) == MNN_H2O_OK && st.bytes_f16 == size_t{32} * 2 * 64 * 2 * 2,
              "f16 bytes");
        if (dt == MNN_H2O_DTYPE_Q8)
            CHECK(st.bytes_held == size_t{2} * 2 * 2 * 16 * 68 && st.whole_model_ratio > 1.88 && st.whole_model_ratio < 1.89,
                  "q8 holds %zu bytes, ratio %.3f", st.bytes_held, st.whole_model_ratio);
        mnn_h2o_kv_cache_destroy(cache);
    }
}

// A windowed cache through the C API: the window layer holds at most its window (plus the block
// slack) however many tokens come, the global layer all of them; bad windows refused.
static void test_kv_cache_windows() {
    mnn_h2o_kv_config c = small_config();
    c.max_tokens = 200;
    const int32_t windows[2] = {24, 0};
    mnn_h2o_kv_cache* cache = nullptr;
    CHECK(mnn_h2o_kv_cache_create_windowed(&c, windows, &cache) == MNN_H2O_OK, "windowed: %s", mnn_h2o_last_error());
    if (!cache) return;
    CHECK(mnn_h2o_kv_cache_window(cache, 0) == 24 && mnn_h2o_kv_cache_window(cache, 1) == 0 &&
              mnn_h2o_kv_cache_window(cache, 2) == -1 && mnn_h2o_kv_cache_window(nullptr, 0) == -1,
          "windows read back");
    std::mt19937 g(4);
    std::vector<float> out(4 * 32);
    for (int t = 0; t < 150; ++t) {
        const std::vector<float> k = randoms(g, 2 * 32), v = randoms(g, 2 * 32), q = randoms(g, 4 * 32);
        for (int32_t layer = 0; layer < 2; ++layer)
            CHECK(mnn_h2o_kv_cache_step(cache, layer, q.data(), k.data(), v.data(), 1, out.data(), nullptr, 0) ==
                      MNN_H2O_OK,
                  "step %d: %s", t, mnn_h2o_last_error());
    }
    int32_t local = 0, global = 0;
    mnn_h2o_kv_cache_length(cache, 0, 0, &local);
    mnn_h2o_kv_cache_length(cache, 1, 0, &global);
    CHECK(global == 150 && local >= 24 && local <= 24 - 1 + 16 - 1, "held: window layer %d, global %d", local, global);
    mnn_h2o_kv_cache_destroy(cache);
    const int32_t bad[2] = {-1, 0};
    CHECK(mnn_h2o_kv_cache_create_windowed(&c, bad, &cache) == MNN_H2O_ERR_INVALID_ARGUMENT && cache == nullptr &&
              error_mentions("window"),
          "a negative window: %s", mnn_h2o_last_error());
    CHECK(mnn_h2o_kv_cache_create_windowed(&c, nullptr, &cache) == MNN_H2O_ERR_INVALID_ARGUMENT, "null windows");
}

static void test_kv_cache_bad_config_and_null() {
    mnn_h2o_kv_cache* cache = reinterpret_cast<mnn_h2o_kv_cache*>(1);
    mnn_h2o_kv_config c = small_config();
    c.head_dim = 40;
    CHECK(mnn_h2o_kv_cache_create(&c, &cache) == MNN_H2O_ERR_INVALID_ARGUMENT && cache == nullptr &&
              error_mentions("head_dim"),
          "bad head_dim: %s", mnn_h2o_last_error());
    c = small_config();
    c.dtype = 7;
    CHECK(mnn_h2o_kv_cache_create(&c, &cache) == MNN_H2O_ERR_INVALID_ARGUMENT && error_mentions("dtype"), "bad dtype");
    c = small_config();
    c.dtype = 7;
    CHECK(mnn_h2o_kv_cache_create(&c, &cache) == MNN_H2O_ERR_INVALID_ARGUMENT && error_mentions("q8r"),
          "the error lists the known types: %s", mnn_h2o_last_error());
    c = small_config();
    c.dtype = MNN_H2O_DTYPE_Q4R;
    c.head_dim = 96;  // a multiple of 32, not a power of two
    CHECK(mnn_h2o_kv_cache_create(&c, &cache) == MNN_H2O_ERR_INVALID_ARGUMENT && error_mentions("power of two") &&
              error_mentions("the unrotated q4 takes any multiple of 32"),
          "q4r head_dim: %s", mnn_h2o_last_error());
    c.dtype = MNN_H2O_DTYPE_Q8R;  // the default: the message names the type that runs such a head
    CHECK(mnn_h2o_kv_cache_create(&c, &cache) == MNN_H2O_ERR_INVALID_ARGUMENT &&
              error_mentions("the unrotated q8 takes any multiple of 32"),
          "q8r head_dim: %s", mnn_h2o_last_error());
    c = small_config();
    c.n_heads = 3;
    CHECK(mnn_h2o_kv_cache_create(&c, &cache) == MNN_H2O_ERR_INVALID_ARGUMENT, "bad group");
    CHECK(mnn_h2o_kv_cache_create(nullptr, &cache) == MNN_H2O_ERR_INVALID_ARGUMENT, "null config");
    CHECK(mnn_h2o_kv_cache_create(&c, nullptr) == MNN_H2O_ERR_INVALID_ARGUMENT, "null out");

    mnn_h2o_kv_cache_destroy(nullptr);
    float x[64] = {};
    int32_t len = 0;
    CHECK(mnn_h2o_kv_cache_append(nullptr, 0, x, x, 1) == MNN_H2O_ERR_INVALID_ARGUMENT && error_mentions("cache is null"),
          "null cache append");
    CHECK(mnn_h2o_kv_cache_step(nullptr, 0, x, x, x, 1, x, nullptr, 0) == MNN_H2O_ERR_INVALID_ARGUMENT, "null step");
    CHECK(mnn_h2o_kv_cache_length(nullptr, 0, 0, &len) == MNN_H2O_ERR_INVALID_ARGUMENT, "null length");
    CHECK(mnn_h2o_kv_cache_reset(nullptr) == MNN_H2O_ERR_INVALID_ARGUMENT, "null reset");
    CHECK(mnn_h2o_kv_cache_bytes_held(nullptr) == 0 && mnn_h2o_kv_cache_max_blocks(nullptr) == 0, "null getters");
}

static void test_codec() {
    std::mt19937 g(2);
    std::vector<uint16_t> data(48 * 64);
    std::normal_distribution<float> d(0.f, 1.f);
    for (uint16_t& h : data) {
        const float x = d(g);
        uint32_t bits;
        std::memcpy(&bits, &x, 4);
        h = static_cast<uint16_t>(bits >> 16);  // bf16
    }
    const uint32_t dims[2] = {48, 64};

    mnn_h2o_codec_options o;
    mnn_h2o_codec_options_init(&o);
    const mnn_h2o::gear::EncodeOptions eo;
    CHECK(o.predictors == eo.predictors && o.allow_rle == 1 && o.allow_zstd == 1 && o.zstd_level == eo.zstd_level &&
              o.block_tokens == eo.block_tokens && o.dedup == 1,
          "options defaults");
    mnn_h2o_codec* codec = nullptr;
    CHECK(mnn_h2o_codec_create(nullptr, &codec) == MNN_H2O_OK && codec, "create");
    if (!codec) return;

    const size_t bound = mnn_h2o_codec_bound(codec, MNN_H2O_ELEM_BF16, 2, dims);
    mnn_h2o::gear::Shape shape = mnn_h2o::gear::Shape::matrix(48, 64);
    CHECK(bound == mnn_h2o::gear::max_encoded_size(mnn_h2o::gear::ElementType::BF16, shape, 0) && bound > 0, "bound");
    CHECK(mnn_h2o_codec_bound(codec, MNN_H2O_ELEM_BF16, 0, dims) == 0, "bound ndim 0");
    CHECK(mnn_h2o_codec_bound(codec, static_cast<mnn_h2o_elem_type>(9), 2, dims) == 0, "bound bad type");

    std::vector<uint8_t> frame(bound);
    size_t written = 0;
    CHECK(mnn_h2o_codec_encode(codec, data.data(), MNN_H2O_ELEM_BF16, 2, dims, frame.data(), frame.size(), &written) ==
              MNN_H2O_OK,
          "encode: %s", mnn_h2o_last_error());
    // The same frame as the C++ codec.
    std::vector<uint8_t> cpp_frame;
    mnn_h2o::gear::Codec cpp;
    CHECK(cpp.encode(data.data(), mnn_h2o::gear::ElementType::BF16, shape, &cpp_frame) == mnn_h2o::gear::Status::Ok,
          "C++ encode");
    CHECK(written == cpp_frame.size() && std::memcmp(frame.data(), cpp_frame.data(), written) == 0,
          "same frame as C++");

    mnn_h2o_frame_info info;
    CHECK(mnn_h2o_codec_frame_info(frame.data(), written, &info) == MNN_H2O_OK && info.elem_type == MNN_H2O_ELEM_BF16 &&
              info.ndim == 2 && info.dims[0] == 48 && info.dims[1] == 64 && info.decoded_size == data.size() * 2 &&
              info.header_size == 32,
          "frame info");
    std::vector<uint16_t> back(data.size());
    size_t decoded = 0;
    CHECK(mnn_h2o_codec_decode(codec, frame.data(), written, back.data(), back.size() * 2, &decoded) == MNN_H2O_OK &&
              decoded == data.size() * 2 && back == data,
          "decode");

    // Quantised rows: the same bytes read as 48 rows of 64 q8 values (68 bytes each) and back.
    const uint32_t q8_dims[2] = {48, 64};
    std::vector<uint8_t> q8(48 * 68), q8_back(q8.size());
    std::memcpy(q8.data(), data.data(), q8.size());
    frame.resize(mnn_h2o_codec_bound(codec, MNN_H2O_ELEM_Q8, 2, q8_dims));
    CHECK(!frame.empty() && mnn_h2o_codec_encode(codec, q8.data(), MNN_H2O_ELEM_Q8, 2, q8_dims, frame.data(),
                                                 frame.size(), &written) == MNN_H2O_OK,
          "q8 encode: %s", mnn_h2o_last_error());
    CHECK(mnn_h2o_codec_frame_info(frame.data(), written, &info) == MNN_H2O_OK && info.elem_type == MNN_H2O_ELEM_Q8 &&
              info.decoded_size == q8.size() &&
              mnn_h2o_codec_decode(codec, frame.data(), written, q8_back.data(), q8_back.size(), &decoded) == MNN_H2O_OK &&
              q8_back == q8,
          "q8 round trip");
    const uint32_t not_groups[2] = {4, 48};
    CHECK(mnn_h2o_codec_bound(codec, MNN_H2O_ELEM_Q4, 2, not_groups) == 0, "q4 bound of 48 channels");
    frame.resize(bound);

    // Errors.
    CHECK(mnn_h2o_codec_encode(codec, data.data(), MNN_H2O_ELEM_BF16, 2, dims, frame.data(), 10, &written) ==
              MNN_H2O_ERR_OUTPUT_TOO_SMALL && error_mentions("mnn_h2o_codec_encode"),
          "encode into 10 bytes: %s", mnn_h2o_last_error());
    CHECK(mnn_h2o_codec_encode(codec, data.data(), MNN_H2O_ELEM_BF16, 9, dims, frame.data(), frame.size(), &written) ==
              MNN_H2O_ERR_INVALID_ARGUMENT,
          "ndim 9");
    CHECK(mnn_h2o_codec_encode(codec, nullptr, MNN_H2O_ELEM_BF16, 2, dims, frame.data(), frame.size(), &written) ==
              MNN_H2O_ERR_INVALID_ARGUMENT,
          "null data");
    CHECK(mnn_h2o_codec_decode(codec, frame.data(), 20, back.data(), back.size() * 2, nullptr) == MNN_H2O_ERR_TRUNCATED,
          "truncated: %s", mnn_h2o_last_error());
    CHECK(mnn_h2o_codec_decode(codec, frame.data(), cpp_frame.size(), back.data(), 100, nullptr) ==
              MNN_H2O_ERR_OUTPUT_TOO_SMALL,
          "output too small");
    std::vector<uint8_t> bad = cpp_frame;
    bad[0] ^= 1;
    CHECK(mnn_h2o_codec_decode(codec, bad.data(), bad.size(), back.data(), back.size() * 2, nullptr) ==
              MNN_H2O_ERR_BAD_MAGIC,
          "bad magic");
    CHECK(mnn_h2o_codec_frame_info(bad.data(), bad.size(), &info) == MNN_H2O_ERR_BAD_MAGIC, "frame info bad magic");
    bad = cpp_frame;
    bad[bad.size() - 1] ^= 0x40;
    const mnn_h2o_status st = mnn_h2o_codec_decode(codec, bad.data(), bad.size(), back.data(), back.size() * 2, nullptr);
    CHECK(st == MNN_H2O_ERR_CHECKSUM || st == MNN_H2O_ERR_CORRUPT, "damaged payload: %s", mnn_h2o_status_name(st));
    mnn_h2o_codec_destroy(codec);
    mnn_h2o_codec_destroy(nullptr);

    o.predictors = 0x30;
    CHECK(mnn_h2o_codec_create(&o, &codec) == MNN_H2O_ERR_INVALID_ARGUMENT && codec == nullptr, "bad predictor bits");
    mnn_h2o_codec_options_init(&o);
    o.allow_zstd = 0;
    o.predictors = MNN_H2O_PREDICT_RAW;
    CHECK(mnn_h2o_codec_create(&o, &codec) == MNN_H2O_OK, "create with options");
    CHECK(mnn_h2o_codec_encode(codec, data.data(), MNN_H2O_ELEM_BF16, 2, dims, frame.data(), frame.size(), &written) ==
              MNN_H2O_OK,
          "encode raw only");
    CHECK(mnn_h2o_codec_decode(codec, frame.data(), written, back.data(), back.size() * 2, nullptr) == MNN_H2O_OK &&
              back == data,
          "decode raw only");
    mnn_h2o_codec_destroy(codec);
}

// Eviction through the C API: the same evictions, lengths, bytes and outputs as KvCache with
// the same config; config errors, explicit plans, statistics and scores.
// A C API field equals its C++ field: a string by its text, a bool as 0/1, a number by value.
template <class C, class Cpp>
static bool same_value(const C& c, const Cpp& cpp) {
    if constexpr (std::is_same_v<Cpp, std::string>)
        return c && cpp == c;
    else if constexpr (std::is_same_v<Cpp, bool>)
        return (c != 0) == cpp;
    else
        return c == static_cast<C>(cpp);
}

static void test_eviction() {
    mnn_h2o_kv_config c = small_config();
    c.max_tokens = 400;
    mnn_h2o_kv_cache* cache = nullptr;
    CHECK(mnn_h2o_kv_cache_create(&c, &cache) == MNN_H2O_OK, "create");
    if (!cache) return;

    mnn_h2o_eviction_config e;
    mnn_h2o_eviction_config_init(&e);
    const mnn_h2o::EvictionConfig d;
    // Every field of the schema's list (config_schema.h) is EvictionConfig's default.
#define MNN_H2O_SAME(field, key, CType, CppType) CHECK(same_value(e.field, d.field), "eviction default %s", #field);
    MNN_H2O_EVICTION_FIELDS(MNN_H2O_SAME)
#undef MNN_H2O_SAME
    // ... which are the config schema's (config.py through config_schema.h).
    CHECK(e.target_lossy_ratio == mnn_h2o::schema::eviction::target_lossy_ratio::kDefault &&
              e.layer_start == mnn_h2o::schema::eviction::layer_start::kDefault &&
              e.trigger_min_tokens == mnn_h2o::schema::eviction::trigger_min_tokens::kDefault &&
              std::string(e.policy) == mnn_h2o::schema::eviction::policy::kDefault,
          "eviction defaults are the schema's");
    mnn_h2o_eviction_config got;
    CHECK(mnn_h2o_kv_cache_get_eviction_config(cache, &got) == MNN_H2O_ERR_INVALID_ARGUMENT && error_mentions("off"),
          "config while off");
    int32_t nb = -1;
    CHECK(mnn_h2o_kv_cache_eviction_scores(cache, 0, nullptr, 0, &nb) == MNN_H2O_ERR_INVALID_ARGUMENT, "scores while off");
    int32_t evicted = 7;
    CHECK(mnn_h2o_kv_cache_end_step(cache, 1, 0, &evicted) == MNN_H2O_OK && evicted == 0, "end_step while off");

    e.policy = "no-such-policy";
    CHECK(mnn_h2o_kv_cache_enable_eviction(cache, &e) == MNN_H2O_ERR_INVALID_ARGUMENT && error_mentions("policy"),
          "bad policy: %s", mnn_h2o_last_error());
    // The registry's names: each is accepted, and the error lists them all.
    int n_policies = 0;
    for (const char* name; (name = mnn_h2o_policy_name(n_policies)) != nullptr; ++n_policies) {
        CHECK(error_mentions((std::string("'") + name + "'").c_str()), "the error lists %s: %s", name,
              mnn_h2o_last_error());
    }
    CHECK(n_policies == mnn_h2o::schema::eviction::policy::kChoiceCount && std::string(mnn_h2o_policy_name(0)) == "h2o" &&
              !mnn_h2o_policy_name(-1),
          "the schema's policies, h2o first (%d)", n_policies);
    for (int i = 0; i < n_policies; ++i) {
        mnn_h2o_eviction_config_init(&e);
        e.policy = mnn_h2o_policy_name(i);
        e.layer_start = 0;
        CHECK(mnn_h2o_kv_cache_enable_eviction(cache, &e) == MNN_H2O_OK, "enable %s: %s", e.policy, mnn_h2o_last_error());
    }
    e.policy = "no-such-policy";
    CHECK(mnn_h2o_kv_cache_enable_eviction(cache, &e) == MNN_H2O_ERR_INVALID_ARGUMENT, "bad policy again");
    mnn_h2o_eviction_config_init(&e);
    e.sink_tokens = 16;
    e.recent_tokens = 32;
    e.target_keep_ratio = 0.5;
    e.target_lossy_ratio = 0.0;
    e.layer_start = 0;
    e.trigger_min_tokens = 64;
    e.update_interval = 8;
    CHECK(mnn_h2o_kv_cache_enable_eviction(cache, &e) == MNN_H2O_OK, "enable: %s", mnn_h2o_last_error());
    CHECK(mnn_h2o_kv_cache_get_eviction_config(cache, &got) == MNN_H2O_OK && got.layer_end == c.n_layers &&
              std::string(got.policy) == mnn_h2o::EvictionConfig().policy && got.target_keep_ratio == 0.5,
          "config resolved");
    // The fields added with the registry pass through both ways, and are validated natively.
    mnn_h2o_eviction_config_init(&e);
    e.layer_start = 0;
    e.max_floor_share = 0.5;
    e.observation_window = 8;
    e.per_head_budget = 1;
    e.head_floor_share = 0.25;
    e.layer_budget = "pyramid";
    CHECK(mnn_h2o_kv_cache_enable_eviction(cache, &e) == MNN_H2O_OK, "enable pyramid: %s", mnn_h2o_last_error());
    CHECK(mnn_h2o_kv_cache_get_eviction_config(cache, &got) == MNN_H2O_OK && got.max_floor_share == 0.5 &&
              got.observation_window == 8 && got.head_floor_share == 0.25 &&
              std::string(got.layer_budget) == "pyramid",
          "new fields round-trip");
    e.layer_budget = "steep";
    CHECK(mnn_h2o_kv_cache_enable_eviction(cache, &e) == MNN_H2O_ERR_INVALID_ARGUMENT && error_mentions("layer_budget"),
          "bad layer_budget: %s", mnn_h2o_last_error());
    mnn_h2o_eviction_config_init(&e);
    e.layer_start = 0;
    e.target_lossy_ratio = 0.0;
    e.kv_budget_bytes = 1 << 20;
    CHECK(mnn_h2o_kv_cache_enable_eviction(cache, &e) == MNN_H2O_OK, "enable byte cap: %s", mnn_h2o_last_error());
    CHECK(mnn_h2o_kv_cache_get_eviction_config(cache, &got) == MNN_H2O_OK && got.kv_budget_bytes == (1 << 20),
          "byte cap round-trips");
    // A keep ratio or a byte cap replaces the lossy ratio, left at its default: no rewrite needed;
    // both at once is an error naming them.
    mnn_h2o_eviction_config_init(&e);
    e.layer_start = 0;
    e.target_keep_ratio = 0.5;
    CHECK(mnn_h2o_kv_cache_enable_eviction(cache, &e) == MNN_H2O_OK, "keep ratio over the default lossy ratio: %s",
          mnn_h2o_last_error());
    CHECK(mnn_h2o_kv_cache_get_eviction_config(cache, &got) == MNN_H2O_OK && got.target_keep_ratio == 0.5 &&
              got.target_lossy_ratio == mnn_h2o::schema::eviction::target_lossy_ratio::kDefault,
          "the lossy ratio is passed through unchanged");
    e.kv_budget_bytes = 1 << 20;
    CHECK(mnn_h2o_kv_cache_enable_eviction(cache, &e) == MNN_H2O_ERR_INVALID_ARGUMENT &&
              error_mentions("target_keep_ratio and kv_budget_bytes"),
          "keep ratio and byte cap: %s", mnn_h2o_last_error());
    mnn_h2o_eviction_config_init(&e);
    e.layer_start = 0;
    e.sink_tokens = 16;
    e.recent_tokens = 32;
    e.target_keep_ratio = 0.5;
    e.target_lossy_ratio = 0.0;
    e.trigger_min_tokens = 64;
    e.update_interval = 8;
    CHECK(mnn_h2o_kv_cache_enable_eviction(cache, &e) == MNN_H2O_OK, "re-enable: %s", mnn_h2o_last_error());

    // The C++ twin.
    mnn_h2o::KvCacheConfig cc;
    cc.n_layers = c.n_layers;
    cc.n_kv_heads = c.n_kv_heads;
    cc.n_heads = c.n_heads;
    cc.head_dim = c.head_dim;
    cc.dtype = static_cast<mnn_h2o::KvDtype>(c.dtype);
    cc.block_tokens = c.block_tokens;
    cc.max_tokens = c.max_tokens;
    cc.threads = c.threads;
    mnn_h2o::KvCache ref(cc);
    mnn_h2o::EvictionConfig hc;
    hc.sink_tokens = 16;
    hc.recent_tokens = 32;
    hc.target_keep_ratio = 0.5;
    hc.target_lossy_ratio = 0.0;
    hc.layer_start = 0;
    hc.trigger_min_tokens = 64;
    hc.update_interval = 8;
    ref.enable_eviction(hc);

    std::mt19937 g(3);
    int n_evicting_steps = 0;
    for (int step = 0; step < 41; ++step) {
        const int n = step == 0 ? 100 : 1;
        for (int layer = 0; layer < c.n_layers; ++layer) {
            const auto q = randoms(g, static_cast<size_t>(n) * c.n_heads * c.head_dim);
            const auto k = randoms(g, static_cast<size_t>(n) * c.n_kv_heads * c.head_dim);
            const auto v = randoms(g, k.size());
            std::vector<float> out(q.size()), out_ref(q.size());
            CHECK(mnn_h2o_kv_cache_step(cache, layer, q.data(), k.data(), v.data(), n, out.data(), nullptr, 0) ==
                      MNN_H2O_OK,
                  "step");
            ref.step(layer, q.data(), k.data(), v.data(), n, out_ref.data());
            CHECK(out == out_ref, "step %d layer %d output", step, layer);
        }
        CHECK(mnn_h2o_kv_cache_end_step(cache, n, step == 0, &evicted) == MNN_H2O_OK, "end_step");
        const bool ref_evicted = ref.end_step(n, step == 0);
        CHECK((evicted != 0) == ref_evicted, "step %d: evicted %d vs %d", step, evicted, ref_evicted);
        n_evicting_steps += evicted;
        for (int layer = 0; layer < c.n_layers; ++layer)
            for (int h = 0; h < c.n_kv_heads; ++h) {
                int32_t len = -1;
                mnn_h2o_kv_cache_length(cache, layer, h, &len);
                CHECK(len == ref.length(layer, h), "step %d layer %d head %d: length %d vs %d", step, layer, h, len,
                      ref.length(layer, h));
            }
    }
    CHECK(n_evicting_steps >= 2, "evictions happened (%d steps)", n_evicting_steps);
    CHECK(mnn_h2o_kv_cache_bytes_held(cache) == ref.bytes_held(), "bytes held");

    mnn_h2o_eviction_stats st;
    const mnn_h2o::EvictionStats rs = ref.eviction_stats();
    CHECK(mnn_h2o_kv_cache_eviction_stats(cache, &st) == MNN_H2O_OK && st.bytes_held == rs.bytes_held &&
              st.bytes_uncompressed == rs.bytes_uncompressed && st.lossy_ratio == rs.lossy_ratio &&
              st.updates == rs.updates && st.evictions > 0 && st.blocks_freed > 0 && st.lossy_ratio > 1.2,
          "stats: %zu held, %zu uncompressed, ratio %.2f, %lld evictions", st.bytes_held, st.bytes_uncompressed,
          st.lossy_ratio, static_cast<long long>(st.evictions));
    mnn_h2o_eviction_layer_stats ls;
    CHECK(mnn_h2o_kv_cache_eviction_layer_stats(cache, 1, &ls) == MNN_H2O_OK && ls.tokens_seen == 140 &&
              ls.evictions == rs.layers[1].counters.evictions && ls.bytes_held == rs.layers[1].bytes_held &&
              ls.skipped[0] == rs.layers[1].counters.skipped[0] && ls.skipped[1] == rs.layers[1].counters.skipped[1],
          "layer stats");
    CHECK(mnn_h2o_kv_cache_eviction_layer_stats(cache, 2, &ls) == MNN_H2O_ERR_INVALID_ARGUMENT, "layer stats range");

    CHECK(mnn_h2o_kv_cache_eviction_scores(cache, 1, nullptr, 0, &nb) == MNN_H2O_ERR_OUTPUT_TOO_SMALL && nb > 0,
          "scores size query");
    std::vector<float> scores(static_cast<size_t>(c.n_kv_heads) * nb);
    int ref_nb = 0;
    const std::vector<float> ref_scores = ref.eviction_scores(1, &ref_nb);
    CHECK(mnn_h2o_kv_cache_eviction_scores(cache, 1, scores.data(), scores.size(), &nb) == MNN_H2O_OK && nb == ref_nb &&
              std::memcmp(scores.data(), ref_scores.data(), scores.size() * sizeof(float)) == 0,
          "scores");

    // Explicit plans: keep [0, 16) and the last 32 tokens of layer 0 head 0.
    int32_t len = 0;
    mnn_h2o_kv_cache_length(cache, 0, 0, &len);
    const mnn_h2o_token_run bad[2] = {{0, 16}, {8, 4}};
    CHECK(mnn_h2o_kv_cache_evict(cache, 0, 0, bad, 2) == MNN_H2O_ERR_INVALID_ARGUMENT, "overlapping plan");
    CHECK(mnn_h2o_kv_cache_evict(cache, 0, 0, nullptr, 1) == MNN_H2O_ERR_INVALID_ARGUMENT, "null runs");
    const mnn_h2o_token_run plan[2] = {{0, 16}, {len - 32, 32}};
    CHECK(mnn_h2o_kv_cache_evict(cache, 0, 0, plan, 2) == MNN_H2O_OK, "evict: %s", mnn_h2o_last_error());
    int32_t after = 0;
    CHECK(mnn_h2o_kv_cache_length(cache, 0, 0, &after) == MNN_H2O_OK && after == 48, "length after plan %d", after);
    CHECK(mnn_h2o_kv_cache_eviction_layer_stats(cache, 0, &ls) == MNN_H2O_OK && ls.invalid_plans == 1, "invalid plan counted");

    CHECK(mnn_h2o_kv_cache_disable_eviction(cache) == MNN_H2O_OK, "disable");
    CHECK(mnn_h2o_kv_cache_get_eviction_config(cache, &got) == MNN_H2O_ERR_INVALID_ARGUMENT, "off again");
    CHECK(mnn_h2o_kv_cache_enable_eviction(nullptr, &e) == MNN_H2O_ERR_INVALID_ARGUMENT, "null cache");
    CHECK(mnn_h2o_kv_cache_enable_eviction(cache, nullptr) == MNN_H2O_ERR_INVALID_ARGUMENT, "null config");
    mnn_h2o_kv_cache_destroy(cache);
    std::printf("eviction: %d evicting steps, lossy ratio %.2f\n", n_evicting_steps, st.lossy_ratio);
}

// The last error belongs to the thread that failed.
static void test_last_error_per_thread() {
    int32_t len;
    CHECK(mnn_h2o_kv_cache_length(nullptr, 0, 0, &len) != MNN_H2O_OK, "fail here");
    const std::string mine = mnn_h2o_last_error();
    std::string theirs_before, theirs_after;
    std::thread t([&] {
        theirs_before = mnn_h2o_last_error();
        mnn_h2o_codec_create(nullptr, nullptr);
        theirs_after = mnn_h2o_last_error();
    });
    t.join();
    CHECK(theirs_before.empty(), "new thread starts without an error: %s", theirs_before.c_str());
    CHECK(theirs_after.find("mnn_h2o_codec_create") != std::string::npos, "thread's own error");
    CHECK(mine == mnn_h2o_last_error(), "this thread's error unchanged");
}

int main() {
    test_library();
    test_kv_cache_matches_cpp();
    test_kv_cache_dtypes();
    test_kv_cache_windows();
    test_kv_cache_bad_config_and_null();
    test_codec();
    test_eviction();
    test_last_error_per_thread();
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all C API tests passed\n");
    return 0;
}
