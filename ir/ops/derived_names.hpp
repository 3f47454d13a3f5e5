// Canonical names of ragged axes that ops derive from others (slicing, convolution, pooling,
// upsampling). A derived name is the base name followed by tokens, each one step of its length
// function; appending a token merges it with the last one when the composed length function is
// the same for every length, so equal derivations get equal names (`N[1:][1:]` is `N[2:]`,
// two stride-2 convolutions `H[::2][::2]` are `H[::4]`). Tokens:
//   [e::s]  ceil((L - e) / s) clamped at 0 (index's slice spelling: `[e:]`, `[::s]`)
//   [+g]    L + g (a convolution whose padding exceeds its reach)
//   [*m]    L * m (nearest upsampling)
// Users write the same spelling in types (`~H[::2]`, `~H[+2]`, `~H[::4][*4]`), folded to these
// names when a file loads (frontend/lower.cpp).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace rag {

// `base` sliced by [e::s] (e >= 0, s >= 1).
std::string slice_axis_name(const std::string& base, std::int64_t e, std::int64_t s);
// `base` grown by g >= 0.
std::string grow_axis_name(const std::string& base, std::int64_t g);
// `base` scaled by m >= 1.
std::string scale_axis_name(const std::string& base, std::int64_t m);
// The output axis of a sliding window (kernel k, stride s, padding lo + hi, dilation d) over
// `base`: PyTorch's floor((L + lo + hi - d (k - 1) - 1) / s) + 1, clamped at 0, is
// ceil((L - e) / s) with e = d (k - 1) - lo - hi, so the name is `base[e::s]` for e >= 0 and
// `base[+(-e)][::s]` otherwise; a window that keeps the length keeps the name.
std::string window_axis_name(const std::string& base, std::int64_t k, std::int64_t s,
                             std::int64_t lo, std::int64_t hi, std::int64_t d);

// The last step of a derived name: `H[::4][*4]` is `H[::4]` scaled by 4.
struct DerivedStep {
    enum class Kind { slice, grow, scale } kind;
    std::string base;
    std::int64_t a = 0, s = 1; // slice: e, s; grow: g; scale: m
};
std::optional<DerivedStep> last_step(const std::string& name);

// The axis a derived name starts from (`H` for `H[::4][*4]`); nullopt for a name with no token.
std::optional<std::string> derived_base(const std::string& name);
// The length of derived axis `name` when its base axis has `base_length`: each token's length
// function in turn (`H[::4][*4]`: 4 ceil(L / 4)).
std::int64_t derived_length(const std::string& name, std::int64_t base_length);

// patches' axis: the row-major product of two axes, named `(a*b)`; its length per sample is
// the product of theirs.
std::string product_axis_name(const std::string& a, const std::string& b);
// The factors of a product name (split at its one `*` outside brackets); nullopt for any
// other name.
std::optional<std::pair<std::string, std::string>> product_factors(const std::string& name);

} // namespace rag
