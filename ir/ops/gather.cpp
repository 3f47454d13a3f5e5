// Gathering rows of a table at integer ids, its table gradient, and positions. The packed
// storage of gather's result is the ids' packed order with each id expanded to one table row
// (the appended axes are static and last in both logical and storage order), so the kernels
// copy whole rows. A batched table is gathered per sample: sample b's ids index the rows of
// sample b (GatherRows in gather.hpp).
#include "ir/ops/gather.hpp"

#include "ir/ops/kernel_util.hpp"

#include <cstring>

namespace rag {
namespace {

bool is_index_dtype(DType t) {
    return t == DType::i32 || t == DType::i64;
}

std::int64_t id_at(const RaggedTensor& ids, std::int64_t k) {
    return ids.dtype() == DType::i32 ? static_cast<const std::int32_t*>(ids.data())[k]
                                     : static_cast<const std::int64_t*>(ids.data())[k];
}

// Elements in one table row (the product of its trailing extents).
std::int64_t row_size(const RaggedTensor& table) {
    std::int64_t d = 1;
    for (int a = 1; a < table.structure().rank(); ++a) d *= table.structure().size(0, a);
    return d;
}

StructurePtr gather_structure(const Schema& out, const RaggedTensor& table,
                              const RaggedTensor& ids) {
    const Structure& is = ids.structure();
    auto tail = table.structure().sample_shape(0).subspan(1);
    return kern::make_structure(out.shape, is.batch(), [&](std::int64_t i) {
        auto s = is.sample_shape(i);
        std::vector<std::int64_t> shape(s.begin(), s.end());
        shape.insert(shape.end(), tail.begin(), tail.end());
        return shape;
    });
}

RaggedTensor gather_kernel(const RaggedTensor& table, const RaggedTensor& ids) {
    Schema out = gather_schema(table.schema(), ids.schema());
    RaggedTensor y = RaggedTensor::zeros(out.dtype, gather_structure(out, table, ids));
    const std::size_t row_bytes = std::size_t(row_size(table)) * dtype_size(table.dtype());
    const std::vector<std::int64_t> rows = gather_rows("gather", table, ids);
    for (std::size_t k = 0; k < rows.size(); ++k)
        std::memcpy(static_cast<std::byte*>(y.mutable_data()) + k * row_bytes,
                    static_cast<const std::byte*>(table.data()) + std::size_t(rows[k]) * row_bytes,
                    row_bytes);
    return y;
}

// The structure of g must be gather(table, ids)'s: the ids' sizes per sample.
void check_gather_grad(const RaggedTensor& g, const RaggedTensor& ids) {
    if (g.batch() != ids.batch())
        fail("gather_grad: batch sizes differ, ", g.batch(), " and ", ids.batch());
    const int r = ids.structure().rank();
    for (std::int64_t i = 0; i < ids.batch(); ++i) {
        auto gs = g.structure().sample_shape(i);
        auto is = ids.structure().sample_shape(i);
        if (!std::equal(is.begin(), is.end(), gs.begin(), gs.begin() + r))
            fail("gather_grad: sample ", i, ": the gradient does not have gather's result shape");
    }
}

// Row v of the result sums g's rows at the positions holding id v, in packed order, in double,
// rounded once: the CPU tier's kernel sums in the same order and precision.
RaggedTensor gather_grad_kernel(const RaggedTensor& g, const RaggedTensor& ids,
                                const RaggedTensor& table) {
    check_gather_grad(g, ids);
    const std::int64_t d = row_size(table);
    std::vector<double> acc(std::size_t(table.numel()), 0.0);
    const std::vector<double> gv = g.to_f64();
    const std::vector<std::int64_t> rows = gather_rows("gather_grad", table, ids);
    for (std::size_t k = 0; k < rows.size(); ++k)
        for (std::int64_t j = 0; j < d; ++j)
            acc[std::size_t(rows[k] * d + j)] += gv[k * std::size_t(d) + std::size_t(j)];
    return RaggedTensor::from_f64(table.dtype(), table.structure_ptr(), acc);
}

RaggedTensor positions_kernel(const RaggedTensor& x, const Attrs& at) {
    int p = 0;
    Schema out = positions_schema(x.schema(), at.get_int("axis"), &p);
    const Structure& xs = x.structure();
    auto st = kern::make_structure(out.shape, x.batch(), [&](std::int64_t i) {
        auto s = xs.sample_shape(i);
        return std::vector<std::int64_t>(s.begin(), s.begin() + p + 1);
    });
    RaggedTensor y = RaggedTensor::zeros(DType::i64, st);
    auto* v = static_cast<std::int64_t*>(y.mutable_data());
    for (std::int64_t i = 0; i < st->batch(); ++i) {
        auto view = kern::sample_view(*st, i);
        kern::for_each_index(view.shape, [&](const std::vector<std::int64_t>& idx) {
            v[view.at(idx)] = idx[std::size_t(p)];
        });
    }
    return y;
}

} // namespace

Schema gather_schema(const Schema& table, const Schema& ids, std::string_view op) {
    if (table.shape.axes.empty())
        fail(op, ": the table must have a row axis T[V, ...], got ", table.str());
    for (std::size_t a = table.shape.batched ? 1 : 0; a < table.shape.axes.size(); ++a)
        if (table.shape.axes[a].is_ragged())
            fail(op,
                 ": the table's rows must be dense (T[V, ...], or T[B, ~N, ...] gathered per "
                 "sample), got ",
                 table.str());
    if (!is_floating(table.dtype))
        fail(op, ": the table must be a floating-point array, got ", table.str());
    if (!is_index_dtype(ids.dtype)) fail(op, ": ids must be i32 or i64, got ", ids.str());
    if (table.shape.batched && !ids.shape.batched)
        fail(op,
             ": a batched table T[B, ~N, ...] is gathered per sample, so ids must be batched "
             "too, got ",
             ids.str());
    Schema out{table.dtype, ids.shape};
    out.shape.axes.insert(out.shape.axes.end(), table.shape.axes.begin() + 1,
                          table.shape.axes.end());
    return out;
}

GatherRows::GatherRows(const Structure& table, const Structure& ids)
    : batched_(table.shape().batched), rows_(table.batch() ? table.size(0, 0) : 0) {
    if (batched_ && table.batch() != ids.batch())
        fail("gather: the table has ", table.batch(), " samples but the ids have ", ids.batch());
    if (!batched_) return;
    first_.resize(std::size_t(table.batch() + 1), 0);
    for (std::int64_t i = 0; i < table.batch(); ++i)
        first_[std::size_t(i + 1)] = first_[std::size_t(i)] + table.size(i, 0);
}

Schema positions_schema(const Schema& x, std::int64_t axis, int* p) {
    const int a = kern::sample_axis(x.shape, axis, "positions");
    if (p) *p = a;
    return {DType::i64,
            Shape{x.shape.batched, {x.shape.axes.begin(), x.shape.axes.begin() + a + 1}}};
}

std::vector<std::int64_t> gather_rows(std::string_view op, const RaggedTensor& table,
                                      const RaggedTensor& ids) {
    const GatherRows rows(table.structure(), ids.structure());
    std::vector<std::int64_t> out(std::size_t(ids.numel()));
    for (std::int64_t i = 0; i < ids.batch(); ++i) {
        const std::int64_t k0 = ids.structure().sample_begin(i);
        for (std::int64_t k = k0; k < k0 + ids.structure().sample_numel(i); ++k) {
            const std::int64_t id = id_at(ids, k);
            if (id < 0 || id >= rows.count(i)) gather_id_error(op, ids.structure(), k, id, rows, i);
            out[std::size_t(k)] = rows.first(i) + id;
        }
    }
    return out;
}

void gather_id_error(std::string_view op, const Structure& ids, std::int64_t packed,
                     std::int64_t id, const GatherRows& rows, std::int64_t sample) {
    const std::int64_t local = packed - ids.sample_begin(sample);
    const auto strides = ids.sample_strides(sample);
    std::string pos = "(";
    for (int a = 0; a < ids.rank(); ++a)
        pos +=
            (a ? ", " : "") + std::to_string(local / strides[std::size_t(a)] % ids.size(sample, a));
    pos += ids.rank() == 1 ? ",)" : ")";
    const std::int64_t V = rows.count(sample);
    if (rows.batched())
        fail(op, ": sample ", sample, ", position ", pos, ": id ", id, " is outside [0, ", V,
             ") for its sample's ", V, " table rows");
    if (ids.shape().batched)
        fail(op, ": sample ", sample, ", position ", pos, ": id ", id, " is outside [0, ", V,
             ") for a table of V = ", V, " rows");
    fail(op, ": position ", pos, ": id ", id, " is outside [0, ", V, ") for a table of V = ", V,
         " rows");
}

void register_gather_ops(OpTable& t) {
    t.add({"gather",
           2,
           2,
           "gather(table, ids): rows of a dense table T[V, ...] (any float dtype) at i32/i64 ids "
           "of any schema; the result has ids' axes then table's trailing axes; an id outside "
           "[0, V) is an error naming the sample, the position and the id; the table's gradient "
           "(gather_grad) sums in a fixed order, bitwise equal across runs and thread counts. A "
           "batched table T[B, ~N, ...] (rows dense) is gathered per sample: sample b's ids "
           "index its own N_b rows",
           [](auto in, auto&) { return gather_schema(in[0], in[1]); },
           [](auto in, auto&) { return gather_kernel(in[0], in[1]); },
           [](Emitter& e, auto in, Val, Val g, auto&) -> std::vector<std::optional<Val>> {
               return {e.emit("gather_grad", {g, in[1], in[0]}), std::nullopt};
           },
           {1}});

    t.add({"gather_grad",
           3,
           3,
           "gather_grad(g, ids, table): table-shaped; row v sums g's rows where ids == v, in "
           "packed order (double accumulation, rounded once); rows no id names are zero",
           [](auto in, auto&) {
               if (in[0] != gather_schema(in[2], in[1], "gather_grad"))
                   fail("gather_grad: the gradient ", in[0].str(), " does not match gather(",
                        in[2].str(), ", ", in[1].str(), ")");
               return in[2];
           },
           [](auto in, auto&) { return gather_grad_kernel(in[0], in[1], in[2]); },
           [](Emitter& e, auto in, Val, Val g, auto&) -> std::vector<std::optional<Val>> {
               return {e.emit("gather", {g, in[1]}), std::nullopt, std::nullopt};
           },
           {1, 2}});

    t.add({"positions",
           1,
           1,
           "positions(x, axis=int): i64 with x's axes up to and including `axis` (logical, the "
           "batch axis is 0, negative from the end; not the batch axis), each element holding "
           "its index along `axis` (0 .. N_b-1 on a ragged axis); x supplies structure only and "
           "gets no gradient",
           [](auto in, auto& at) { return positions_schema(in[0], at.get_int("axis")); },
           [](auto in, auto& at) { return positions_kernel(in[0], at); },
           {}});
}

} // namespace rag
