#include "ir/ops/kernel_util.hpp"

namespace rag {

void register_linalg_ops(OpTable&) {}

} // namespace rag
