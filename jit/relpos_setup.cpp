#include "jit/relpos_setup.hpp"

#include <algorithm>

namespace rag::jit {
namespace {

// A table's head-major expansion [H][U][width] from its [R, H, width] storage.
std::vector<float> expand(const RaggedTensor& t, const RelposSetup& s, std::int64_t width) {
    std::vector<float> out(std::size_t(s.H * s.U * width));
    const std::vector<double> vals = t.to_f64();
    for (std::int64_t h = 0; h < s.H; ++h)
        for (std::int64_t u = 0; u < s.U; ++u)
            for (std::int64_t x = 0; x < width; ++x)
                out[std::size_t((h * s.U + u) * width + x)] =
                    float(vals[std::size_t((s.rows_of[std::size_t(u)] * s.H + h) * width + x)]);
    return out;
}

// The backward's parts of `strips` strips (G tokens each) per sample, and the most rows one
// reaches (WP): a part [first, end) of a sample of n tokens has offsets i - j spanning
// (end - first) + n - 1 values (fewer when causal), at most U.
struct Parts {
    std::vector<std::int64_t> list;
    std::int64_t WP = 1;
};
Parts parts_of(const RelposSetup& s, std::int64_t strips) {
    Parts p;
    for (std::size_t t = 0; t < s.tiles.size(); t += 3) {
        const std::int64_t o = s.tiles[t], n = s.tiles[t + 1], first = s.tiles[t + 2];
        if (first % (strips * s.G) != 0) continue;
        const std::int64_t end = std::min(n, first + strips * s.G);
        p.list.insert(p.list.end(), {o, n, first, end});
        p.WP = std::max(p.WP, std::min(end - first + n - 1, s.U));
    }
    return p;
}

// Bytes of the backward's table partials: per part, head and row, D floats for each of aq and
// ak and one for the bias.
double partial_bytes(const RelposSetup& s, const Parts& p) {
    const RelposShape& sh = s.shape;
    const std::int64_t per_row = (sh.aq ? sh.D : 0) + (sh.ak ? sh.D : 0) + (sh.bias ? 1 : 0);
    return 4.0 * double(std::int64_t(p.list.size() / 4) * s.H * p.WP * per_row);
}

void use(RelposSetup& s, Parts p) {
    s.parts = std::move(p.list);
    s.WP = p.WP;
}

} // namespace

double relpos_host_partial_budget(const RelposSetup& s) {
    return 4.0 * double(s.tokens * s.H * s.shape.D);
}

void relpos_split_backward(RelposSetup& s, std::int64_t pieces, double budget) {
    std::int64_t strips = 0; // per part now: whole samples, the longest one's
    for (std::size_t t = 0; t < s.parts.size(); t += 4)
        strips = std::max(strips, (s.parts[t + 3] - s.parts[t + 2] + s.G - 1) / s.G);
    budget = std::max(budget, partial_bytes(s, {s.parts, s.WP}));
    while (strips > 1 && s.part_count() * s.H < pieces) {
        Parts halved = parts_of(s, (strips + 1) / 2);
        if (partial_bytes(s, halved) > budget) break;
        strips = (strips + 1) / 2;
        use(s, std::move(halved));
    }
}

RelposSetup relpos_setup(std::span<const RaggedTensor> in, const Attrs& at, const char* op,
                         bool with_dO, bool expand_tables) {
    RelposSetup s(relpos_check(in, at, op, with_dO));
    const RelposConfig& c = s.cfg;
    const RaggedTensor& q = in[0];
    s.H = q.shape().axes[1].extent;
    s.shape = {q.dtype(),
               q.shape().axes[2].extent,
               in[2].shape().axes[2].extent,
               c.has[AQ],
               c.has[AK],
               c.has[BIAS],
               c.causal,
               c.scale};
    s.Delta = c.map.saturation();
    s.U = 2 * s.Delta + 1;
    s.rows_of = c.map.expand(s.Delta);
    std::int64_t longest = 0;
    for (std::int64_t b = 0; b < q.batch(); ++b)
        longest = std::max(longest, q.structure().size(b, 0));
    // Strips of G tokens reach at most W expanded rows; a whole sample reaches WP.
    s.G = 64; // = RelposShape::J: strips are staged transposed in J-wide tiles
    s.W = std::min(longest + s.G - 1, s.U);
    s.WS = std::max<std::int64_t>(std::min(longest, s.U), 1); // one token's reach
    for (std::int64_t b = 0; b < q.batch(); ++b) {
        const std::int64_t n = q.structure().size(b, 0),
                           o = q.structure().offsets()[std::size_t(b)];
        for (std::int64_t start = 0; start < n; start += s.G)
            s.tiles.insert(s.tiles.end(), {o, n, start});
    }
    use(s, parts_of(s, (longest + s.G - 1) / s.G)); // whole samples
    s.tokens = q.structure().rows();
    if (expand_tables) relpos_expand_tables(s, in);
    return s;
}

void relpos_expand_tables(RelposSetup& s, std::span<const RaggedTensor> in) {
    const RelposConfig& c = s.cfg;
    if (c.has[AQ]) s.eq = expand(in[std::size_t(c.table_at[AQ])], s, s.shape.D);
    if (c.has[AK]) s.ek = expand(in[std::size_t(c.table_at[AK])], s, s.shape.D);
    if (c.has[BIAS]) s.eb = expand(in[std::size_t(c.table_at[BIAS])], s, 1);
}

void relpos_use_tensor_cores(RelposSetup& s) {
    s.shape.tensor_cores = true;
    const bool bf16 = s.shape.dtype == DType::bf16;
    auto round = [&](const std::vector<float>& t, std::vector<std::uint16_t>& half) {
        half.resize(t.size());
        std::transform(t.begin(), t.end(), half.begin(),
                       [&](float x) { return bf16 ? float_to_bf16(x) : float_to_half(x); });
    };
    round(s.eq, s.eq_half);
    round(s.ek, s.ek_half);
}

std::vector<double> relpos_fold_table_grad(const float* expanded, const RelposSetup& s,
                                           std::int64_t width) {
    const std::int64_t R = s.cfg.map.rows();
    std::vector<double> out(std::size_t(R * s.H * width), 0.0);
    for (std::int64_t u = 0; u < s.U; ++u)
        for (std::int64_t h = 0; h < s.H; ++h)
            for (std::int64_t x = 0; x < width; ++x)
                out[std::size_t((s.rows_of[std::size_t(u)] * s.H + h) * width + x)] +=
                    double(expanded[(h * s.U + u) * width + x]);
    return out;
}

} // namespace rag::jit
