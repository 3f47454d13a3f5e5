// Relative-position maps phi(delta) (REFERENCE.md section 2): which row of an R-row relation
// table (aQ, aK or b) the pair (query i, key j) of one sample reads, as a function of the
// offset delta = i - j alone.
//
// Every map is held as an integer table of rows for delta in [-D, D], D = saturation(): larger
// offsets read the row of D and smaller ones the row of -D. The identity map instead covers
// exactly |delta| < L and rejects other offsets. Each row covers one contiguous interval of
// offsets (checked on construction): what constant-range reuse and atomic-free gradient
// accumulation by offset rely on.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace rag {

class RelposMap {
  public:
    // Transformer-XL: row = delta + L - 1, R = 2L - 1, valid for |delta| < L.
    static RelposMap identity(std::int64_t L);
    // Shaw: row = clip(delta, -D, D) + D, R = 2D + 1.
    static RelposMap clip(std::int64_t D);
    // T5 bidirectional buckets on rel = j - i = -delta, R = num.
    static RelposMap t5_buckets(std::int64_t num = 32, std::int64_t max_distance = 128);
    // DeBERTa-v2/v3 log buckets on delta, R = 2 * size.
    static RelposMap log_buckets(std::int64_t size = 256, std::int64_t max_position = 512);
    // A general map: table[delta + D] is the row of delta for delta in [-D, D], saturating
    // outside; R = largest row + 1. Each row's offsets must form one interval.
    static RelposMap buckets(std::vector<std::int64_t> table, std::int64_t D);

    std::int64_t rows() const { return rows_; }
    // The row of offset delta; rag::Error for an identity offset with |delta| >= L.
    std::int64_t row(std::int64_t delta) const;
    // The smallest D with row(delta) = row(D) for delta >= D and row(delta) = row(-D) for
    // delta <= -D (identity: L - 1, the largest valid offset).
    std::int64_t saturation() const { return sat_; }
    // The 2D + 1 per-offset rows for delta = -D..D (the paper's bucket expansion).
    std::vector<std::int64_t> expand(std::int64_t D) const;
    const std::string& name() const { return name_; } // "clip"
    const std::string& str() const { return str_; }   // "clip(16)", for messages

  private:
    RelposMap(std::string name, std::string str, std::vector<std::int64_t> table, bool bounded);

    std::string name_, str_;
    std::int64_t rows_ = 0, sat_ = 0;
    bool bounded_ = false;            // identity: offsets beyond the table are errors
    std::vector<std::int64_t> table_; // the row of delta is table_[delta + sat_]
};

} // namespace rag
