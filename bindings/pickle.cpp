#include "bindings/pickle.hpp"

#include "runtime/error.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>

namespace rag::bind {

namespace py = pybind11;

namespace {

// Bumped when the state layout changes; older states stay readable or fail clearly.
constexpr int state_version = 1;

std::int64_t int_of(py::handle h, const char* what) {
    if (!py::isinstance<py::int_>(h)) fail("rag.Tensor state: ", what, " is not an integer");
    return h.cast<std::int64_t>();
}

} // namespace

py::object tensor_state(const RaggedTensor& t) {
    py::list axes;
    for (const Axis& a : t.shape().axes) axes.append(py::make_tuple(int(a.kind), a.extent, a.name));
    const std::size_t nbytes = std::size_t(t.numel()) * dtype_size(t.dtype());
    return py::make_tuple(state_version, std::string(dtype_name(t.dtype())), t.shape().batched,
                          axes, t.batch(), py::cast(t.structure().sizes()),
                          py::bytes(static_cast<const char*>(t.data()), nbytes));
}

namespace {

RaggedTensor from_tuple(const py::tuple& s) {
    if (s.size() != 7 || int_of(s[0], "the version") != state_version)
        fail("rag.Tensor state: not a state this rag writes (version ", state_version, ")");
    auto dtype = parse_dtype(py::str(s[1]).cast<std::string>());
    if (!dtype) fail("rag.Tensor state: unknown dtype");
    Shape shape;
    shape.batched = py::bool_(s[2]).cast<bool>();
    for (py::handle a : s[3]) {
        if (!py::isinstance<py::tuple>(a) || py::len(a) != 3)
            fail("rag.Tensor state: an axis is not (kind, extent, name)");
        py::tuple ax = py::reinterpret_borrow<py::tuple>(a);
        const std::int64_t kind = int_of(ax[0], "an axis kind");
        if (kind < 0 || kind > int(AxisKind::ragged)) fail("rag.Tensor state: bad axis kind");
        shape.axes.push_back(
            {AxisKind(kind), int_of(ax[1], "an extent"), py::str(ax[2]).cast<std::string>()});
    }
    const std::int64_t batch = int_of(s[4], "the batch");
    std::vector<std::int64_t> sizes;
    for (py::handle h : s[5]) sizes.push_back(int_of(h, "an extent"));
    if (batch < 0 || std::size_t(shape.sample_rank()) * std::size_t(batch) != sizes.size())
        fail("rag.Tensor state: ", sizes.size(), " extents for ", batch, " samples of rank ",
             shape.sample_rank());
    if (!py::isinstance<py::bytes>(s[6])) fail("rag.Tensor state: the values are not bytes");
    const std::string_view bytes = s[6].cast<std::string_view>();
    // The element count from the extents, before anything is allocated for them: a state that
    // claims more values than its bytes hold fails here.
    const std::uint64_t limit = bytes.size() / dtype_size(*dtype);
    std::uint64_t total = 0;
    const std::size_t rank = std::size_t(shape.sample_rank());
    for (std::int64_t i = 0; i < batch; ++i) {
        std::uint64_t n = 1;
        for (std::size_t a = 0; a < rank; ++a) {
            const std::int64_t e = sizes[std::size_t(i) * rank + a];
            if (e < 0) fail("rag.Tensor state: a negative extent");
            n = e && n > limit / std::uint64_t(e) ? limit + 1 : n * std::uint64_t(e);
        }
        total += std::min<std::uint64_t>(n, limit + 1);
        if (total > limit)
            fail("rag.Tensor state: the extents need more values than its bytes hold");
    }
    StructurePtr st = Structure::make(shape, batch, std::move(sizes));
    const std::size_t nbytes = std::size_t(st->numel()) * dtype_size(*dtype);
    if (bytes.size() != nbytes)
        fail("rag.Tensor state: ", bytes.size(), " bytes of values, the structure needs ", nbytes);
    Buffer b = Buffer::allocate(nbytes);
    if (nbytes) std::memcpy(b.data.get(), bytes.data(), nbytes);
    return RaggedTensor(*dtype, std::move(st), std::move(b));
}

} // namespace

RaggedTensor tensor_from_state(const py::object& state) {
    if (!py::isinstance<py::tuple>(state))
        fail("rag.Tensor state: expected the tuple that pickling a rag.Tensor writes, got ",
             py::str(py::type::of(state).attr("__name__")).cast<std::string>());
    // A state is input like any other: a part of the wrong Python type (an axis that is not a
    // tuple, an extent beyond int64, values that are not bytes) is this error, not Python's.
    try {
        return from_tuple(py::reinterpret_borrow<py::tuple>(state));
    } catch (py::error_already_set&) {
    } catch (py::cast_error&) {
    }
    fail("rag.Tensor state: not a state this rag writes (version ", state_version, ")");
}

} // namespace rag::bind
