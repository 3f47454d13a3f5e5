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
    // Element e kept (counter k) or not, as the reference computes it.
    auto kept = [&](std::int64_t e, bool keep) {
        ys[e] = keep ? T(double(xs[e]) / (1 - p)) : T(0);
    };
    if (!n.attrs.has("shared_axis")) {
        parallel_for(x.numel(), 1 << 14, [&](std::int64_t a, std::int64_t e) {
            for (std::int64_t k = a; k < e; ++k) kept(k, dropout_uniform(seed, k) >= p);
        });
        return y;
    }
    // Shared along axis a: a sample's logical elements (o, s, c), o over the axes before a, s
    // along a, c over the axes after it, take the draw of (o, 0, c) for every s. A task owns
    // one o and a run of s: it draws its cells once and applies them to each s of the run (the
    // Pairformer's pair dropout draws N times fewer numbers than it has elements).
    const int a = dropout_shared_axis(x, n.attrs);
    struct Task {
        std::int64_t sample, o, s0, s1;
    };
    std::vector<Task> tasks;
    for (std::int64_t i = 0; i < x.batch(); ++i) {
        const auto shape = x.structure().sample_shape(i);
        std::int64_t outer = 1, cells = 1;
        for (int b = 0; b < a; ++b) outer *= shape[std::size_t(b)];
        for (std::size_t b = std::size_t(a) + 1; b < shape.size(); ++b) cells *= shape[b];
        // Runs of s of about 16K elements.
        const std::int64_t S = shape[std::size_t(a)];
        const std::int64_t run = std::max<std::int64_t>(1, (1 << 14) / std::max(cells, 1l));
        if (cells > 0)
            for (std::int64_t o = 0; o < outer; ++o)
                for (std::int64_t s0 = 0; s0 < S; s0 += run)
                    tasks.push_back({i, o, s0, std::min(S, s0 + run)});
    }
    parallel_for(std::int64_t(tasks.size()), 1, [&](std::int64_t t0, std::int64_t t1) {
        std::vector<unsigned char> keep;
        std::vector<std::int64_t> offs;
        for (std::int64_t t = t0; t < t1; ++t) {
            const Task& task = tasks[std::size_t(t)];
            const kern::SampleView v = kern::sample_view(x.structure(), task.sample);
            const std::size_t rank = v.shape.size(), sa = std::size_t(a);
            const auto [w, place] = dropout_weights(rank, a);
            // The counter and offset of (o, 0, 0): o's digits over the axes before a.
            std::uint64_t c0 = std::uint64_t(task.sample) * place;
            std::int64_t off0 = v.base;
            for (std::int64_t rest = task.o, b = std::int64_t(sa); b-- > 0;) {
                const std::size_t u = std::size_t(b);
                const std::int64_t d = rest % v.shape[u];
                rest /= v.shape[u];
                c0 += w[u] * std::uint64_t(d);
                off0 += v.strides[u] * d;
            }
            // The cells: an odometer over the axes after a.
            keep.clear();
            offs.clear();
            std::vector<std::int64_t> idx(rank, 0);
            std::uint64_t c = c0;
            std::int64_t off = 0;
            for (bool more = true; more;) {
                keep.push_back(dropout_uniform(seed, std::int64_t(c)) >= p);
                offs.push_back(off);
                more = false;
                for (std::size_t b = rank; b-- > sa + 1;) {
                    c += w[b];
                    off += v.strides[b];
                    if (++idx[b] < v.shape[b]) {
                        more = true;
                        break;
                    }
                    c -= w[b] * std::uint64_t(v.shape[b]);
                    off -= v.strides[b] * v.shape[b];
                    idx[b] = 0;
                }
            }
            for (std::int64_t sh = task.s0; sh < task.s1; ++sh) {
                const std::int64_t base = off0 + sh * v.strides[sa];
                for (std::size_t k = 0; k < keep.size(); ++k) kept(base + offs[k], keep[k]);
            }
        }
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
