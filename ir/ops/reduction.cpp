#include "ir/ops/kernel_util.hpp"

namespace rag {

void register_reduction_ops(OpTable&) {}

} // namespace rag
