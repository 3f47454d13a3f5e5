#include "tests/support/program.hpp"

#include "ir/autodiff.hpp"
#include "ir/interpreter.hpp"
#include "tests/support/testing.hpp"

#include <cmath>

namespace rag::testing {

ir::Function with_dtype(const ir::Function& f, DType from, DType to) {
    ir::Function g;
    g.name = f.name;
    ir::Builder b(g);
    std::vector<int> map(f.nodes.size(), -1);
    const std::string from_name(dtype_name(from)), to_name(dtype_name(to));
    for (std::size_t i = 0; i < f.nodes.size(); ++i) {
        const ir::Node& n = f.nodes[i];
        Schema t = n.type;
        if (t.dtype == from) t.dtype = to;
        if (n.op == "input") {
            map[i] = b.input(t, n.label);
        } else if (n.op == "const") {
            map[i] = b.constant(n.attrs.get_float("value"), t.dtype);
        } else {
            std::vector<int> args;
            for (int a : n.args) args.push_back(map[std::size_t(a)]);
            Attrs at = n.attrs;
            if (at.has("dtype") && at.get_str("dtype") == from_name) at.set("dtype", to_name);
            map[i] = b.op(n.op, args, at, n.label);
        }
    }
    for (int o : f.outputs) g.outputs.push_back(map[std::size_t(o)]);
    return g;
}

void check_program_gradient(const ir::Function& f, const std::vector<RaggedTensor>& inputs,
                            const std::vector<int>& wrt, double tol, int max_probes) {
    ir::Function d = ir::differentiate(f, 0, wrt);
    ir::verify(d);
    auto out = ir::interpret(d, inputs);
    ASSERT_EQ(out.size(), f.outputs.size() + wrt.size());
    EXPECT_EQ(out[0].to_f64(), ir::interpret(f, inputs)[0].to_f64());
    for (std::size_t w = 0; w < wrt.size(); ++w) {
        const std::size_t k = std::size_t(wrt[w]);
        auto an = out[f.outputs.size() + w].to_f64();
        auto x = inputs[k].to_f64();
        for (int p = 0; p < max_probes && !x.empty(); ++p) {
            std::size_t e = p == 0 ? 0 : std::size_t(randint(0, std::int64_t(x.size()) - 1));
            double h = 1e-6 * std::max(1.0, std::fabs(x[e]));
            auto at = [&](double v) {
                auto xs = x;
                xs[e] = v;
                auto in = inputs;
                in[k] = RaggedTensor::from_f64(inputs[k].dtype(), inputs[k].structure_ptr(), xs);
                return ir::interpret(f, in)[0].item();
            };
            double fd = (at(x[e] + h) - at(x[e] - h)) / (2 * h);
            EXPECT_NEAR(an[e], fd, tol * (1 + std::fabs(fd)))
                << f.name << ": d/d input " << k << " element " << e;
        }
    }
}

} // namespace rag::testing
