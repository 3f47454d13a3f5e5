#include "ir/ops/kernel_util.hpp"

namespace rag::kern {

SampleView sample_view(const Structure& st, std::int64_t i) {
    auto s = st.sample_shape(i);
    return {st.sample_begin(i), {s.begin(), s.end()}, st.sample_strides(i)};
}

StructurePtr make_structure(const Shape& shape, std::int64_t batch,
                            const std::function<std::vector<std::int64_t>(std::int64_t)>& sample) {
    std::vector<std::int64_t> sizes;
    for (std::int64_t i = 0; i < batch; ++i) {
        auto s = sample(i);
        sizes.insert(sizes.end(), s.begin(), s.end());
    }
    return Structure::make(shape, batch, std::move(sizes));
}

int sample_axis(const Shape& s, std::int64_t axis, std::string_view op) {
    const int rank = s.logical_rank();
    std::int64_t a = axis < 0 ? axis + rank : axis;
    if (a < 0 || a >= rank)
        fail(op, ": axis ", axis, " is out of range for a value of rank ", rank, " ", shape_str(s));
    if (s.batched && a == 0) fail(op, ": axis 0 is the batch axis of ", shape_str(s));
    return int(a - (s.batched ? 1 : 0));
}

void require_float(const Schema& s, std::string_view op, std::string_view what) {
    if (!is_floating(s.dtype))
        fail(op, ": ", what, " must be a floating-point tensor, got ", s.str());
}

void require_same_dtype(std::span<const Schema> in, std::string_view op) {
    for (std::size_t k = 1; k < in.size(); ++k)
        if (in[k].dtype != in[0].dtype)
            fail(op, ": operands have different dtypes, ", in[0].str(), " and ", in[k].str());
}

void require_fixed(const Axis& a, std::string_view op, std::string_view what) {
    if (a.kind != AxisKind::fixed)
        fail(op, ": ", what, " must be a static axis, got ",
             a.is_ragged() ? "ragged ~" + a.name : "symbolic " + a.name);
}

RaggedTensor map_values(const RaggedTensor& t, DType out, const std::function<double(double)>& fn) {
    std::vector<double> v = t.to_f64();
    for (double& x : v) x = fn(x);
    return RaggedTensor::from_f64(out, t.structure_ptr(), v);
}

} // namespace rag::kern
