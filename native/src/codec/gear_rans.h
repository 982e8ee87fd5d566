// The rANS backend of the Gear codec (internal to gear_codec.cpp): a static order-0 range-ANS
// coder with eight interleaved states and up to four frequency tables, one per group of columns.
// The payload layout is specified in docs/gear_format.md, "rANS backend"; the names there (P, M,
// G, levels, remainder symbol, L) are used here.
//
// Portable C++ (plus two conditional moves in x86-64 assembly, with the same in C++ elsewhere), so
// every target writes and reads the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mnn_h2o {
namespace gear {
namespace rans {

constexpr uint32_t kStates = 8;
constexpr uint32_t kMaxTables = 4;
constexpr uint32_t kMaxPrecision = 15;
constexpr uint32_t kL = 1u << 16;

// A frequency table as the format transmits it: level scale, delta code order and levels.
struct Table {
    uint32_t b = 0;          // mantissa bits of the level scale
    uint32_t k = 0;          // EG order of the level deltas
    uint16_t q[256] = {};    // levels, 0 = absent
    uint32_t f[256] = {};    // frequencies (the remainder symbol's included), summing to 2^P
    uint32_t bits = 0;       // coded size of the table
    double data_bits = 0;    // estimated cost of the symbols it was built for
};

class Decoder {
public:
    // Decodes payload[0, len) into out[0, n), byte i of column i mod `columns` (>= 1 if n > 0).
    // False when the payload breaks the format in any way; out is then unspecified.
    bool decode(const uint8_t* payload, size_t len, uint8_t* out, size_t n, size_t columns);

private:
    std::vector<uint32_t> slots_;  // per table, per slot: f << 16 | (slot - cum)
    std::vector<uint8_t> symbols_;  // per table, per slot: its symbol
    std::vector<uint32_t> column_base_;  // per column: its table's first slot
};

class Encoder {
public:
    // Chooses the precision, grouping (on long enough streams of several columns) and tables for
    // data[0, n) with `columns` columns (>= 1), and returns the estimated payload size in bytes
    // (SIZE_MAX when n is 0: the backend cannot pay).
    size_t plan(const uint8_t* data, size_t n, size_t columns);
    // Writes the payload planned by the last plan() call for the same data; returns its size,
    // or 0 when it would exceed cap.
    size_t encode(const uint8_t* data, size_t n, size_t columns, uint8_t* dst, size_t cap);

    uint32_t planned_tables() const { return n_tables_; }

private:
    uint32_t precision_ = 0;
    uint32_t n_tables_ = 1;
    Table tables_[kMaxTables];
    std::vector<uint8_t> group_of_;         // per column: its table (grouped plans only)
    std::vector<uint32_t> column_hist_;     // grouping: columns x present symbols
    std::vector<uint16_t> words_;           // encoder output, back to front
    std::vector<uint32_t> group_scratch_;   // grouping: column order and assignment
    std::vector<float> column_cost_;        // grouping: mean code length per column
};

}  // namespace rans
}  // namespace gear
}  // namespace mnn_h2o
