#include "dsl/padded_io.hpp"

#include "ir/ops/derived_names.hpp"
#include "runtime/error.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>

namespace rag {

namespace {

bool has_ragged(const RaggedTensor& t) {
    return t.shape().batched && t.shape().ragged_count() > 0;
}

} // namespace

// Each sample's storage is row-major over its ragged extents, rows of row_width elements, so
// the copy to the envelope moves runs of (last ragged extent) rows at once.
RaggedTensor to_envelope(const RaggedTensor& t) {
    if (!has_ragged(t)) return t;
    const Structure& st = t.structure();
    const auto env = st.envelope();
    std::vector<int> ragged;
    for (int a = 0; a < st.rank(); ++a)
        if (t.shape().axes[std::size_t(a)].is_ragged()) ragged.push_back(a);
    std::vector<std::int64_t> sizes;
    for (std::int64_t i = 0; i < t.batch(); ++i)
        for (int a = 0; a < st.rank(); ++a)
            sizes.push_back(t.shape().axes[std::size_t(a)].is_ragged() ? env[std::size_t(a)]
                                                                       : st.size(i, a));
    RaggedTensor out = RaggedTensor::zeros(t.dtype(), Structure::make(t.shape(), t.batch(), sizes));
    const std::size_t q = ragged.size(), es = dtype_size(t.dtype());
    const std::int64_t w = st.row_width();
    const auto* src = static_cast<const std::byte*>(t.data());
    auto* dst = static_cast<std::byte*>(out.mutable_data());
    std::vector<std::int64_t> n(q), stride(q), idx(q);
    for (std::int64_t i = 0; i < t.batch(); ++i) {
        std::int64_t runs = 1; // index tuples over the ragged axes but the last
        for (std::size_t k = 0; k < q; ++k) n[k] = st.size(i, ragged[k]);
        for (std::size_t k = q; k-- > 0;)
            stride[k] = k + 1 == q ? w : stride[k + 1] * env[std::size_t(ragged[k + 1])];
        for (std::size_t k = 0; k + 1 < q; ++k) runs *= n[k];
        const std::size_t run = std::size_t(n[q - 1] * w) * es;
        if (run == 0) continue;
        std::fill(idx.begin(), idx.end(), 0);
        std::int64_t from = st.sample_begin(i);
        for (std::int64_t r = 0; r < runs; ++r, from += n[q - 1] * w) {
            std::int64_t to = out.structure().sample_begin(i);
            for (std::size_t k = 0; k + 1 < q; ++k) to += idx[k] * stride[k];
            std::memcpy(dst + std::size_t(to) * es, src + std::size_t(from) * es, run);
            for (std::size_t k = q - 1; k-- > 0;) {
                if (++idx[k] < n[k]) break;
                idx[k] = 0;
            }
        }
    }
    return out;
}

RaggedTensor envelope_mask(const std::string& name, const std::vector<std::int64_t>& lengths) {
    const std::int64_t B = std::int64_t(lengths.size());
    const std::int64_t n = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
    std::vector<double> m(std::size_t(B * n), 0.0);
    for (std::int64_t i = 0; i < B; ++i)
        for (std::int64_t j = 0; j < lengths[std::size_t(i)]; ++j) m[std::size_t(i * n + j)] = 1;
    return RaggedTensor::from_padded(DenseArray::from_f64(DType::boolean, {B, n}, m),
                                     {Axis::ragged_of(name)},
                                     {std::vector<std::int64_t>(std::size_t(B), n)});
}

RaggedTensor from_envelope(const RaggedTensor& t,
                           const std::map<std::string, std::vector<std::int64_t>>& lengths) {
    if (!has_ragged(t)) return t;
    // An axis an op derived (`H[::4][*4]`, patches' `(H[1::2]*W[1::2])`) has lengths computed
    // from the arguments' axes it derives from.
    std::function<std::optional<std::vector<std::int64_t>>(const std::string&)> of =
        [&](const std::string& name) -> std::optional<std::vector<std::int64_t>> {
        if (auto it = lengths.find(name); it != lengths.end()) return it->second;
        if (auto f = product_factors(name)) {
            auto a = of(f->first), b = of(f->second);
            if (!a || !b) return std::nullopt;
            for (std::size_t i = 0; i < a->size(); ++i) (*a)[i] *= (*b)[i];
            return a;
        }
        const auto base = derived_base(name);
        auto l = base ? of(*base) : std::nullopt;
        if (l)
            for (std::int64_t& n : *l) n = derived_length(name, n);
        return l;
    };
    std::vector<std::vector<std::int64_t>> per_axis;
    for (const Axis& a : t.shape().axes) {
        if (!a.is_ragged()) continue;
        auto l = of(a.name);
        if (!l)
            fail("padded execution: the result ", t.schema().str(), " has the ragged axis ~",
                 a.name, ", which no argument has, so its valid extents are unknown");
        per_axis.push_back(std::move(*l));
    }
    return RaggedTensor::from_padded(t.to_padded(0.0), t.shape().axes, per_axis);
}

} // namespace rag
