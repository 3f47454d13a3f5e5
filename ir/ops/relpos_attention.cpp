#include "ir/ops/kernel_util.hpp"

namespace rag {

void register_relpos_ops(OpTable&) {}

} // namespace rag
