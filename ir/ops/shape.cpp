#include "ir/ops/kernel_util.hpp"

namespace rag {

void register_shape_ops(OpTable&) {}

} // namespace rag
