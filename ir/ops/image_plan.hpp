// Images `[B, C, ~H, ~W]` (channels first in the type; in storage the two ragged axes come
// first, so each sample is H x W pixel rows of C values, channels last): the geometry of
// conv2d, max_pool2d, avg_pool2d, upsample2d and patches, read from an op's attributes, their
// type rules (result axes named by derived_names.hpp) and their result structures. Shared by
// the reference kernels (ir/ops/image.cpp) and the CPU tier (jit/conv.cpp, jit/pool.cpp).
#pragma once
#include "ir/attrs.hpp"
#include "runtime/structure.hpp"

#include <string_view>

namespace rag {

// A sliding window along one axis: kernel k, stride s, padding lo/hi, dilation d.
struct Window {
    std::int64_t k = 1, s = 1, lo = 0, hi = 0, d = 1;
    // PyTorch's output length floor((n + lo + hi - d (k - 1) - 1) / s) + 1, clamped at 0 (an
    // image smaller than the kernel has no output pixels).
    std::int64_t out(std::int64_t n) const;
    // Input position of output position o and tap t (may be outside [0, n)).
    std::int64_t in(std::int64_t o, std::int64_t t) const { return o * s - lo + t * d; }
};

struct Window2d {
    Window h, w;
    std::int64_t groups = 1;
};

// Attributes: kernel=[kh, kw] (pools), stride=[sh, sw], padding=[top, bottom, left, right],
// dilation=[dh, dw], groups (conv2d), scale (upsample2d), size (patches).
Window2d conv_window(const Attrs& at, std::int64_t kh, std::int64_t kw);
Window2d pool_window(const Attrs& at);

// Checks that x is an image T[B, C, ~H, ~W] (float) and returns C.
std::int64_t image_channels(const Schema& x, std::string_view op);

// Result schemas (rag::Error naming the op on a type error). w: [Cout, Cin/groups, kh, kw];
// bias (optional): [Cout].
Schema conv2d_schema(const Schema& x, const Schema& w, const Schema* bias, const Attrs& at);
Schema pool2d_schema(const Schema& x, const Attrs& at, std::string_view op);
Schema upsample2d_schema(const Schema& x, const Attrs& at);
Schema patches_schema(const Schema& x, const Attrs& at);

// Result structures: per sample (Cout, H', W') and (P, C p p).
StructurePtr window_structure(const Shape& out, const Structure& x, const Window2d& win,
                              std::int64_t channels);
StructurePtr upsample2d_structure(const Shape& out, const Structure& x, std::int64_t scale);
StructurePtr patches_structure(const Shape& out, const Structure& x, std::int64_t p);

// g must have `want`'s per-sample sizes (the cotangent of the op's result); else rag::Error
// naming the op and the sample.
void check_same_sizes(const Structure& g, const Structure& want, std::string_view op);

} // namespace rag
