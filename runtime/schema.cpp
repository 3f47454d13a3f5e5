#include "runtime/schema.hpp"

#include <functional>

namespace rag {

int Shape::ragged_count() const {
    int n = 0;
    for (const Axis& a : axes) n += a.is_ragged();
    return n;
}

std::string shape_str(const Shape& s) {
    std::string out = "[";
    bool first = true;
    auto sep = [&] {
        if (!first) out += ", ";
        first = false;
    };
    if (s.batched) {
        sep();
        out += "B";
    }
    for (const Axis& a : s.axes) {
        sep();
        switch (a.kind) {
        case AxisKind::fixed:
            out += std::to_string(a.extent);
            break;
        case AxisKind::symbolic:
            out += a.name;
            break;
        case AxisKind::ragged:
            out += "~" + a.name;
            break;
        }
    }
    return out + "]";
}

std::string Schema::str() const {
    return std::string(dtype_name(dtype)) + shape_str(shape);
}

std::size_t Schema::hash() const {
    return std::hash<std::string>{}(str());
}

} // namespace rag
