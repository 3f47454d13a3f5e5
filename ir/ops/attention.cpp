#include "ir/ops/kernel_util.hpp"

namespace rag {

void register_attention_ops(OpTable&) {}

} // namespace rag
