#include "jit/index_map.hpp"

namespace rag::jit {
namespace {

bool is_one(const Axis& a) {
    return a.kind == AxisKind::fixed && a.extent == 1;
}

} // namespace

StructurePtr broadcast_structure(const Shape& out, const std::vector<const RaggedTensor*>& ins) {
    if (ins.empty()) return nullptr;
    bool same = true;
    for (const RaggedTensor* t : ins)
        same = same && t->shape() == out && t->structure().same_as(ins[0]->structure());
    if (same) return ins[0]->structure_ptr(); // no operand is broadcast
    const std::int64_t batch = ins[0]->batch();
    for (const RaggedTensor* t : ins)
        if (!t->shape().batched || t->batch() != batch) return nullptr;
    const int d = out.sample_rank();
    std::vector<std::int64_t> sizes(std::size_t(batch * d), 1);
    std::vector<bool> known(sizes.size(), false);
    for (const RaggedTensor* t : ins)
        for (std::int64_t i = 0; i < batch; ++i)
            for (int a = 0; a < d; ++a) {
                if (is_one(t->shape().axes[std::size_t(a)]) && !is_one(out.axes[std::size_t(a)]))
                    continue; // broadcast along a
                const std::size_t k = std::size_t(i * d + a);
                const std::int64_t n = t->structure().size(i, a);
                if (known[k] && sizes[k] != n) return nullptr;
                sizes[k] = n;
                known[k] = true;
            }
    return Structure::make(out, batch, std::move(sizes));
}

std::vector<std::int64_t> gather_rows(const Structure& out, const RaggedTensor& operand) {
    const Structure& in = operand.structure();
    const int d = out.rank();
    std::vector<int> ragged; // the ragged axes of out, in logical order
    for (int a = 0; a < d; ++a)
        if (out.shape().axes[std::size_t(a)].is_ragged()) ragged.push_back(a);
    const std::size_t q = ragged.size();
    std::vector<std::int64_t> map(std::size_t(out.rows()));
    std::vector<std::int64_t> ext(q), stride(q), idx(q);
    for (std::int64_t i = 0; i < out.batch(); ++i) {
        // The operand's rows enumerate its own ragged axes row-major; an axis out has ragged
        // and the operand has as 1 is broadcast (stride 0).
        std::int64_t s = 1;
        for (std::size_t m = q; m-- > 0;) {
            ext[m] = out.size(i, ragged[m]);
            idx[m] = 0;
            if (in.shape().axes[std::size_t(ragged[m])].is_ragged()) {
                stride[m] = s;
                s *= in.size(i, ragged[m]);
            } else {
                stride[m] = 0;
            }
        }
        const std::int64_t begin = out.offsets()[std::size_t(i)];
        const std::int64_t rows = out.offsets()[std::size_t(i + 1)] - begin;
        for (std::int64_t r = 0; r < rows; ++r) {
            std::int64_t from = in.offsets()[std::size_t(i)];
            for (std::size_t m = 0; m < q; ++m) from += idx[m] * stride[m];
            map[std::size_t(begin + r)] = from * in.row_width();
            for (std::size_t m = q; m-- > 0;) {
                if (++idx[m] < ext[m]) break;
                idx[m] = 0;
            }
        }
    }
    return map;
}

} // namespace rag::jit
