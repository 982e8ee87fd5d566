// One file: the rANS encoder and decoder share this file's private tables, levels and EG codes.
// The rANS backend (gear_rans.h); section names refer to docs/gear_format.md, "rANS backend".
#include "gear_rans.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#if !defined(__SIZEOF_INT128__)
#error "The rANS encoder divides with a 64 x 64 -> 128-bit multiply (64-bit targets)."
#endif

namespace mnn_h2o {
namespace gear {
namespace rans {

namespace {

// Longest run of 1 bits an EG code may start with.
constexpr uint32_t kMaxEgPrefix = 16;
// Order of the EG code of presence runs.
constexpr uint32_t kRunOrder = 2;
// Grouping: the rows a stream needs before it is tried (on KV top planes 2 to 4 tables save
// 1.5 % of the plane at 128 rows and 2.5 % from 256 on, but searching costs more time than coding
// below 128 rows), the widest rows it considers (the per-column histograms are columns x 256
// counters), and k-means rounds (0, 2, 4, 6 rounds: 5.414, 5.370, 5.367, 5.366 bits per symbol
// on 2048-row planes).
constexpr size_t kGroupMinRows = 128;
constexpr size_t kGroupMaxColumns = 1024;
constexpr int kGroupRounds = 4;
// The highest precision the encoder uses: on 2048-row KV planes 13 and 14 code no better than 12
// (within 0.01 %), while 4 tables of 2^12 slots (80 KB) decode 15 % faster than of 2^14.
constexpr uint32_t kEncoderMaxPrecision = 12;

// --- level scale (the "Frequencies" paragraph) ---------------------------------------------------

inline uint32_t level_value(uint32_t q, uint32_t b) {
    if (q < (2u << b)) return q;
    const uint32_t e = (q >> b) - 1;
    return ((1u << b) + (q & ((1u << b) - 1))) << e;
}

// The largest level whose value is at most 2^P.
inline uint32_t max_level(uint32_t P, uint32_t b) {
    return P >= b + 1 ? (P - b + 1) << b : 1u << P;
}

// The level nearest to v (> 0) in log scale, between 1 and qmax.
uint32_t nearest_level(double v, uint32_t b, uint32_t qmax) {
    if (v <= 1) return 1;
    const uint32_t vi = static_cast<uint32_t>(v);
    uint32_t q_lo, val_lo;
    if (vi < (2u << b)) {
        q_lo = val_lo = vi;
    } else {
        const uint32_t e = 31 - __builtin_clz(vi) - b;
        const uint32_t m = (vi >> e) - (1u << b);
        q_lo = ((e + 1) << b) + m;
        val_lo = ((1u << b) + m) << e;
    }
    if (q_lo >= qmax) return qmax;
    const double val_hi = level_value(q_lo + 1, b);
    return v * v > val_lo * val_hi ? q_lo + 1 : q_lo;
}

// --- log2 for the size estimates -----------------------------------------------------------------

class Log2Table {
public:
    Log2Table() {
        for (int i = 0; i <= kSize; ++i) frac_[i] = static_cast<float>(std::log2(1.0 + double(i) / kSize));
    }
    // log2(v) for v >= 1, to within 0.0015.
    float operator()(uint32_t v) const {
        const int e = 31 - __builtin_clz(v);
        const uint32_t m = e >= kBits ? (v >> (e - kBits)) & (kSize - 1) : (v << (kBits - e)) & (kSize - 1);
        return static_cast<float>(e) + frac_[m];
    }

private:
    static constexpr int kBits = 10;
    static constexpr int kSize = 1 << kBits;
    float frac_[kSize + 1];
};

const Log2Table& log2_table() {
    static const Log2Table t;
    return t;
}

// --- EG codes ------------------------------------------------------------------------------------

inline uint32_t eg_bits(uint32_t v, uint32_t k) {
    const uint32_t n = 31 - __builtin_clz((v >> k) + 1);
    return 2 * n + 1 + k;
}

inline uint32_t zigzag(int32_t d) { return d >= 0 ? 2u * d : 2u * static_cast<uint32_t>(-d) - 1; }

class BitWriter {
public:
    BitWriter(uint8_t* p, size_t cap) : p_(p), cap_(cap) {}
    void put(uint32_t v, uint32_t n) {  // n <= 32
        acc_ |= static_cast<uint64_t>(v) << fill_;
        fill_ += n;
        while (fill_ >= 8) {
            if (pos_ < cap_) p_[pos_] = static_cast<uint8_t>(acc_);
            ++pos_;
            acc_ >>= 8;
            fill_ -= 8;
        }
    }
    void eg(uint32_t v, uint32_t k) {
        const uint32_t n = 31 - __builtin_clz((v >> k) + 1);
        put((1u << n) - 1, n + 1);  // n ones, then a zero
        put(v - (((1u << n) - 1) << k), n + k);
    }
    // Pads to a byte with zero bits; returns the bytes written (more than cap means it did not fit).
    size_t finish() {
        if (fill_) put(0, 8 - fill_);
        return pos_;
    }

private:
    uint8_t* p_;
    size_t cap_;
    size_t pos_ = 0;
    uint64_t acc_ = 0;
    uint32_t fill_ = 0;
};

class BitReader {
public:
    BitReader(const uint8_t* p, size_t len) : p_(p), end_(p + len) {}
    bool get(uint32_t n, uint32_t* v) {  // n <= 32
        if (avail_ < n) {
            refill();
            if (avail_ < n) return false;
        }
        *v = static_cast<uint32_t>(buf_ & ((uint64_t{1} << n) - 1));
        buf_ >>= n;
        avail_ -= n;
        return true;
    }
    bool eg(uint32_t k, uint32_t* v) {
        refill();
        const uint64_t ones = ~buf_;
        const uint32_t n = ones ? static_cast<uint32_t>(__builtin_ctzll(ones)) : 64;
        if (n > kMaxEgPrefix || n >= avail_) return false;
        buf_ >>= n + 1;
        avail_ -= n + 1;
        uint32_t r;
        if (!get(n + k, &r)) return false;
        *v = (((1u << n) - 1) << k) + r;
        return true;
    }
    // After the last table: the rest of the current byte must be zero bits. Returns the bytes used
    // (0 if the padding is not zero).
    size_t finish(size_t len) {
        const uint32_t pad = avail_ % 8;
        if (buf_ & ((uint64_t{1} << pad) - 1)) return 0;
        return len - static_cast<size_t>(end_ - p_) - avail_ / 8;
    }

private:
    void refill() {
        if (end_ - p_ >= 8 && avail_ <= 56) {
            uint64_t v;
            std::memcpy(&v, p_, 8);  // little-endian host
            buf_ |= v << avail_;
            p_ += (63 - avail_) >> 3;
            avail_ |= 56;
            return;
        }
        while (avail_ <= 56 && p_ < end_) {
            buf_ |= static_cast<uint64_t>(*p_++) << avail_;
            avail_ += 8;
        }
    }
    const uint8_t* p_;
    const uint8_t* end_;
    uint64_t buf_ = 0;
    uint32_t avail_ = 0;
};

// --- tables: encoder side ------------------------------------------------------------------------

// Bits of the presence runs of the present symbols (increasing, count >= 1): an absent run before
// each present run (the first may be empty) and one after the last if it ends before 255.
uint32_t run_bits(const uint8_t* present, uint32_t count) {
    uint32_t start = present[0], bits = eg_bits(start, kRunOrder);
    for (uint32_t i = 1; i < count; ++i) {
        if (present[i] == present[i - 1] + 1u) continue;
        bits += eg_bits(present[i - 1] - start, kRunOrder);             // the present run, less 1
        bits += eg_bits(present[i] - present[i - 1] - 2u, kRunOrder);   // the absent run, less 1
        start = present[i];
    }
    bits += eg_bits(present[count - 1] - start, kRunOrder);
    if (present[count - 1] != 255) bits += eg_bits(254u - present[count - 1], kRunOrder);
    return bits;
}

// The present symbols of a histogram, in increasing order; returns their number.
uint32_t present_symbols(const uint32_t* hist, uint8_t* out) {
    uint32_t n = 0;
    for (int s = 0; s < 256; ++s) {  // without a branch: which symbols are present is irregular
        out[n] = static_cast<uint8_t>(s);
        n += hist[s] != 0;
    }
    return n;
}

// Levels for scale b: symbols whose share of M is below 1 get frequency 1, the others the level
// nearest to their share of what is left; the remainder symbol (the largest level) absorbs the
// rounding, and a few steps move single levels while that brings its frequency closer to its
// share. False if the remainder cannot be made positive (the caller's M is large enough that this
// does not happen).
bool quantize(const uint32_t* hist, uint64_t total, const uint8_t* present, uint32_t count, uint32_t P,
              uint32_t b, Table* t) {
    const uint32_t M = 1u << P, qmax = max_level(P, b);
    const double share = double(M) / double(total);
    uint32_t pinned = 0;
    double pinned_share = 0;
    for (uint32_t i = 0; i < count; ++i) {
        const double v = hist[present[i]] * share;
        if (v < 1) ++pinned, pinned_share += v;
    }
    const double scale = share * (M - pinned) / std::max(1e-9, M - pinned_share);
    std::memset(t->q, 0, sizeof t->q);
    std::memset(t->f, 0, sizeof t->f);
    uint32_t r = present[0];
    for (uint32_t i = 0; i < count; ++i) {
        const uint32_t s = present[i];
        t->q[s] = static_cast<uint16_t>(nearest_level(hist[s] * scale, b, qmax));
        t->f[s] = level_value(t->q[s], b);
        if (t->q[s] > t->q[r]) r = s;
    }
    int64_t others = 0;
    for (uint32_t i = 0; i < count; ++i)
        if (present[i] != r) others += t->f[present[i]];
    const double want = hist[r] * scale;
    const double low = std::max(1.0, 0.85 * want), high = 1.2 * want;
    const bool lower = M - others < low;
    const bool raise = !lower && M - others > high;
    // Lower (raise) the level of the symbol with the smallest (largest) hist / f, i.e. whose
    // frequency is the most over (under) its share.
    for (int step = 0; (lower || raise) && step < 64; ++step) {
        const int64_t rem = M - others;
        if (lower ? rem >= low : rem <= high) break;
        int pick = -1;
        for (uint32_t i = 0; i < count; ++i) {
            const uint32_t s = present[i];
            if (s == r) continue;
            if (lower ? t->q[s] <= 1
                      : t->q[s] + 1 >= t->q[r] || rem - (level_value(t->q[s] + 1, b) - t->f[s]) < low)
                continue;
            // hist[s] / f[s] against the pick's, without dividing
            const uint64_t a = uint64_t{hist[s]} * (pick < 0 ? 1 : t->f[pick]);
            const uint64_t c = pick < 0 ? 0 : uint64_t{hist[pick]} * t->f[s];
            if (pick < 0 || (lower ? a < c : a > c)) pick = static_cast<int>(s);
        }
        if (pick < 0) break;
        t->q[pick] = static_cast<uint16_t>(t->q[pick] + (lower ? -1 : 1));
        const uint32_t f = level_value(t->q[pick], b);
        others += int64_t(f) - int64_t(t->f[pick]);
        t->f[pick] = f;
    }
    while (others >= M) {  // only for tiny M: free what it takes, from the largest levels
        uint32_t pick = 256;
        for (uint32_t i = 0; i < count; ++i)
            if (present[i] != r && t->q[present[i]] > 1 && (pick == 256 || t->q[present[i]] > t->q[pick]))
                pick = present[i];
        if (pick == 256) return false;
        --t->q[pick];
        const uint32_t f = level_value(t->q[pick], b);
        others += int64_t(f) - int64_t(t->f[pick]);
        t->f[pick] = f;
    }
    t->f[r] = static_cast<uint32_t>(M - others);
    return true;
}

// The cheapest table (over the scales b and the delta orders k) for a histogram, with its size
// and the estimated cost of the symbols.
bool build_table(const uint32_t* hist, uint64_t total, uint32_t P, Table* best) {
    const Log2Table& lg = log2_table();
    uint8_t present[256];
    const uint32_t count = present_symbols(hist, present);
    if (count == 0) return false;
    const uint32_t runs = run_bits(present, count);
    bool found = false;
    Table t;
    // Measured on KV planes: scale b = 1 makes the cheapest tables for short streams, b = 2 or 3
    // for long ones (2 and 3 are within 0.02 %).
    const uint32_t b_first = total < (1u << 14) ? 1 : 2, b_last = total < (1u << 14) ? 1 : 3;
    for (uint32_t b = b_first; b <= b_last; ++b) {
        if (!quantize(hist, total, present, count, P, b, &t)) continue;
        double data = 0;
        uint32_t delta_bits[4] = {};
        uint32_t prev = 0;
        for (uint32_t i = 0; i < count; ++i) {
            const uint32_t s = present[i];
            data += hist[s] * (P - lg(t.f[s]));
            const uint32_t z = zigzag(int32_t(t.q[s]) - int32_t(prev));
            prev = t.q[s];
            for (uint32_t k = 0; k < 4; ++k) delta_bits[k] += eg_bits(z, k);
        }
        const uint32_t k = static_cast<uint32_t>(std::min_element(delta_bits, delta_bits + 4) - delta_bits);
        t.b = b;
        t.k = k;
        t.bits = 4 + runs + delta_bits[k];
        t.data_bits = data;
        if (!found || t.bits + t.data_bits < best->bits + best->data_bits) *best = t, found = true;
    }
    return found;
}

void write_table(BitWriter& w, const Table& t) {
    w.put(t.b, 2);
    w.put(t.k, 2);
    uint8_t present[256];
    uint32_t count = 0;
    for (int s = 0; s < 256; ++s) {
        present[count] = static_cast<uint8_t>(s);
        count += t.q[s] != 0;
    }
    // Runs as run_bits() counts them.
    uint32_t start = present[0];
    w.eg(start, kRunOrder);
    for (uint32_t i = 1; i < count; ++i) {
        if (present[i] == present[i - 1] + 1u) continue;
        w.eg(present[i - 1] - start, kRunOrder);
        w.eg(present[i] - present[i - 1] - 2u, kRunOrder);
        start = present[i];
    }
    w.eg(present[count - 1] - start, kRunOrder);
    if (present[count - 1] != 255) w.eg(254u - present[count - 1], kRunOrder);
    uint32_t prev = 0;
    for (uint32_t i = 0; i < count; ++i) {
        const uint32_t q = t.q[present[i]];
        w.eg(zigzag(int32_t(q) - int32_t(prev)), t.k);
        prev = q;
    }
}

// --- tables: decoder side ------------------------------------------------------------------------

// Reads one table (the "Tables" and "Frequencies" paragraphs) into f[256].
bool read_table(BitReader& br, uint32_t P, uint32_t* f) {
    uint32_t b, k;
    if (!br.get(2, &b) || !br.get(2, &k)) return false;
    uint8_t present[256];
    uint32_t count = 0, pos = 0;
    bool in_run = false, first = true;
    while (pos < 256) {
        uint32_t v;
        if (!br.eg(kRunOrder, &v)) return false;
        const uint32_t len = first ? v : v + 1;
        if (len > 256 - pos) return false;
        if (in_run)
            for (uint32_t s = pos; s < pos + len; ++s) present[count++] = static_cast<uint8_t>(s);
        first = false;
        pos += len;
        in_run = !in_run;
    }
    if (count == 0) return false;
    const uint32_t M = 1u << P, qmax = max_level(P, b);
    uint32_t q[256];
    int64_t prev = 0;
    uint32_t r = 0;
    for (uint32_t i = 0; i < count; ++i) {
        uint32_t z;
        if (!br.eg(k, &z)) return false;
        const int64_t level = prev + (z % 2 == 0 ? int64_t{z / 2} : -int64_t{(z + 1) / 2});
        if (level < 1 || level > qmax) return false;
        q[i] = static_cast<uint32_t>(level);
        prev = level;
        if (q[i] > q[r]) r = i;
    }
    std::memset(f, 0, 256 * sizeof(uint32_t));
    uint32_t others = 0;  // at most 255 values of at most 2^15
    for (uint32_t i = 0; i < count; ++i) {
        if (i == r) continue;
        f[present[i]] = level_value(q[i], b);
        others += f[present[i]];
    }
    if (others >= M) return false;
    f[present[r]] = M - others;
    return true;
}

// --- decoding loop (the "Decoding" paragraph) ----------------------------------------------------

inline uint32_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);  // little-endian host
    return v;
}

// Decodes one symbol with state s from the table at `base` (a multiple of M). The tables come as
// plain pointers: stores to the output bytes could alias them through a reference.
inline uint8_t decode_one(const uint32_t* slots, const uint8_t* symbols, uint32_t P, uint32_t base,
                          uint32_t& s) {
    const uint32_t slot = (s & ((1u << P) - 1)) + base;
    const uint32_t e = slots[slot];
    s = (e >> 16) * (s >> P) + (e & 0xFFFF);
    return symbols[slot];
}

// Renormalisation while at least one word is known to be left. Whether it reads a word is close
// to random, so it must not be a branch: GCC makes one of any conditional here, hence cmov in
// assembly on x86-64 (a third faster decode) and masks elsewhere (compilers for AArch64 use csel).
inline void refill_unchecked(uint32_t& s, const uint8_t* words, size_t& wi) {
    const uint32_t w = load_u16(words + 2 * wi);
    const uint32_t t = (s << 16) | w;
#if defined(__x86_64__) && defined(__GNUC__)
    asm("cmpl %[L], %[s]\n\t"
        "cmovb %[t], %[s]\n\t"
        "adcq $0, %[wi]"
        : [s] "+r"(s), [wi] "+r"(wi)
        : [t] "r"(t), [L] "i"(kL)
        : "cc");
#else
    const uint32_t m = 0u - static_cast<uint32_t>(s < kL);
    s = (t & m) | (s & ~m);
    wi += m & 1;
#endif
}

// How symbols find their table: one table; a base per column, with a multiple of 8 columns (a
// group of 8 symbols is 8 consecutive columns); a base per column, any number of columns.
enum class Layout { One, Aligned, Any };

template <Layout kLayout>
bool decode_symbols(const uint32_t* slots, const uint8_t* symbols, uint32_t P, const uint32_t* base,
                    size_t columns, uint32_t* x, const uint8_t*& wp_io, const uint8_t* end, uint8_t* out,
                    size_t n) {
    const uint8_t* const words = wp_io;
    const size_t n_words = static_cast<size_t>(end - words) / 2;
    uint32_t x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3], x4 = x[4], x5 = x[5], x6 = x[6], x7 = x[7];
    size_t wi = 0, column = 0, i = 0;
    // The table base of the next symbol (Any: column advances one per symbol).
    auto next_base = [&]() -> uint32_t {
        const uint32_t b = base[column];
        if (++column == columns) column = 0;
        return b;
    };
    // A group of 8 symbols reads at most 8 words.
    for (; i + kStates <= n && n_words - wi >= kStates; i += kStates) {
        uint32_t bs[kStates] = {};
        if (kLayout == Layout::Aligned) {
            for (uint32_t k = 0; k < kStates; ++k) bs[k] = base[column + k];
            column = column + kStates == columns ? 0 : column + kStates;
        } else if (kLayout == Layout::Any) {
            for (uint32_t k = 0; k < kStates; ++k) bs[k] = next_base();
        }
        out[i] = decode_one(slots, symbols, P, bs[0], x0);
        out[i + 1] = decode_one(slots, symbols, P, bs[1], x1);
        out[i + 2] = decode_one(slots, symbols, P, bs[2], x2);
        out[i + 3] = decode_one(slots, symbols, P, bs[3], x3);
        out[i + 4] = decode_one(slots, symbols, P, bs[4], x4);
        out[i + 5] = decode_one(slots, symbols, P, bs[5], x5);
        out[i + 6] = decode_one(slots, symbols, P, bs[6], x6);
        out[i + 7] = decode_one(slots, symbols, P, bs[7], x7);
        refill_unchecked(x0, words, wi);
        refill_unchecked(x1, words, wi);
        refill_unchecked(x2, words, wi);
        refill_unchecked(x3, words, wi);
        refill_unchecked(x4, words, wi);
        refill_unchecked(x5, words, wi);
        refill_unchecked(x6, words, wi);
        refill_unchecked(x7, words, wi);
    }
    x[0] = x0, x[1] = x1, x[2] = x2, x[3] = x3, x[4] = x4, x[5] = x5, x[6] = x6, x[7] = x7;
    for (; i < n; ++i) {
        uint32_t& s = x[i % kStates];
        out[i] = decode_one(slots, symbols, P, kLayout == Layout::One ? 0 : next_base(), s);
        if (s < kL) {
            if (wi == n_words) return false;
            s = (s << 16) | load_u16(words + 2 * wi++);
        }
    }
    wp_io = words + 2 * wi;
    return true;
}

}  // namespace

bool Decoder::decode(const uint8_t* p, size_t len, uint8_t* out, size_t n, size_t columns) {
    if (len < 1 || (n > 0 && columns == 0)) return false;
    const uint32_t P = p[0] & 15, G = ((p[0] >> 4) & 3) + 1;
    if (p[0] >> 6) return false;
    size_t pos = 1;
    const uint8_t* ids = nullptr;
    if (G > 1) {
        const size_t id_bytes = columns / 4 + (columns % 4 != 0);
        if (len - pos < id_bytes) return false;
        ids = p + pos;
        for (size_t c = 0; c < columns; ++c)
            if (((ids[c >> 2] >> (2 * (c & 3))) & 3u) >= G) return false;
        if (columns % 4 && ids[id_bytes - 1] >> (2 * (columns % 4))) return false;
        pos += id_bytes;
    }
    const uint32_t M = 1u << P;
    if (slots_.size() < size_t{G} * M) slots_.resize(size_t{G} * M);
    if (symbols_.size() < size_t{G} * M + 8) symbols_.resize(size_t{G} * M + 8);
    BitReader br(p + pos, len - pos);
    for (uint32_t g = 0; g < G; ++g) {
        uint32_t f[256];
        if (!read_table(br, P, f)) return false;
        uint32_t* slots = slots_.data() + size_t{g} * M;
        uint8_t* symbols = symbols_.data() + size_t{g} * M;
        uint32_t cum = 0;
        for (uint32_t s = 0; s < 256; ++s) {
            const uint32_t fs = f[s], top = fs << 16;
            if (!fs) continue;
            uint32_t* __restrict d = slots + cum;
            for (uint32_t j = 0; j < fs; ++j) d[j] = top | j;
            // 8 bytes at a time: what runs past this symbol's slots is overwritten by the next
            // symbol's, or lands in the 8 bytes of padding.
            const uint64_t pattern = 0x0101010101010101ull * s;
            for (uint32_t j = 0; j < fs; j += 8) std::memcpy(symbols + cum + j, &pattern, 8);
            cum += fs;
        }
    }
    const size_t table_bytes = br.finish(len - pos);
    if (table_bytes == 0) return false;
    pos += table_bytes;
    if (len - pos < 4 * kStates) return false;
    uint32_t x[kStates];
    for (uint32_t j = 0; j < kStates; ++j) {
        std::memcpy(&x[j], p + pos + 4 * j, 4);
        if (x[j] < kL) return false;
    }
    const uint8_t* wp = p + pos + 4 * kStates;
    const uint8_t* end = p + len;
    const uint32_t* slots = slots_.data();
    const uint8_t* symbols = symbols_.data();
    bool ok;
    if (G == 1 || n == 0) {
        ok = decode_symbols<Layout::One>(slots, symbols, P, nullptr, columns, x, wp, end, out, n);
    } else {
        // (No more columns than 4 per byte of ids, which the payload holds.)
        uint32_t* base = (column_base_.resize(columns), column_base_.data());
        for (size_t c = 0; c < columns; ++c) base[c] = ((ids[c >> 2] >> (2 * (c & 3))) & 3u) << P;
        ok = columns % kStates == 0
                 ? decode_symbols<Layout::Aligned>(slots, symbols, P, base, columns, x, wp, end, out, n)
                 : decode_symbols<Layout::Any>(slots, symbols, P, base, columns, x, wp, end, out, n);
    }
    if (!ok || wp != end) return false;
    for (uint32_t j = 0; j < kStates; ++j)
        if (x[j] != kL) return false;
    return true;
}

// --- encoder -------------------------------------------------------------------------------------

namespace {

// Bytes of the payload: mode, ids, tables, states, and the words of data_bits bits (the final
// states hold about a byte of it each).
size_t payload_estimate(uint32_t n_tables, size_t columns, uint32_t table_bits, double data_bits) {
    const size_t ids = n_tables > 1 ? columns / 4 + (columns % 4 != 0) : 0;
    const double words = std::max(0.0, data_bits / 8 - kStates);
    return 1 + ids + (table_bits + 7) / 8 + 4 * kStates + 2 * static_cast<size_t>(std::ceil(words / 2));
}

// The sum of h[k] * w[k] for k < n (a multiple of 8), with 8 partial sums: one float sum is a
// chain of dependent adds, which the compiler may not reorder.
float dot(const uint32_t* h, const float* w, uint32_t n) {
    float sum[8] = {};
    for (uint32_t v = 0; v < n; v += 8)
        for (int k = 0; k < 8; ++k) sum[k] += static_cast<float>(static_cast<int32_t>(h[v + k])) * w[v + k];
    return ((sum[0] + sum[1]) + (sum[2] + sum[3])) + ((sum[4] + sum[5]) + (sum[6] + sum[7]));
}

// P for a table of n symbols: log2(n) - 2 (on KV planes of 64 rows, 2^10 slots for 4160 symbols
// code as well as 2^11 or 2^12 and take less time to build; 2^9 cost 0.4 %), with M at least twice
// the symbols so that every symbol fits with room to spare for the remainder.
uint32_t choose_precision(size_t n, uint32_t symbols) {
    const size_t clamped = std::min<size_t>(std::max<size_t>(n, 1), size_t{1} << 30);
    const uint32_t log2n = 31 - __builtin_clz(static_cast<uint32_t>(clamped));
    const uint32_t by_size = log2n >= 3 ? log2n - 2 : 1;
    uint32_t need = 0;
    while ((1u << need) < 2 * symbols) ++need;
    return std::min(kMaxPrecision, std::max(std::min(by_size, kEncoderMaxPrecision), need));
}

}  // namespace

size_t Encoder::plan(const uint8_t* data, size_t n, size_t columns) {
    if (n == 0 || columns == 0) return SIZE_MAX;
    uint32_t h4[4][256] = {};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        ++h4[0][data[i]];
        ++h4[1][data[i + 1]];
        ++h4[2][data[i + 2]];
        ++h4[3][data[i + 3]];
    }
    for (; i < n; ++i) ++h4[0][data[i]];
    uint32_t hist[256];
    uint32_t symbols = 0;
    for (int s = 0; s < 256; ++s) {
        hist[s] = h4[0][s] + h4[1][s] + h4[2][s] + h4[3][s];
        symbols += hist[s] != 0;
    }
    precision_ = choose_precision(n, symbols);
    n_tables_ = 1;
    if (!build_table(hist, n, precision_, &tables_[0])) return SIZE_MAX;
    size_t best = payload_estimate(1, columns, tables_[0].bits, tables_[0].data_bits);
    if (columns < 2 || columns > kGroupMaxColumns || n / columns < kGroupMinRows) return best;

    // Grouping (informative "rANS tables"): per-column histograms; columns sorted by their mean
    // code length under the single table and cut into G equal parts; then k-means rounds (each
    // column to the group whose distribution codes it cheapest). Histograms and costs cover the
    // present symbols only, padded to a multiple of 8 for dot().
    const Log2Table& lg = log2_table();
    const size_t C = columns;
    uint8_t present[256], index_of[256];
    const uint32_t K = present_symbols(hist, present);
    const uint32_t Kp = (K + 7) & ~7u;
    for (uint32_t k = 0; k < K; ++k) index_of[present[k]] = static_cast<uint8_t>(k);
    uint32_t* ch = (column_hist_.resize(C * Kp), column_hist_.data());
    std::fill(ch, ch + C * Kp, 0u);
    for (size_t row = 0; row < n; row += C) {
        const uint8_t* d = data + row;
        const size_t width = std::min(C, n - row);
        for (size_t c = 0; c < width; ++c) ++ch[c * Kp + index_of[d[c]]];
    }
    group_scratch_.resize(2 * C);
    uint32_t* order = group_scratch_.data();
    uint32_t* assign = group_scratch_.data() + C;
    column_cost_.resize(C);
    float* cost = column_cost_.data();
    float length[256] = {};
    const float single_precision = static_cast<float>(precision_);
    for (uint32_t k = 0; k < K; ++k) length[k] = single_precision - lg(tables_[0].f[present[k]]);
    for (size_t c = 0; c < C; ++c) {
        cost[c] = dot(ch + c * Kp, length, Kp);
        order[c] = static_cast<uint32_t>(c);
    }
    // (std::sort with the index as tie-break: deterministic, and unlike stable_sort it allocates
    // nothing.)
    std::sort(order, order + C,
              [&](uint32_t a, uint32_t b) { return cost[a] < cost[b] || (cost[a] == cost[b] && a < b); });
    uint32_t group_hist[kMaxTables][256];
    Table trial[kMaxTables];
    for (uint32_t G : {2u, kMaxTables}) {
        for (size_t r = 0; r < C; ++r) assign[order[r]] = static_cast<uint32_t>(r * G / C);
        std::memset(group_hist, 0, sizeof group_hist);
        for (size_t c = 0; c < C; ++c)
            for (uint32_t k = 0; k < Kp; ++k) group_hist[assign[c]][k] += ch[c * Kp + k];
        for (int round = 0; round < kGroupRounds; ++round) {
            // -log2 of each group's symbol probabilities, smoothed: log2(2 total + 256) - log2(2 h + 1)
            float code[kMaxTables][256];
            for (uint32_t g = 0; g < G; ++g) {
                const uint64_t tot = std::accumulate(group_hist[g], group_hist[g] + Kp, uint64_t{0});
                const float lt = lg(static_cast<uint32_t>(std::min<uint64_t>(2 * tot + 256, UINT32_MAX)));
                for (uint32_t k = 0; k < Kp; ++k) code[g][k] = lt - lg(2 * group_hist[g][k] + 1);
            }
            bool moved = false;
            for (size_t c = 0; c < C; ++c) {
                const uint32_t* h = ch + c * Kp;
                float best_cost = 0;
                uint32_t best_g = 0;
                for (uint32_t g = 0; g < G; ++g) {
                    const float cg = dot(h, code[g], Kp);
                    if (g == 0 || cg < best_cost) best_cost = cg, best_g = g;
                }
                if (best_g == assign[c]) continue;
                for (uint32_t k = 0; k < Kp; ++k) {
                    group_hist[assign[c]][k] -= h[k];
                    group_hist[best_g][k] += h[k];
                }
                assign[c] = best_g;
                moved = true;
            }
            if (!moved) break;
        }
        // Back to symbol values; empty groups are dropped (a table needs a symbol).
        uint32_t renumber[kMaxTables], used = 0;
        uint32_t full[kMaxTables][256] = {};
        for (uint32_t g = 0; g < G; ++g) {
            const bool empty = std::all_of(group_hist[g], group_hist[g] + Kp, [](uint32_t h) { return h == 0; });
            renumber[g] = empty ? kMaxTables : used;
            if (empty) continue;
            for (uint32_t k = 0; k < K; ++k) full[used][present[k]] = group_hist[g][k];
            ++used;
        }
        if (used < 2) continue;
        // Each table codes a part of the symbols: its precision follows that part's size (the
        // decoder builds fewer slots), with room for all the symbols.
        const uint32_t P = choose_precision(n / used, K);
        uint32_t table_bits = 0;
        double data_bits = 0;
        bool ok = true;
        for (uint32_t g = 0; g < used && ok; ++g) {
            const uint64_t tot = std::accumulate(full[g], full[g] + 256, uint64_t{0});
            ok = build_table(full[g], tot, P, &trial[g]);
            table_bits += trial[g].bits;
            data_bits += trial[g].data_bits;
        }
        const size_t size = payload_estimate(used, C, table_bits, data_bits);
        if (!ok || size >= best) continue;
        best = size;
        precision_ = P;
        n_tables_ = used;
        std::copy(trial, trial + used, tables_);
        group_of_.resize(C);
        for (size_t c = 0; c < C; ++c) group_of_[c] = static_cast<uint8_t>(renumber[assign[c]]);
    }
    return best;
}

namespace {

// The coding step x -> floor(x / f) * M + x mod f + cum as x + bias + q * (M - f) with
// q = floor(x / f) from a multiply (the form of ryg_rans, exact here for every 32-bit x with a
// 64-bit reciprocal): f = 1 takes q = x - 1 and bias = cum + M - 1, which gives the same.
struct EncodeSymbol {
    uint64_t rcp;     // ceil(2^64 / f); 2^64 - 1 for f = 1
    uint32_t xmax16;  // emit a word while x >> 16 >= this, i.e. x >= f << (32 - P)
    uint32_t bias;
    uint32_t cmpl;  // M - f
};

EncodeSymbol encode_symbol(uint32_t f, uint32_t cum, uint32_t P) {
    const uint32_t M = 1u << P;
    if (f == 1) return {~uint64_t{0}, 1u << (16 - P), cum + M - 1, M - 1};
    return {~uint64_t{0} / f + 1, f << (16 - P), cum, M - f};
}

// floor(x * rcp / 2^64)
inline uint32_t mul_high(uint32_t x, uint64_t rcp) {
    return static_cast<uint32_t>((static_cast<unsigned __int128>(x) * rcp) >> 64);
}

// Whether a word goes out is close to random, as in the decoder: no branch (see
// refill_unchecked). The word is stored before the test and kept only if it goes out, so the
// buffer has a slot in front of the first word.
inline void encode_one(const EncodeSymbol& e, uint32_t& x, uint16_t*& wp) {
    const uint32_t high = x >> 16;
    wp[-1] = static_cast<uint16_t>(x);
    wp -= static_cast<size_t>(high >= e.xmax16);
#if defined(__x86_64__) && defined(__GNUC__)
    asm("cmpl %[m], %[h]\n\t"
        "cmovae %[h], %[x]"
        : [x] "+r"(x)
        : [h] "r"(high), [m] "r"(e.xmax16)
        : "cc");
#else
    const uint32_t m = 0u - static_cast<uint32_t>(high >= e.xmax16);
    x = (high & m) | (x & ~m);
#endif
    x += e.bias + mul_high(x, e.rcp) * e.cmpl;
}

// Codes data[n - 1] down to data[0] (the reverse of the decoder) with the table of each symbol's
// column (syms[group_of[column]], or syms[0] for Layout::One), words written back to front
// ending at wp; returns the first word.
template <Layout kLayout>
uint16_t* encode_symbols(const EncodeSymbol (*syms)[256], const uint8_t* group_of, size_t columns,
                         const uint8_t* data, size_t n, uint32_t* x, uint16_t* wp) {
    uint32_t xs[kStates];
    std::fill(xs, xs + kStates, kL);
    size_t column = (n - 1) % columns;
    auto sym = [&](size_t i) -> const EncodeSymbol& {
        const EncodeSymbol& e = syms[kLayout == Layout::One ? 0 : group_of[column]][data[i]];
        if (kLayout != Layout::One) column = column ? column - 1 : columns - 1;
        return e;
    };
    size_t i = n;
    while (i % kStates) {
        --i;
        encode_one(sym(i), xs[i % kStates], wp);
    }
    uint32_t x0 = xs[0], x1 = xs[1], x2 = xs[2], x3 = xs[3], x4 = xs[4], x5 = xs[5], x6 = xs[6], x7 = xs[7];
    for (; i >= kStates; i -= kStates) {
        if (kLayout == Layout::Aligned) {
            // column is that of symbol i - 1, the last of its group of 8 consecutive columns.
            const uint8_t* g = group_of + column - (kStates - 1);
            const uint8_t* d = data + i - kStates;
            encode_one(syms[g[7]][d[7]], x7, wp);
            encode_one(syms[g[6]][d[6]], x6, wp);
            encode_one(syms[g[5]][d[5]], x5, wp);
            encode_one(syms[g[4]][d[4]], x4, wp);
            encode_one(syms[g[3]][d[3]], x3, wp);
            encode_one(syms[g[2]][d[2]], x2, wp);
            encode_one(syms[g[1]][d[1]], x1, wp);
            encode_one(syms[g[0]][d[0]], x0, wp);
            column = column == kStates - 1 ? columns - 1 : column - kStates;
            continue;
        }
        encode_one(sym(i - 1), x7, wp);
        encode_one(sym(i - 2), x6, wp);
        encode_one(sym(i - 3), x5, wp);
        encode_one(sym(i - 4), x4, wp);
        encode_one(sym(i - 5), x3, wp);
        encode_one(sym(i - 6), x2, wp);
        encode_one(sym(i - 7), x1, wp);
        encode_one(sym(i - 8), x0, wp);
    }
    x[0] = x0, x[1] = x1, x[2] = x2, x[3] = x3, x[4] = x4, x[5] = x5, x[6] = x6, x[7] = x7;
    return wp;
}

}  // namespace

size_t Encoder::encode(const uint8_t* data, size_t n, size_t columns, uint8_t* dst, size_t cap) {
    const uint32_t P = precision_, G = n_tables_;
    EncodeSymbol syms[kMaxTables][256];
    for (uint32_t g = 0; g < G; ++g) {
        uint32_t cum = 0;
        for (int s = 0; s < 256; ++s) {
            const uint32_t f = tables_[g].f[s];
            if (f) syms[g][s] = encode_symbol(f, cum, P);
            cum += f;
        }
    }
    if (words_.size() < n + 1) words_.resize(n + 1);
    uint16_t* const wend = words_.data() + n + 1;
    uint32_t x[kStates];
    const uint8_t* group_of = group_of_.data();
    uint16_t* const wp = G == 1 ? encode_symbols<Layout::One>(syms, nullptr, columns, data, n, x, wend)
                         : columns % kStates == 0
                             ? encode_symbols<Layout::Aligned>(syms, group_of, columns, data, n, x, wend)
                             : encode_symbols<Layout::Any>(syms, group_of, columns, data, n, x, wend);
    const size_t n_words = static_cast<size_t>(wend - wp);
    const size_t id_bytes = G > 1 ? columns / 4 + (columns % 4 != 0) : 0;
    if (cap < 1 + id_bytes) return 0;
    dst[0] = static_cast<uint8_t>(P | (G - 1) << 4);
    std::memset(dst + 1, 0, id_bytes);
    for (size_t c = 0; G > 1 && c < columns; ++c)
        dst[1 + (c >> 2)] |= static_cast<uint8_t>(group_of_[c] << (2 * (c & 3)));
    size_t pos = 1 + id_bytes;
    BitWriter bw(dst + pos, cap - pos);
    for (uint32_t g = 0; g < G; ++g) write_table(bw, tables_[g]);
    const size_t table_bytes = bw.finish();
    if (table_bytes > cap - pos) return 0;
    pos += table_bytes;
    if (cap - pos < 4 * kStates || (cap - pos - 4 * kStates) / 2 < n_words) return 0;
    std::memcpy(dst + pos, x, sizeof x);  // little-endian host
    pos += sizeof x;
    std::memcpy(dst + pos, wp, 2 * n_words);
    return pos + 2 * n_words;
}

}  // namespace rans
}  // namespace gear
}  // namespace mnn_h2o
