#include "jit/nn_steps.hpp"

#include "ir/ops/nn.hpp"
#include "jit/segmented.hpp"
#include "jit/uninitialized.hpp"
#include "runtime/parallel.hpp"

#include <algorithm>

namespace rag::jit {
namespace {

// Rows per task: a task's rows are one line-kernel call.
constexpr std::int64_t task_rows = 64;

RaggedTensor scalar(DType t, double v) {
    return RaggedTensor::dense(DenseArray::from_f64(t, {}, {v}));
}

template <class T>
RaggedTensor cross_entropy(const ir::Node& n, const RaggedTensor& z, const RaggedTensor& labels,
                           const RaggedTensor* g) {
    const std::vector<std::int64_t> y = checked_labels(n.op, z, labels);
    const std::int64_t K = z.shape().axes.back().extent, rows = std::int64_t(y.size());
    const T* zs = static_cast<const T*>(z.data());
    if (!g) {
        std::vector<T> lse(y.size());
        parallel_for((rows + task_rows - 1) / task_rows, 1, [&](std::int64_t a, std::int64_t e) {
            for (std::int64_t t = a; t < e; ++t) {
                const std::int64_t r0 = t * task_rows, r1 = std::min(rows, r0 + task_rows);
                logsumexp_rows(z.dtype(), zs + r0 * K, lse.data() + r0, r1 - r0, K);
            }
        });
        double s = 0;
        for (std::int64_t r = 0; r < rows; ++r)
            s += double(lse[std::size_t(r)]) - double(zs[r * K + y[std::size_t(r)]]);
        return scalar(z.dtype(), rows ? s / double(rows) : 0.0);
    }
    const T c = T(rows ? g->item() / double(rows) : 0.0);
    RaggedTensor dz = uninitialized(z.dtype(), z.structure_ptr());
    T* d = static_cast<T*>(dz.mutable_data());
    parallel_for((rows + task_rows - 1) / task_rows, 1, [&](std::int64_t a, std::int64_t e) {
        for (std::int64_t t = a; t < e; ++t) {
            const std::int64_t r0 = t * task_rows, r1 = std::min(rows, r0 + task_rows);
            softmax_rows(z.dtype(), zs + r0 * K, d + r0 * K, r1 - r0, K, false);
            for (std::int64_t r = r0; r < r1; ++r) {
                T* row = d + r * K;
                const std::int64_t label = y[std::size_t(r)];
                row[label] -= T(1);
                for (std::int64_t j = 0; j < K; ++j) row[j] *= c;
            }
        }
    });
    return dz;
}

template <class T> RaggedTensor dropout(const ir::Node& n, const RaggedTensor& x) {
    const double p = dropout_p(n.attrs);
    const std::int64_t seed = n.attrs.get_int("seed");
    RaggedTensor y = uninitialized(x.dtype(), x.structure_ptr());
    const T* xs = static_cast<const T*>(x.data());
    T* ys = static_cast<T*>(y.mutable_data());
    auto draw = [&](std::int64_t k, std::int64_t counter) {
        ys[k] = dropout_uniform(seed, counter) >= p ? T(double(xs[k]) / (1 - p)) : T(0);
    };
    if (!n.attrs.has("shared_axis")) {
        parallel_for(x.numel(), 1 << 14, [&](std::int64_t a, std::int64_t e) {
            for (std::int64_t k = a; k < e; ++k) draw(k, k);
        });
        return y;
    }
    // Shared along an axis: runs of logical elements, each stepping its own odometer.
    const int shared = dropout_shared_axis(x, n.attrs);
    const std::vector<DropoutRun> runs = dropout_runs(x.structure(), 1 << 14);
    parallel_for(std::int64_t(runs.size()), 1, [&](std::int64_t a, std::int64_t e) {
        for (std::int64_t r = a; r < e; ++r)
            for_each_dropout_counter(x.structure(), shared, runs[std::size_t(r)], draw);
    });
    return y;
}

} // namespace

bool is_nn_step(const ir::Node& n) {
    if (n.type.dtype != DType::f32 && n.type.dtype != DType::f64) return false;
    return n.op == "cross_entropy" || n.op == "cross_entropy_grad" || n.op == "dropout";
}

RaggedTensor run_nn_step(const ir::Node& n, const std::vector<RaggedTensor>& vals) {
    auto arg = [&](std::size_t k) -> const RaggedTensor& { return vals[std::size_t(n.args[k])]; };
    const bool f32 = n.type.dtype == DType::f32;
    if (n.op == "dropout") return f32 ? dropout<float>(n, arg(0)) : dropout<double>(n, arg(0));
    const RaggedTensor* g = n.op == "cross_entropy_grad" ? &arg(2) : nullptr;
    return f32 ? cross_entropy<float>(n, arg(0), arg(1), g)
               : cross_entropy<double>(n, arg(0), arg(1), g);
}

} // namespace rag::jit
