// The CPU tier's cross_entropy, cross_entropy_grad and dropout: compiled steps (the plan shows
// `nn`, never `reference`), against the reference interpreter (dropout bitwise; the loss and
// its gradient within f32 rounding, f64 to 1e-12), bitwise across thread counts, and the
// reference's messages for bad labels.
#include "ir/interpreter.hpp"
#include "jit/cpu_jit.hpp"
#include "jit/segmented.hpp"
#include "runtime/parallel.hpp"
#include "tests/support/program.hpp"
#include "tests/support/testing.hpp"

#include <cmath>
#include <cstring>

namespace rag {
namespace {

using namespace rag::testing;

Schema batched(DType t, std::string_view axes) {
    return {t, Shape{true, parse_axes(axes)}};
}

bool same_bits(const RaggedTensor& a, const RaggedTensor& b) {
    return a.schema() == b.schema() && a.structure().same_as(b.structure()) &&
           std::memcmp(a.data(), b.data(), std::size_t(a.numel()) * dtype_size(a.dtype())) == 0;
}

// Every output of f on threads 1, 2 and 3: bitwise the same each time; returns the first run.
std::vector<RaggedTensor> run_on_thread_counts(const ir::Function& f,
                                               const std::vector<RaggedTensor>& in) {
    auto cpu = jit::compile_cpu(f);
    std::vector<std::vector<RaggedTensor>> runs;
    for (int t : {1, 2, 3}) {
        set_num_threads(t);
        runs.push_back(cpu->run(in));
    }
    set_num_threads(0);
    for (const auto& r : runs)
        for (std::size_t k = 0; k < r.size(); ++k)
            EXPECT_TRUE(same_bits(r[k], runs[0][k])) << f.name << " output " << k;
    return runs[0];
}

// Labels in [0, K) with logits' structure minus the class axis.
RaggedTensor labels_for(const RaggedTensor& logits, DType t, std::int64_t K) {
    std::vector<DenseArray> samples;
    for (const DenseArray& s : logits.to_list()) {
        std::vector<std::int64_t> shape(s.shape.begin(), s.shape.end() - 1);
        std::int64_t n = 1;
        for (auto e : shape) n *= e;
        std::vector<double> v(static_cast<std::size_t>(n));
        for (std::size_t k = 0; k < v.size(); ++k) v[k] = double((k * 7 + 3) % std::size_t(K));
        samples.push_back(DenseArray::from_f64(t, shape, v));
    }
    auto axes = logits.shape().axes;
    axes.pop_back();
    return RaggedTensor::from_list(samples, axes);
}

// loss = cross_entropy(z, labels) and dz = its gradient for cotangent g, one function.
ir::Function cross_entropy_fn(const Schema& z, DType label_t) {
    ir::Function f;
    f.name = "cross_entropy";
    ir::Builder b(f);
    int zi = b.input(z, "z");
    auto axes = z.shape.axes;
    axes.pop_back();
    int yi = b.input({label_t, Shape{true, axes}}, "labels");
    int loss = b.op("cross_entropy", {zi, yi});
    int g = b.input(f.type(loss), "g");
    f.outputs = {loss, b.op("cross_entropy_grad", {zi, yi, g})};
    return f;
}

TEST(CompiledCrossEntropy, LossAndGradientMatchTheReferenceOnEveryThreadCount) {
    // 37: not a multiple of the vector width, so the tail runs too; 4 and 1: narrow rows, which
    // run transposed (jit/segmented.cpp, narrow_rows_typed) with 70 rows: a full block of 64
    // and a partial one.
    for (std::int64_t K : {37, 4, 1})
        for (DType t : {DType::f32, DType::f64})
            for (DType lt : {DType::i32, DType::i64})
                for (const char* inner : {"", "3, ", "~M, "}) {
                    const std::string axes = "~N, " + std::string(inner) + std::to_string(K);
                    SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::string(dtype_name(lt)) +
                                 " " + axes);
                    ir::Function f = cross_entropy_fn(batched(t, axes), lt);
                    EXPECT_EQ(jit::print(jit::compile_cpu(f)->plan(), f),
                              "nn        %2 = cross_entropy\nnn        %4 = cross_entropy_grad\n");
                    auto z = random_for(f.type(f.inputs[0]), {3, 0, 70, 1, 17}, -8.0, 8.0);
                    auto y = labels_for(z, lt, K);
                    auto g = RaggedTensor::dense(DenseArray::from_f64(t, {}, {1.7}));
                    auto got = run_on_thread_counts(f, {z, y, g});
                    auto want = ir::interpret(f, {z, y, g});
                    const double tol = t == DType::f32 ? 1e-6 : 1e-12;
                    EXPECT_NEAR(got[0].item(), want[0].item(), tol * std::abs(want[0].item()));
                    EXPECT_TRUE(got[1].structure().same_as(want[1].structure()));
                    EXPECT_LE(rel_l2(got[1], want[1]), tol);
                }
}

// The row kernels cross_entropy and attention use, on narrow rows (transposed blocks) and wide
// ones, with the reference's rules for special values: the shift is the max over non-NaN
// entries when finite, a NaN poisons its row, a row of -inf has logsumexp -inf.
TEST(RowKernels, NarrowAndWideRowsFollowTheReferenceOnSpecialValues) {
    const double inf = INFINITY, nan = NAN;
    for (std::int64_t width : {3, 4, 15, 16, 20}) {
        SCOPED_TRACE(width);
        const std::int64_t rows = 70;
        std::vector<double> x(std::size_t(rows * width));
        for (std::size_t k = 0; k < x.size(); ++k) x[k] = double(int(k * 37 % 23)) - 11.0;
        for (std::int64_t c = 0; c < width; ++c) x[std::size_t(5 * width + c)] = -inf;
        x[std::size_t(6 * width + 1)] = nan;
        x[std::size_t(7 * width + 2)] = inf;
        x[std::size_t(8 * width)] = -inf;
        for (DType t : {DType::f32, DType::f64}) {
            std::vector<double> lse(static_cast<std::size_t>(rows)), p(x.size());
            if (t == DType::f64) {
                jit::logsumexp_rows(t, x.data(), lse.data(), rows, width);
                jit::softmax_rows(t, x.data(), p.data(), rows, width, false);
            } else {
                std::vector<float> xf(x.begin(), x.end()), lf(lse.size()), pf(p.size());
                jit::logsumexp_rows(t, xf.data(), lf.data(), rows, width);
                jit::softmax_rows(t, xf.data(), pf.data(), rows, width, false);
                lse.assign(lf.begin(), lf.end());
                p.assign(pf.begin(), pf.end());
            }
            for (std::int64_t r = 0; r < rows; ++r) {
                const double* row = x.data() + r * width;
                double mx = -inf, sum = 0;
                bool has_nan = false;
                for (std::int64_t c = 0; c < width; ++c) {
                    has_nan |= std::isnan(row[c]);
                    if (!std::isnan(row[c])) mx = std::max(mx, row[c]);
                }
                const double shift = std::isfinite(mx) ? mx : 0.0;
                for (std::int64_t c = 0; c < width; ++c) sum += std::exp(row[c] - shift);
                const double want = shift + std::log(sum);
                const double got = lse[std::size_t(r)];
                SCOPED_TRACE(std::string(dtype_name(t)) + " row " + std::to_string(r));
                if (std::isnan(want) || has_nan) {
                    EXPECT_TRUE(std::isnan(got)) << got;
                } else if (std::isinf(want)) {
                    EXPECT_EQ(got, want);
                } else {
                    EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::abs(want)));
                }
                for (std::int64_t c = 0; c < width; ++c) {
                    const double pw = std::exp(row[c] - shift) / sum;
                    const double pg = p[std::size_t(r * width + c)];
                    if (std::isnan(pw)) {
                        EXPECT_TRUE(std::isnan(pg)) << c;
                    } else {
                        EXPECT_NEAR(pg, pw, 1e-6) << c;
                    }
                }
            }
        }
    }
}

TEST(CompiledCrossEntropy, NoPositionsGiveZero) {
    ir::Function f = cross_entropy_fn(batched(DType::f32, "~N, 5"), DType::i64);
    auto z = random_for(f.type(f.inputs[0]), {0, 0});
    auto y = labels_for(z, DType::i64, 5);
    auto g = RaggedTensor::dense(DenseArray::from_f64(DType::f32, {}, {1.0}));
    auto got = jit::compile_cpu(f)->run({z, y, g});
    EXPECT_EQ(got[0].item(), 0.0);
    EXPECT_EQ(got[1].numel(), 0);
}

TEST(CompiledCrossEntropy, BadLabelsGiveTheReferenceMessage) {
    ir::Function f = cross_entropy_fn(batched(DType::f32, "~N, 5"), DType::i64);
    auto z = random_for(f.type(f.inputs[0]), {2, 1, 3});
    auto y = RaggedTensor::from_list({DenseArray::from_f64(DType::i64, {2}, {0, 4}),
                                      DenseArray::from_f64(DType::i64, {1}, {1}),
                                      DenseArray::from_f64(DType::i64, {3}, {2, 5, 0})},
                                     "~N");
    auto g = RaggedTensor::dense(DenseArray::from_f64(DType::f32, {}, {1.0}));
    const std::string want = "cross_entropy: sample 2 has label 5 outside [0, 5)";
    EXPECT_EQ(error_of([&] { ir::interpret(f, {z, y, g}); }), want);
    EXPECT_EQ(error_of([&] { jit::compile_cpu(f)->run({z, y, g}); }), want);
    // Labels of another length than their logits: the sample and both shapes.
    auto short_y = RaggedTensor::from_list({DenseArray::from_f64(DType::i64, {2}, {0, 4}),
                                            DenseArray::from_f64(DType::i64, {1}, {1}),
                                            DenseArray::from_f64(DType::i64, {2}, {2, 0})},
                                           "~N");
    EXPECT_EQ(error_of([&] {
                  jit::compile_cpu(f)->run({z, short_y, g});
              }),
              "cross_entropy: sample 2 has logits of shape (3, 5) but labels of shape (2,)");
}

TEST(CompiledDropout, BitwiseTheReferenceOnEveryThreadCount) {
    for (DType t : {DType::f32, DType::f64})
        for (auto [axes, shared] :
             {std::pair{"~N, 40", -1}, std::pair{"~N, ~N, 6", 1}, std::pair{"~N, ~N, 6", 2},
              std::pair{"~N, ~N, 6", 3}, std::pair{"~N, 40", 1}, std::pair{"~N, 3, ~M", -1},
              std::pair{"~N, 3, ~M", 2}, std::pair{"~N, 3, ~M", 3}}) {
            SCOPED_TRACE(std::string(dtype_name(t)) + " " + axes + " shared " +
                         std::to_string(shared));
            ir::Function f;
            f.name = "dropout";
            ir::Builder b(f);
            int x = b.input(batched(t, axes), "x");
            Attrs at{{"p", 0.3}, {"seed", std::int64_t(41)}};
            if (shared >= 0) at.set("shared_axis", std::int64_t(shared));
            f.outputs = {b.op("dropout", {x}, at)};
            EXPECT_EQ(jit::print(jit::compile_cpu(f)->plan(), f), "nn        %1 = dropout\n");
            // 80: a sample of more than one run of 16K (runs start inside a sample); ~N, 3,
            // ~M is stored ragged axes first, so logical order is not storage order.
            auto in = random_for(f.type(x), {5, 0, 33, 1, 80});
            auto got = run_on_thread_counts(f, {in});
            EXPECT_TRUE(same_bits(got[0], ir::interpret(f, {in})[0]));
        }
}

} // namespace
} // namespace rag
