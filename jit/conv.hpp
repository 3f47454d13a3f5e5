// Images on the CPU tier (f32 and f64): conv2d and its gradients as packed implicit GEMMs
// (jit/conv.cpp), pooling, upsampling and patches as pixel loops (jit/pool.cpp). Every output
// element has one owner and chunk edges depend on the sizes alone, so results are bitwise the
// same under any RAG_NUM_THREADS, without atomics. Internal to jit/; no LLVM.
#pragma once
#include "ir/ir.hpp"

namespace rag::jit {

// conv2d, conv2d_input_grad, conv2d_weight_grad, conv2d_bias_grad, max_pool2d(_grad),
// avg_pool2d(_grad), upsample2d(_grad), patches(_grad) of f32 or f64.
bool is_image_step(const ir::Function& f, const ir::Node& n);
// Runs node n (is_image_step); vals holds its arguments.
RaggedTensor run_image_step(const ir::Node& n, const std::vector<RaggedTensor>& vals);

// The pooling, upsampling and patch ops (jit/pool.cpp).
RaggedTensor run_pool_step(const ir::Node& n, const std::vector<RaggedTensor>& vals);

} // namespace rag::jit
