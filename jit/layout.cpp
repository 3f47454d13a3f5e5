#include "jit/layout.hpp"

#include "ir/ops/index_plan.hpp"
#include "ir/ops/kernel_util.hpp"
#include "jit/placement.hpp"
#include "jit/uninitialized.hpp"
#include "runtime/error.hpp"
#include "runtime/parallel.hpp"

#include <algorithm>
#include <cstring>

namespace rag::jit {
namespace {

std::string trim(std::string_view s) {
    auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
    return b == std::string_view::npos ? "" : std::string(s.substr(b, e - b + 1));
}

// The items of an index spec after the batch item, if every one is ':' or 'new'.
std::optional<std::vector<bool>> keep_new_items(const Shape& x, const std::string& spec) {
    std::vector<std::string> items;
    if (!trim(spec).empty())
        for (std::size_t start = 0;;) {
            auto comma = spec.find(',', start);
            items.push_back(trim(std::string_view(spec).substr(start, comma - start)));
            if (comma == std::string::npos) break;
            start = comma + 1;
        }
    std::size_t k = 0;
    if (x.batched && !items.empty()) {
        if (items[0] != ":") return std::nullopt;
        k = 1;
    }
    std::vector<bool> is_new; // one per result axis
    int kept = 0;
    for (; k < items.size(); ++k) {
        if (items[k] != ":" && items[k] != "new") return std::nullopt;
        is_new.push_back(items[k] == "new");
        kept += items[k] == ":";
    }
    if (kept > x.sample_rank()) return std::nullopt;
    for (; kept < x.sample_rank(); ++kept) is_new.push_back(false);
    return is_new;
}

// Per-sample sizes of index(x) for a ':'/'new' spec.
std::vector<std::int64_t> indexed_sizes(const Structure& x, const std::vector<bool>& is_new) {
    std::vector<std::int64_t> sizes;
    for (std::int64_t i = 0; i < x.batch(); ++i) {
        int s = 0;
        for (bool n : is_new) sizes.push_back(n ? 1 : x.size(i, s++));
    }
    return sizes;
}

bool is_one(const Axis& a) {
    return a.kind == AxisKind::fixed && a.extent == 1;
}

// Logical axes of a shape in storage order (ragged first, then the others), extent-1 axes
// left out (they do not move any element); `from` renames axes (the source axis of each).
std::pair<std::vector<int>, std::vector<int>> storage_axes(const Shape& s,
                                                           const std::vector<int>& from) {
    std::vector<int> ragged, rest;
    for (int a = 0; a < s.sample_rank(); ++a) {
        const Axis& ax = s.axes[std::size_t(a)];
        if (is_one(ax)) continue;
        (ax.is_ragged() ? ragged : rest).push_back(from[std::size_t(a)]);
    }
    return {ragged, rest};
}

struct TransposePlan {
    LayoutKind kind = LayoutKind::none;
    int a = 0, b = 0;       // the swapped per-sample axes
    bool whole_rows = true; // permute: rows move whole (else elements move inside rows)
};

TransposePlan transpose_plan(const Shape& x, const Attrs& at) {
    TransposePlan p;
    p.a = kern::sample_axis(x, at.get_int("a"), "transpose");
    p.b = kern::sample_axis(x, at.get_int("b"), "transpose");
    std::vector<int> id(std::size_t(x.sample_rank())), perm;
    for (int k = 0; k < x.sample_rank(); ++k) id[std::size_t(k)] = k;
    perm = id;
    std::swap(perm[std::size_t(p.a)], perm[std::size_t(p.b)]);
    Shape y = x;
    std::swap(y.axes[std::size_t(p.a)], y.axes[std::size_t(p.b)]);
    auto [xr, xo] = storage_axes(x, id);
    auto [yr, yo] = storage_axes(y, perm);
    p.whole_rows = xo == yo; // else static axes move inside rows (a weight's transpose)
    p.kind = p.whole_rows && xr == yr ? LayoutKind::view : LayoutKind::permute;
    return p;
}

} // namespace

StructurePtr transposed_structure(const RaggedTensor& x, const Shape& out, int a, int b) {
    std::vector<std::int64_t> sizes = x.structure().sizes();
    const int d = x.structure().rank();
    for (std::int64_t i = 0; i < x.batch(); ++i)
        std::swap(sizes[std::size_t(i * d + a)], sizes[std::size_t(i * d + b)]);
    return Structure::make(out, x.batch(), std::move(sizes));
}

namespace {

// y = transpose(x) when only ragged axes change order: row r of y is a row of x, found from the
// ragged extents of its sample; rows are copied whole.
RaggedTensor permute_rows(const RaggedTensor& x, const StructurePtr& st, int a, int b) {
    const Structure& xs = x.structure();
    const int d = xs.rank();
    std::vector<int> ragged; // per-sample axes of y that are ragged, in logical order
    for (int k = 0; k < d; ++k)
        if (st->shape().axes[std::size_t(k)].is_ragged()) ragged.push_back(k);
    const std::size_t q = ragged.size();
    std::vector<std::int64_t> map(std::size_t(st->rows()));
    std::vector<std::int64_t> ext(q), stride(q), idx(q);
    for (std::int64_t i = 0; i < xs.batch(); ++i) {
        // Row strides of x's ragged axes (row-major over x's ragged extents, logical order).
        std::vector<std::int64_t> xstride(std::size_t(d), 0);
        std::int64_t s = 1;
        for (int k = d - 1; k >= 0; --k)
            if (xs.shape().axes[std::size_t(k)].is_ragged()) {
                xstride[std::size_t(k)] = s;
                s *= xs.size(i, k);
            }
        for (std::size_t m = 0; m < q; ++m) {
            int k = ragged[m];
            int src = k == a ? b : k == b ? a : k;
            ext[m] = st->size(i, k);
            stride[m] = xstride[std::size_t(src)];
            idx[m] = 0;
        }
        const std::int64_t begin = st->offsets()[std::size_t(i)];
        const std::int64_t rows = st->offsets()[std::size_t(i + 1)] - begin;
        for (std::int64_t r = 0; r < rows; ++r) {
            std::int64_t from = xs.offsets()[std::size_t(i)];
            for (std::size_t m = 0; m < q; ++m) from += idx[m] * stride[m];
            map[std::size_t(begin + r)] = from;
            for (std::size_t m = q; m-- > 0;) {
                if (++idx[m] < ext[m]) break;
                idx[m] = 0;
            }
        }
    }
    RaggedTensor y = uninitialized(x.dtype(), st);
    const std::size_t row_bytes = std::size_t(st->row_width()) * dtype_size(x.dtype());
    const auto* in = static_cast<const std::byte*>(x.data());
    auto* out = static_cast<std::byte*>(y.mutable_data());
    parallel_for(std::int64_t(map.size()),
                 std::max<std::int64_t>(1, 65536 / std::max<std::size_t>(row_bytes, 1)),
                 [&](std::int64_t r0, std::int64_t r1) {
                     for (std::int64_t r = r0; r < r1; ++r)
                         std::memcpy(out + std::size_t(r) * row_bytes,
                                     in + std::size_t(map[std::size_t(r)]) * row_bytes, row_bytes);
                 });
    return y;
}

// y = transpose(x) element by element: y at index idx is x at idx with axes a and b swapped.
// Both are strided per sample (kern::sample_view), so one loop nest serves every storage order;
// the (a, b) plane is walked in square tiles so reads and writes both stay in cache.
template <class E> void transpose_tiles(const RaggedTensor& x, RaggedTensor& y, int a, int b) {
    constexpr std::int64_t tile = 32;
    struct Task {
        std::int64_t x0, y0, ta, tb; // base offsets and the tile's corner in the (a, b) plane
        std::size_t sample;
    };
    std::vector<kern::SampleView> vx, vy;
    std::vector<Task> tasks;
    for (std::int64_t i = 0; i < x.batch(); ++i) {
        vx.push_back(kern::sample_view(x.structure(), i));
        vy.push_back(kern::sample_view(y.structure(), i));
        const kern::SampleView &sx = vx.back(), &sy = vy.back();
        std::vector<std::int64_t> rest = sy.shape; // y's other axes, each index visited once
        rest[std::size_t(a)] = rest[std::size_t(b)] = 1;
        kern::for_each_index(rest, [&](const std::vector<std::int64_t>& idx) {
            std::int64_t x0 = sx.base, y0 = sy.base;
            for (std::size_t k = 0; k < idx.size(); ++k) {
                x0 += idx[k] * sx.strides[k]; // a, b are 0 here: no swap needed
                y0 += idx[k] * sy.strides[k];
            }
            for (std::int64_t ta = 0; ta < sy.shape[std::size_t(a)]; ta += tile)
                for (std::int64_t tb = 0; tb < sy.shape[std::size_t(b)]; tb += tile)
                    tasks.push_back({x0, y0, ta, tb, std::size_t(i)});
        });
    }
    const E* in = static_cast<const E*>(x.data());
    E* out = static_cast<E*>(y.mutable_data());
    parallel_for(std::int64_t(tasks.size()), 4, [&](std::int64_t t0, std::int64_t t1) {
        for (std::int64_t t = t0; t < t1; ++t) {
            const Task& k = tasks[std::size_t(t)];
            const kern::SampleView &sx = vx[k.sample], &sy = vy[k.sample];
            const std::size_t ua = std::size_t(a), ub = std::size_t(b);
            // y's axis a is x's axis b and the other way round.
            const std::int64_t ya = sy.strides[ua], yb = sy.strides[ub];
            const std::int64_t xa = sx.strides[ub], xb = sx.strides[ua];
            const std::int64_t ea = std::min(sy.shape[ua], k.ta + tile);
            const std::int64_t eb = std::min(sy.shape[ub], k.tb + tile);
            for (std::int64_t ia = k.ta; ia < ea; ++ia)
                for (std::int64_t ib = k.tb; ib < eb; ++ib)
                    out[k.y0 + ia * ya + ib * yb] = in[k.x0 + ia * xa + ib * xb];
        }
    });
}

RaggedTensor transpose_elements(const RaggedTensor& x, const StructurePtr& st, int a, int b) {
    RaggedTensor y = uninitialized(x.dtype(), st);
    switch (dtype_size(x.dtype())) {
    case 1:
        transpose_tiles<std::uint8_t>(x, y, a, b);
        break;
    case 2:
        transpose_tiles<std::uint16_t>(x, y, a, b);
        break;
    case 4:
        transpose_tiles<std::uint32_t>(x, y, a, b);
        break;
    default:
        transpose_tiles<std::uint64_t>(x, y, a, b);
        break;
    }
    return y;
}

// An index spec that only slices ragged axes (and keeps or inserts the others): each result row
// is a whole row of x.
bool slices_whole_rows(const Shape& x, const std::string& spec) {
    return plan_index(x, spec).whole_rows(x);
}

// Row r of y = index(x) is row map[r] of x: per sample, y's ragged axes (x's, in order) read
// x's at start + step * index, row-major over x's ragged extents.
std::vector<std::int64_t> slice_row_map(const IndexPlan& p, const Structure& xs,
                                        const Structure& ys) {
    const int d = xs.rank();
    std::vector<int> ragged; // x's ragged axes, in logical order (y keeps them all, in order)
    for (int a = 0; a < d; ++a)
        if (xs.shape().axes[std::size_t(a)].is_ragged()) ragged.push_back(a);
    const std::size_t q = ragged.size();
    std::vector<std::int64_t> map(std::size_t(ys.rows()));
    std::vector<std::int64_t> ext(q), stride(q), idx(q);
    for (std::int64_t i = 0; i < xs.batch(); ++i) {
        const IndexPlan::Sample s = p.sample(xs, i);
        std::int64_t row_stride = 1;
        for (std::size_t m = q; m-- > 0;) {
            const int a = ragged[m];
            ext[m] = s.shape[std::size_t(p.x_out[std::size_t(a)])];
            stride[m] = row_stride * s.step[std::size_t(a)];
            row_stride *= xs.size(i, a);
            idx[m] = 0;
        }
        std::int64_t first = xs.offsets()[std::size_t(i)];
        row_stride = 1;
        for (std::size_t m = q; m-- > 0;) {
            first += s.start[std::size_t(ragged[m])] * row_stride;
            row_stride *= xs.size(i, ragged[m]);
        }
        const std::int64_t begin = ys.offsets()[std::size_t(i)];
        const std::int64_t rows = ys.offsets()[std::size_t(i + 1)] - begin;
        for (std::int64_t r = 0; r < rows; ++r) {
            std::int64_t from = first;
            for (std::size_t m = 0; m < q; ++m) from += idx[m] * stride[m];
            map[std::size_t(begin + r)] = from;
            for (std::size_t m = q; m-- > 0;) {
                if (++idx[m] < ext[m]) break;
                idx[m] = 0;
            }
        }
    }
    return map;
}

// Copies row r of `from` to row map[r] of `to` (scatter) or row map[r] of `from` to row r
// of `to` (gather), over threads; rows are distinct, so the result is the same for any split.
void copy_rows(const RaggedTensor& from, RaggedTensor& to, const std::vector<std::int64_t>& map,
               bool scatter) {
    const std::size_t row_bytes = std::size_t(to.structure().row_width()) * dtype_size(to.dtype());
    const auto* in = static_cast<const std::byte*>(from.data());
    auto* out = static_cast<std::byte*>(to.mutable_data());
    parallel_for(std::int64_t(map.size()),
                 std::max<std::int64_t>(1, 65536 / std::max<std::size_t>(row_bytes, 1)),
                 [&](std::int64_t r0, std::int64_t r1) {
                     for (std::int64_t r = r0; r < r1; ++r) {
                         const std::size_t a = std::size_t(r), b = std::size_t(map[a]);
                         std::memcpy(out + (scatter ? b : a) * row_bytes,
                                     in + (scatter ? a : b) * row_bytes, row_bytes);
                     }
                 });
}

RaggedTensor run_slice(const ir::Node& n, const std::vector<RaggedTensor>& vals) {
    const RaggedTensor& x = vals[std::size_t(n.args[0])];
    const bool grad = n.op == "index_grad";
    const RaggedTensor& src = grad ? vals[std::size_t(n.args[1])] : x; // the sliced value
    const IndexPlan p = plan_index(src.shape(), n.attrs.get_str("spec"));
    const Structure& ss = src.structure();
    std::vector<std::int64_t> sizes;
    for (std::int64_t i = 0; i < ss.batch(); ++i) {
        auto s = p.sample_shape(ss, i);
        sizes.insert(sizes.end(), s.begin(), s.end());
    }
    if (!grad) {
        RaggedTensor y = uninitialized(x.dtype(), Structure::make(p.out, ss.batch(), sizes));
        copy_rows(x, y, slice_row_map(p, ss, y.structure()), false);
        return y;
    }
    if (x.batch() != ss.batch() || x.structure().sizes() != sizes)
        return evaluate("index_grad", {x, src}, n.attrs); // names the sample
    RaggedTensor dx = RaggedTensor::zeros(src.dtype(), src.structure_ptr());
    copy_rows(x, dx, slice_row_map(p, ss, x.structure()), true);
    return dx;
}

} // namespace

LayoutKind layout_kind(const ir::Function& f, const ir::Node& n) {
    if (n.op == "index" || n.op == "index_grad") {
        const Shape& x = f.type(n.args[n.op == "index" ? 0 : 1]).shape;
        const std::string spec = n.attrs.get_str("spec");
        return keep_new_items(x, spec)      ? LayoutKind::view
               : slices_whole_rows(x, spec) ? LayoutKind::slice
                                            : LayoutKind::none;
    }
    if (n.op == "transpose") return transpose_plan(f.type(n.args[0]).shape, n.attrs).kind;
    if (n.op == "reshape") return LayoutKind::view; // the static tail is innermost storage
    return LayoutKind::none;
}

// Views (index keeping every item, reshape, index_grad, transposes of whole storage) share x's
// values through with_structure, residency included: on the GPU tier a device-resident x stays
// on the device, where taking its buffer() would download it.
RaggedTensor run_layout(const ir::Node& n, const std::vector<RaggedTensor>& vals) {
    const RaggedTensor& x = vals[std::size_t(n.args[0])];
    if ((n.op == "index" || n.op == "index_grad") &&
        !keep_new_items(vals[std::size_t(n.args.back())].shape(), n.attrs.get_str("spec")))
        return run_slice(n, vals);
    if (n.op == "index") {
        auto is_new = *keep_new_items(x.shape(), n.attrs.get_str("spec"));
        auto st = Structure::make(n.type.shape, x.batch(), indexed_sizes(x.structure(), is_new));
        return x.with_structure(st);
    }
    if (n.op == "reshape") // the op's kernel only rebuilds the structure over x's buffer
        return evaluate("reshape", {x}, n.attrs);
    if (n.op == "index_grad") {
        // index_grad(g, x): every element of x was read once, so dx is g under x's structure.
        const RaggedTensor& like = vals[std::size_t(n.args[1])];
        auto is_new = *keep_new_items(like.shape(), n.attrs.get_str("spec"));
        if (x.batch() != like.batch() ||
            x.structure().sizes() != indexed_sizes(like.structure(), is_new))
            return reference_kernel("index_grad", {x, like}, n.attrs); // names the sample
        return x.with_structure(like.structure_ptr());
    }
    const TransposePlan p = transpose_plan(x.shape(), n.attrs);
    StructurePtr st = transposed_structure(x, n.type.shape, p.a, p.b);
    if (p.kind == LayoutKind::view) return x.with_structure(st);
    return p.whole_rows ? permute_rows(x, st, p.a, p.b) : transpose_elements(x, st, p.a, p.b);
}

} // namespace rag::jit
