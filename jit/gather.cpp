#include "jit/gather.hpp"

#include "ir/ops/gather.hpp"
#include "jit/uninitialized.hpp"
#include "runtime/error.hpp"
#include "runtime/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>

namespace rag::jit {
namespace {

template <class I> const I* ids_as(const RaggedTensor& ids) {
    return static_cast<const I*>(ids.data());
}

std::int64_t row_elements(const RaggedTensor& table) {
    std::int64_t d = 1;
    for (int a = 1; a < table.structure().rank(); ++a) d *= table.structure().size(0, a);
    return d;
}

StructurePtr gather_structure(const Shape& out, const RaggedTensor& table,
                              const RaggedTensor& ids) {
    const Structure& is = ids.structure();
    auto tail = table.structure().sample_shape(0).subspan(1);
    std::vector<std::int64_t> sizes;
    for (std::int64_t i = 0; i < is.batch(); ++i) {
        auto s = is.sample_shape(i);
        sizes.insert(sizes.end(), s.begin(), s.end());
        sizes.insert(sizes.end(), tail.begin(), tail.end());
    }
    return Structure::make(out, is.batch(), std::move(sizes));
}

// The packed ids' sample boundaries, for finding the sample of an id (per-sample tables).
std::vector<std::int64_t> sample_starts(const Structure& ids) {
    std::vector<std::int64_t> starts(std::size_t(ids.batch() + 1), 0);
    for (std::int64_t i = 0; i < ids.batch(); ++i)
        starts[std::size_t(i + 1)] = ids.sample_begin(i) + ids.sample_numel(i);
    return starts;
}

template <class I>
RaggedTensor gather(const ir::Node& n, const RaggedTensor& table, const RaggedTensor& ids) {
    RaggedTensor y = uninitialized(table.dtype(), gather_structure(n.type.shape, table, ids));
    const GatherRows rows(table.structure(), ids.structure());
    const std::vector<std::int64_t> starts = sample_starts(ids.structure());
    const std::size_t row_bytes = std::size_t(row_elements(table)) * dtype_size(table.dtype());
    const I* id = ids_as<I>(ids);
    const auto* in = static_cast<const std::byte*>(table.data());
    auto* out = static_cast<std::byte*>(y.mutable_data());
    // The first bad position (lowest packed index) so the message does not depend on threads.
    std::atomic<std::int64_t> bad{ids.numel()};
    parallel_for(
        ids.numel(), std::max<std::int64_t>(1, 65536 / std::max<std::size_t>(row_bytes, 1)),
        [&](std::int64_t k0, std::int64_t k1) {
            std::size_t i =
                std::size_t(std::upper_bound(starts.begin(), starts.end(), k0) - starts.begin()) -
                1;
            for (std::int64_t k = k0; k < k1; ++k) {
                while (k >= starts[i + 1]) ++i;
                const std::int64_t v = id[k];
                if (v < 0 || v >= rows.count(std::int64_t(i))) {
                    std::int64_t seen = bad.load();
                    while (k < seen && !bad.compare_exchange_weak(seen, k)) {
                    }
                    break;
                }
                std::memcpy(out + std::size_t(k) * row_bytes,
                            in + std::size_t(rows.first(std::int64_t(i)) + v) * row_bytes,
                            row_bytes);
            }
        });
    if (const std::int64_t k = bad.load(); k < ids.numel()) {
        const auto i = std::upper_bound(starts.begin(), starts.end(), k) - starts.begin() - 1;
        gather_id_error("gather", ids.structure(), k, std::int64_t(id[k]), rows, i);
    }
    return y;
}

// g's rows as doubles, then the table row rounded to T: typed for f32/f64, through the
// dtype helpers for the half types.
struct RowIo {
    DType g, t;
    void add(const void* g_data, std::int64_t at, double* acc, std::int64_t d) const {
        if (g == DType::f32) {
            const float* p = static_cast<const float*>(g_data) + at;
            for (std::int64_t j = 0; j < d; ++j) acc[j] += double(p[j]);
        } else if (g == DType::f64) {
            const double* p = static_cast<const double*>(g_data) + at;
            for (std::int64_t j = 0; j < d; ++j) acc[j] += p[j];
        } else {
            for (std::int64_t j = 0; j < d; ++j)
                acc[j] += load_as_f64(g_data, g, std::size_t(at + j));
        }
    }
    // A row read by one token when g and the table are both f32: 0.0 + x rounded back, which
    // is x with -0 made +0, in one pass. False (not handled) for the other dtypes.
    bool single_row(const void* g_data, std::int64_t at, void* t_data, std::int64_t to,
                    std::int64_t d) const {
        if (g != DType::f32 || t != DType::f32) return false;
        const float* p = static_cast<const float*>(g_data) + at;
        float* q = static_cast<float*>(t_data) + to;
        for (std::int64_t j = 0; j < d; ++j) q[j] = p[j] + 0.0f;
        return true;
    }
    void store(void* t_data, std::int64_t at, const double* acc, std::int64_t d) const {
        if (t == DType::f32) {
            float* p = static_cast<float*>(t_data) + at;
            for (std::int64_t j = 0; j < d; ++j) p[j] = float(acc[j]);
        } else if (t == DType::f64) {
            std::memcpy(static_cast<double*>(t_data) + at, acc, std::size_t(d) * sizeof(double));
        } else {
            for (std::int64_t j = 0; j < d; ++j)
                store_from_f64(t_data, t, std::size_t(at + j), acc[j]);
        }
    }
};

RaggedTensor gather_grad(const RaggedTensor& g, const RaggedTensor& ids,
                         const RaggedTensor& table) {
    const std::int64_t d = row_elements(table), n = ids.numel();
    const std::int64_t rows = d ? table.numel() / d : 0; // every sample's, for a batched table
    // Each position's packed table row, then a stable counting sort of the positions by it.
    const std::vector<std::int64_t> row = gather_rows("gather_grad", table, ids);
    std::vector<std::int64_t> start(std::size_t(rows + 1), 0);
    for (std::int64_t k = 0; k < n; ++k) ++start[std::size_t(row[std::size_t(k)] + 1)];
    for (std::int64_t v = 0; v < rows; ++v) start[std::size_t(v + 1)] += start[std::size_t(v)];
    std::vector<std::int64_t> order(static_cast<std::size_t>(n));
    std::vector<std::int64_t> next(start.begin(), start.end() - 1);
    for (std::int64_t k = 0; k < n; ++k)
        order[std::size_t(next[std::size_t(row[std::size_t(k)])]++)] = k;

    RaggedTensor dt = uninitialized(table.dtype(), table.structure_ptr());
    const RowIo io{g.dtype(), table.dtype()};
    parallel_for(rows, std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(d, 1)),
                 [&](std::int64_t v0, std::int64_t v1) {
                     std::vector<double> acc(static_cast<std::size_t>(d));
                     for (std::int64_t v = v0; v < v1; ++v) {
                         const std::int64_t p0 = start[std::size_t(v)],
                                            p1 = start[std::size_t(v + 1)];
                         // Most rows of a large vocabulary are read by no token or by one: those
                         // skip the double accumulator, with the same bits it would give.
                         if (p0 == p1) {
                             std::memset(static_cast<std::byte*>(dt.mutable_data()) +
                                             std::size_t(v * d) * dtype_size(table.dtype()),
                                         0, std::size_t(d) * dtype_size(table.dtype()));
                             continue;
                         }
                         if (p1 == p0 + 1 && io.single_row(g.data(), order[std::size_t(p0)] * d,
                                                           dt.mutable_data(), v * d, d))
                             continue;
                         std::fill(acc.begin(), acc.end(), 0.0);
                         for (std::int64_t p = p0; p < p1; ++p)
                             io.add(g.data(), order[std::size_t(p)] * d, acc.data(), d);
                         io.store(dt.mutable_data(), v * d, acc.data(), d);
                     }
                 });
    return dt;
}

// g must have gather's result structure; else the reference kernel names the sample.
bool gather_grad_matches(const RaggedTensor& g, const RaggedTensor& ids) {
    if (g.batch() != ids.batch()) return false;
    const int r = ids.structure().rank();
    for (std::int64_t i = 0; i < ids.batch(); ++i) {
        auto gs = g.structure().sample_shape(i);
        auto is = ids.structure().sample_shape(i);
        if (!std::equal(is.begin(), is.end(), gs.begin(), gs.begin() + r)) return false;
    }
    return true;
}

RaggedTensor positions(const ir::Node& n, const RaggedTensor& x) {
    int p = 0;
    positions_schema(x.schema(), n.attrs.get_int("axis"), &p);
    const Structure& xs = x.structure();
    std::vector<std::int64_t> sizes;
    for (std::int64_t i = 0; i < xs.batch(); ++i) {
        auto s = xs.sample_shape(i);
        sizes.insert(sizes.end(), s.begin(), s.begin() + p + 1);
    }
    auto st = Structure::make(n.type.shape, xs.batch(), std::move(sizes));
    RaggedTensor y = uninitialized(DType::i64, st);
    auto* v = static_cast<std::int64_t*>(y.mutable_data());
    // Axis p is the last logical axis of y, so each sample's block repeats runs of `stride`
    // equal indices 0 .. extent-1.
    parallel_for(st->batch(), 16, [&](std::int64_t i0, std::int64_t i1) {
        for (std::int64_t i = i0; i < i1; ++i) {
            const std::int64_t ext = st->size(i, p), stride = st->sample_strides(i)[std::size_t(p)];
            std::int64_t* out = v + st->sample_begin(i);
            const std::int64_t count = st->sample_numel(i);
            for (std::int64_t o = 0; o < count; o += ext * stride)
                for (std::int64_t e = 0; e < ext; ++e, out += stride)
                    std::fill(out, out + stride, e);
        }
    });
    return y;
}

} // namespace

bool is_gather_step(const ir::Node& n) {
    return n.op == "gather" || n.op == "gather_grad" || n.op == "positions";
}

RaggedTensor run_gather_step(const ir::Node& n, const std::vector<RaggedTensor>& vals) {
    auto arg = [&](std::size_t k) -> const RaggedTensor& { return vals[std::size_t(n.args[k])]; };
    if (n.op == "positions") return positions(n, arg(0));
    if (n.op == "gather")
        return arg(1).dtype() == DType::i32 ? gather<std::int32_t>(n, arg(0), arg(1))
                                            : gather<std::int64_t>(n, arg(0), arg(1));
    const RaggedTensor &g = arg(0), &ids = arg(1), &table = arg(2);
    if (!gather_grad_matches(g, ids)) return evaluate("gather_grad", {g, ids, table}, n.attrs);
    return gather_grad(g, ids, table);
}

} // namespace rag::jit
