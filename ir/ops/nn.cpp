#include "ir/ops/kernel_util.hpp"

namespace rag {

void register_nn_ops(OpTable&) {}

} // namespace rag
