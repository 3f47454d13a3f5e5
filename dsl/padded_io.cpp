#include "dsl/padded_io.hpp"

#include "ir/ops/derived_names.hpp"
#include "runtime/error.hpp"

#include <algorithm>

namespace rag {

namespace {

bool has_ragged(const RaggedTensor& t) {
    return t.shape().batched && t.shape().ragged_count() > 0;
}

} // namespace

RaggedTensor to_envelope(const RaggedTensor& t) {
    if (!has_ragged(t)) return t;
    const auto env = t.structure().envelope();
    std::vector<std::vector<std::int64_t>> lengths;
    for (int a = 0; a < t.structure().rank(); ++a)
        if (t.shape().axes[std::size_t(a)].is_ragged())
            lengths.emplace_back(std::size_t(t.batch()), env[std::size_t(a)]);
    return RaggedTensor::from_padded(t.to_padded(0.0), t.shape().axes, lengths);
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
    std::vector<std::vector<std::int64_t>> per_axis;
    for (const Axis& a : t.shape().axes) {
        if (!a.is_ragged()) continue;
        auto it = lengths.find(a.name);
        if (it == lengths.end()) { // an axis an op derived (`H[::4][*4]`): from its base's
            auto base = derived_base(a.name);
            auto b = base ? lengths.find(*base) : lengths.end();
            if (b != lengths.end()) {
                std::vector<std::int64_t> l;
                for (std::int64_t n : b->second) l.push_back(derived_length(a.name, n));
                per_axis.push_back(std::move(l));
                continue;
            }
        }
        if (it == lengths.end())
            fail("padded execution: the result ", t.schema().str(), " has the ragged axis ~",
                 a.name, ", which no argument has, so its valid extents are unknown");
        per_axis.push_back(it->second);
    }
    return RaggedTensor::from_padded(t.to_padded(0.0), t.shape().axes, per_axis);
}

} // namespace rag
