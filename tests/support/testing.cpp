#include "tests/support/testing.hpp"

#include "runtime/error.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

namespace rag::testing {

Nd::Nd(Shape_ s, double fill) : shape(std::move(s)) {
    std::int64_t n = 1;
    for (auto e : shape) n *= e;
    v.assign(std::size_t(n), fill);
}

std::int64_t Nd::flat(std::initializer_list<std::int64_t> idx) const {
    std::int64_t f = 0;
    std::size_t a = 0;
    for (auto i : idx) f = f * shape[a++] + i;
    return f;
}

std::mt19937& rng() {
    static std::mt19937 g(20261202);
    return g;
}

double uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng());
}

std::int64_t randint(std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng());
}

RaggedTensor random_batch(DType t, std::string_view axes, const std::vector<Shape_>& shapes,
                          double lo, double hi) {
    std::vector<DenseArray> list;
    for (const auto& s : shapes) {
        DenseArray a = DenseArray::zeros(t, s);
        for (std::int64_t k = 0; k < a.numel(); ++k) {
            double x = uniform(lo, hi);
            if (t == DType::i32 || t == DType::i64) x = std::floor(x);
            if (t == DType::boolean) x = x > 0.5 * (lo + hi);
            store_from_f64(a.bytes.data(), t, std::size_t(k), x);
        }
        list.push_back(std::move(a));
    }
    auto parsed = parse_axes(axes);
    RaggedTensor r = RaggedTensor::from_list(list, parsed);
    return r;
}

std::vector<Shape_> shapes_for(std::string_view axes, const std::vector<Shape_>& lengths) {
    auto parsed = parse_axes(axes);
    std::vector<std::string> names;
    for (const auto& a : parsed)
        if (a.is_ragged() && std::find(names.begin(), names.end(), a.name) == names.end())
            names.push_back(a.name);
    std::vector<Shape_> out;
    for (const auto& l : lengths) {
        Shape_ s;
        for (const auto& a : parsed) {
            if (a.is_ragged()) {
                auto k = std::find(names.begin(), names.end(), a.name) - names.begin();
                s.push_back(l.at(std::size_t(k)));
            } else if (a.kind == AxisKind::fixed) {
                s.push_back(a.extent);
            } else {
                s.push_back(3); // symbolic axes: one shared extent
            }
        }
        out.push_back(std::move(s));
    }
    return out;
}

std::vector<Shape_> random_lengths(std::int64_t B, int names, std::int64_t lo, std::int64_t hi) {
    std::vector<Shape_> out;
    for (std::int64_t i = 0; i < B; ++i) {
        Shape_ l;
        for (int k = 0; k < names; ++k) l.push_back(i == 0 ? lo : randint(lo, hi));
        out.push_back(std::move(l));
    }
    return out;
}

RaggedTensor random_dense(DType t, const Shape_& shape, double lo, double hi) {
    std::vector<double> v;
    std::int64_t n = 1;
    for (auto e : shape) n *= e;
    for (std::int64_t k = 0; k < n; ++k) v.push_back(uniform(lo, hi));
    return RaggedTensor::dense(DenseArray::from_f64(t, shape, v));
}

RaggedTensor random_for(const Schema& s, const std::vector<std::int64_t>& lengths, double lo,
                        double hi) {
    const bool labels = s.dtype == DType::i32 || s.dtype == DType::i64;
    auto fill = [&](const Shape_& shape) {
        std::int64_t n = 1;
        for (auto e : shape) n *= e;
        std::vector<double> v(static_cast<std::size_t>(n));
        for (double& e : v) e = labels ? double(randint(0, 1)) : uniform(lo, hi);
        return DenseArray::from_f64(s.dtype, shape, v);
    };
    if (!s.shape.batched) {
        Shape_ shape;
        for (const auto& a : s.shape.axes) shape.push_back(a.extent);
        return RaggedTensor::dense(fill(shape));
    }
    std::vector<DenseArray> list;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
        Shape_ shape;
        std::vector<std::string> names;
        for (const auto& a : s.shape.axes) {
            if (!a.is_ragged()) {
                shape.push_back(a.kind == AxisKind::fixed ? a.extent : 3);
                continue;
            }
            auto k = std::size_t(std::find(names.begin(), names.end(), a.name) - names.begin());
            if (k == names.size()) names.push_back(a.name);
            shape.push_back(k % 2 ? lengths[lengths.size() - 1 - i] : lengths[i]);
        }
        list.push_back(fill(shape));
    }
    return RaggedTensor::from_list(list, s.shape.axes, s.dtype);
}

::testing::AssertionResult close(const Nd& got, const Nd& want, double atol, double rtol) {
    if (got.shape != want.shape) {
        std::ostringstream os;
        os << "shape (";
        for (auto e : got.shape) os << e << ",";
        os << ") != expected (";
        for (auto e : want.shape) os << e << ",";
        return ::testing::AssertionFailure() << os.str() << ")";
    }
    for (std::size_t k = 0; k < got.v.size(); ++k) {
        double g = got.v[k], w = want.v[k];
        if (std::isnan(w) && std::isnan(g)) continue;
        if (std::isinf(w) && g == w) continue;
        if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w)))
            return ::testing::AssertionFailure()
                   << "element " << k << ": got " << g << ", expected " << w;
    }
    return ::testing::AssertionSuccess();
}

double rel_l2(const RaggedTensor& a, const RaggedTensor& b) {
    auto x = a.to_f64(), y = b.to_f64();
    double num = 0, den = 0;
    for (std::size_t k = 0; k < x.size(); ++k) {
        if (x[k] == y[k] && !std::isfinite(y[k])) continue; // the same infinity (an empty max)
        num += (x[k] - y[k]) * (x[k] - y[k]);
        den += y[k] * y[k];
    }
    return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

std::vector<Nd> samples(const RaggedTensor& t) {
    std::vector<Nd> out;
    for (const auto& a : t.to_list()) out.push_back(Nd::of(a));
    return out;
}

::testing::AssertionResult samples_close(const RaggedTensor& t, const std::vector<Nd>& want,
                                         double atol, double rtol) {
    auto got = samples(t);
    if (got.size() != want.size())
        return ::testing::AssertionFailure() << got.size() << " samples, expected " << want.size();
    for (std::size_t i = 0; i < got.size(); ++i) {
        auto r = close(got[i], want[i], atol, rtol);
        if (!r) return ::testing::AssertionFailure() << "sample " << i << ": " << r.message();
    }
    return ::testing::AssertionSuccess();
}

namespace {

double weighted(const RaggedTensor& y, const std::vector<double>& w) {
    auto v = y.to_f64();
    double s = 0;
    for (std::size_t k = 0; k < v.size(); ++k) s += v[k] * w[k];
    return s;
}

} // namespace

void check_vjp(std::string_view op, std::vector<RaggedTensor> args, const Attrs& at, double tol,
               int max_probes) {
    RaggedTensor y = evaluate(op, args, at);
    std::vector<double> w(static_cast<std::size_t>(y.numel()));
    for (double& x : w) x = uniform();
    RaggedTensor g = RaggedTensor::from_f64(y.dtype(), y.structure_ptr(), w);
    auto grads = evaluate_vjp(op, args, at, g);
    ASSERT_EQ(grads.size(), args.size());
    for (std::size_t k = 0; k < args.size(); ++k) {
        const auto& skip = OpTable::builtin().at(op).no_grad_args;
        if (args[k].dtype() != DType::f64 || std::count(skip.begin(), skip.end(), int(k))) continue;
        ASSERT_TRUE(grads[k].has_value()) << op << ": no gradient for floating input " << k;
        auto an = grads[k]->to_f64();
        auto x = args[k].to_f64();
        std::vector<std::size_t> probes;
        if (x.size() <= std::size_t(max_probes)) {
            for (std::size_t e = 0; e < x.size(); ++e) probes.push_back(e);
        } else {
            probes = {0, x.size() - 1};
            while (probes.size() < std::size_t(max_probes))
                probes.push_back(std::size_t(randint(0, std::int64_t(x.size()) - 1)));
        }
        for (std::size_t e : probes) {
            const double h = 1e-6 * std::max(1.0, std::fabs(x[e]));
            auto at_x = [&](double v) {
                auto xs = x;
                xs[e] = v;
                auto a = args;
                a[k] = RaggedTensor::from_f64(DType::f64, args[k].structure_ptr(), xs);
                return weighted(evaluate(op, a, at), w);
            };
            double fd = (at_x(x[e] + h) - at_x(x[e] - h)) / (2 * h);
            EXPECT_NEAR(an[e], fd, tol * (1.0 + std::fabs(fd)))
                << op << " input " << k << " element " << e << " (" << args[k].schema().str()
                << ")";
        }
    }
}

} // namespace rag::testing
