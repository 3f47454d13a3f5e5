// Host side of relative-position attention on the GPU: the buffers of jit/relpos.cpp, on the
// device, and the same launches. Table gradients: per-part partials reduced on the
// device in a fixed order (relpos_table_reduce), then folded into the map's rows: on the device
// where every expanded row is its own map row (identity maps: a transpose), else downloaded
// and folded on the host (relpos_fold_table_grad), as on the CPU.
#include "jit/relpos_gpu.hpp"

#include "jit/kir_gpu.hpp"
#include "jit/layout_programs.hpp"
#include "runtime/error.hpp"

#include <algorithm>

namespace rag::jit {
namespace {

constexpr const char* op_name = "relpos_attention";

enum class Pass { forward, query_grad, key_grad, reduce };

// The program of `pass` for shape s, compiled for the device once per process.
const GpuKernel& kernel(Pass pass, const RelposShape& s) {
    std::string key = "relpos/" + std::to_string(int(pass));
    if (pass != Pass::reduce)
        key += "/" + std::string(dtype_name(s.dtype)) + "/" + std::to_string(s.D) + "/" +
               std::to_string(s.Dv) + "/" + std::to_string(s.aq) + std::to_string(s.ak) +
               std::to_string(s.bias) + std::to_string(s.causal) + std::to_string(s.tensor_cores) +
               "/" + std::to_string(s.scale);
    return gpu_kernel(key, [&] {
        switch (pass) {
        case Pass::forward:
            return relpos_forward_program(s);
        case Pass::query_grad:
            return relpos_query_grad_program(s);
        case Pass::key_grad:
            return relpos_key_grad_program(s);
        case Pass::reduce:
            break;
        }
        return relpos_table_reduce_program();
    });
}

// Whether every expanded row u is map row u (an identity map's): the fold of a table gradient
// is then only the layout change [H][U][width] -> [U][H][width].
bool rows_are_expanded(const RelposSetup& s) {
    if (s.U != s.cfg.map.rows()) return false;
    for (std::int64_t u = 0; u < s.U; ++u)
        if (s.rows_of[std::size_t(u)] != u) return false;
    return true;
}

// [ea][eb][width] f32 values of x as [eb][ea][width] in a new buffer (the transpose program):
// a table expanded from its rows ([U][H] -> [H][U]) and its gradient folded back.
cuda::Buffer swapped(const cuda::Buffer& x, std::int64_t ea, std::int64_t eb, std::int64_t width) {
    const TransposeJob job{ea * eb * width, ea, 1, eb, width, nullptr};
    const GpuKernel& t =
        gpu_kernel(transpose_kernel_key(DType::f32), [] { return transpose_program(DType::f32); });
    cuda::Buffer out = device_buffer(std::size_t(job.total) * 4);
    const cuda::Buffer* ptrs[] = {&x, &out};
    t.launch(job.grid(), ptrs, job.params());
    return out;
}

// Device zeros shared with the tensors made from them.
std::shared_ptr<const cuda::Buffer> zeros(std::size_t bytes) {
    return std::make_shared<const cuda::Buffer>(device_zeros(bytes));
}

// A launch whose buffers are named as the program declares them, in order: a mismatch is an
// internal error here rather than a kernel reading the wrong memory.
using Named = std::pair<const char*, const cuda::Buffer*>;
void launch(const GpuKernel& k, std::int64_t grid, std::initializer_list<Named> bufs,
            std::span<const std::int64_t> params) {
    std::vector<const cuda::Buffer*> ptrs;
    const auto& decl = k.kernel().buffers;
    for (const auto& [name, buf] : bufs) {
        const std::size_t at = ptrs.size();
        if (at >= decl.size() || decl[at].space != kir::Space::global || decl[at].name != name)
            fail("internal: ", k.kernel().name, " buffer ", at, " is ",
                 at < decl.size() ? decl[at].name : "(none)", ", launched with ", name);
        ptrs.push_back(buf);
    }
    k.launch(grid, ptrs, params);
}

} // namespace

RelposOnDevice::RelposOnDevice(std::span<const RaggedTensor> in, const Attrs& at)
    : in_(in.begin(), in.end()), at_(at), s_(relpos_setup(in, at, op_name, false, false)) {
    const bool tensor_cores = relpos_tensor_cores(s_.shape.dtype);
    q_ = on_device(in_[0]);
    k_ = on_device(in_[1]);
    v_ = on_device(in_[2]);
    tiles_ = to_device(s_.tiles);
    // f32 tables of an identity map expand on the device: [U][H][width] -> [H][U][width] is
    // the transpose program's, so parameters that live there are not downloaded to expand.
    bool f32_tables = true;
    for (int k : {AQ, AK, BIAS})
        if (s_.cfg.has[k])
            f32_tables = f32_tables && in_[std::size_t(s_.cfg.table_at[k])].dtype() == DType::f32;
    if (!tensor_cores && f32_tables && rows_are_expanded(s_)) {
        cuda::Buffer* into[] = {&eq_, &ek_, &eb_};
        for (int k : {AQ, AK, BIAS}) {
            cuda::Buffer& e = *into[k == AQ ? 0 : k == AK ? 1 : 2];
            if (!s_.cfg.has[k]) {
                e = device_buffer(0); // never read: the programs skip absent tables
                continue;
            }
            // An upload of a host table may go back to the cache when this returns: only work
            // queued after the launch can be handed it (jit/kir_gpu.hpp).
            const std::shared_ptr<const cuda::Buffer> table =
                on_device(in_[std::size_t(s_.cfg.table_at[k])]);
            e = swapped(*table, s_.U, s_.H, k == BIAS ? 1 : s_.shape.D);
        }
        return;
    }
    relpos_expand_tables(s_, in_);
    if (tensor_cores) relpos_use_tensor_cores(s_);
    eq_ = tensor_cores ? to_device(s_.eq_half) : to_device(s_.eq);
    ek_ = tensor_cores ? to_device(s_.ek_half) : to_device(s_.ek);
    eb_ = to_device(s_.eb);
}

void RelposOnDevice::set_dO(const RaggedTensor& dO) {
    std::vector<RaggedTensor> with_dO = in_;
    with_dO.push_back(dO);
    relpos_check(with_dO, at_, op_name, true);
    if (dO.dtype() != in_[0].dtype())
        fail(op_name, ": dO must be ", dtype_name(in_[0].dtype()), " like q, got ",
             dtype_name(dO.dtype()));
    dO_ = on_device(dO);
    has_dO_ = true;
    backward_done_ = false;
}

void RelposOnDevice::forward() {
    const RelposSetup& s = s_;
    const std::size_t elem = dtype_size(s.shape.dtype);
    out_ = zeros(std::size_t(s.tokens * s.H * s.shape.Dv) * elem);
    lse_ = device_zeros(std::size_t(s.tokens * s.H) * 4);
    forward_done_ = true;
    if (s.tiles.empty()) return;
    launch(kernel(Pass::forward, s.shape), s.strips() * s.H,
           {{"q", q_.get()},
            {"k", k_.get()},
            {"v", v_.get()},
            {"eq", &eq_},
            {"ek", &ek_},
            {"eb", &eb_},
            {"tiles", &tiles_},
            {"out", out_.get()},
            {"lse", &lse_}},
           s.params());
}

void RelposOnDevice::backward() {
    if (!has_dO_) fail("internal: ", op_name, " backward on the GPU without dO");
    if (!forward_done_) forward();
    const RelposSetup& s = s_;
    const RelposShape& sh = s.shape;
    const std::size_t elem = dtype_size(sh.dtype);
    dq_ = zeros(std::size_t(s.tokens * s.H * sh.D) * elem);
    dk_ = zeros(std::size_t(s.tokens * s.H * sh.D) * elem);
    dv_ = zeros(std::size_t(s.tokens * s.H * sh.Dv) * elem);
    const std::int64_t width[3] = {sh.D, sh.D, 1};
    for (int t : {AQ, AK, BIAS})
        tables_[t] =
            s.cfg.has[t] ? device_zeros(std::size_t(s.H * s.U * width[t]) * 4) : cuda::Buffer();
    backward_done_ = true;
    if (s.tiles.empty()) return;
    // One instance per part and head (parts: runs of strips, enough to fill the device);
    // table partials per part, [part][H][WP][width].
    relpos_split_backward(s_, kDeviceBackwardPieces, kDevicePartialBudget);
    const cuda::Buffer parts_list = to_device(s.parts);
    const std::size_t parts = std::size_t(s.part_count() * s.H * s.WP);
    cuda::Buffer delta = device_buffer(std::size_t(s.tokens * s.H) * 4);
    cuda::Buffer zq = device_buffer(sh.aq ? parts * std::size_t(sh.D) * 4 : 4);
    cuda::Buffer zk = device_buffer(sh.ak ? parts * std::size_t(sh.D) * 4 : 4);
    cuda::Buffer zb = device_buffer(sh.bias ? parts * 4 : 4);
    cuda::Buffer qrange = device_buffer(std::size_t(2 * s.part_count()) * 8);
    cuda::Buffer krange = device_buffer(std::size_t(2 * s.part_count()) * 8);
    const std::vector<std::int64_t> params = s.params();
    // The part list stands where the forward's strip list does.
    launch(kernel(Pass::query_grad, sh), s.part_count() * s.H,
           {{"q", q_.get()},
            {"k", k_.get()},
            {"v", v_.get()},
            {"eq", &eq_},
            {"ek", &ek_},
            {"eb", &eb_},
            {"tiles", &parts_list},
            {"dO", dO_.get()},
            {"out", out_.get()},
            {"lse", &lse_},
            {"dq", dq_.get()},
            {"delta", &delta},
            {"zq_part", &zq},
            {"zb_part", &zb},
            {"range", &qrange}},
           params);
    launch(kernel(Pass::key_grad, sh), s.part_count() * s.H,
           {{"q", q_.get()},
            {"k", k_.get()},
            {"v", v_.get()},
            {"eq", &eq_},
            {"ek", &ek_},
            {"eb", &eb_},
            {"tiles", &parts_list},
            {"dO", dO_.get()},
            {"lse", &lse_},
            {"delta", &delta},
            {"dk", dk_.get()},
            {"dv", dv_.get()},
            {"zk_part", &zk},
            {"range", &krange}},
           params);
    const cuda::Buffer* partial[3] = {&zq, &zk, &zb};
    const cuda::Buffer* ranges[3] = {&qrange, &krange, &qrange};
    for (int t : {AQ, AK, BIAS}) {
        if (!s.cfg.has[t]) continue;
        const std::int64_t rparams[] = {s.H, s.U, s.part_count(), s.WP, width[t]};
        launch(kernel(Pass::reduce, sh),
               s.H * ((s.U + relpos_reduce_rows - 1) / relpos_reduce_rows),
               {{"part", partial[t]}, {"range", ranges[t]}, {"out", &tables_[t]}}, rparams);
    }
    // delta, the part list, the partials and the ranges go back to the cache here; only work queued
    // after these launches on rag's stream can reuse them.
}

RaggedTensor RelposOnDevice::out() const {
    if (!forward_done_) fail("internal: ", op_name, " output read before the forward ran");
    return resident(out_, in_[0].dtype(), in_[2].structure_ptr());
}

std::vector<RaggedTensor> RelposOnDevice::gradients() const {
    if (!backward_done_) fail("internal: ", op_name, " gradients read before the backward ran");
    const DType t = in_[0].dtype();
    std::vector<RaggedTensor> g = {resident(dq_, t, in_[0].structure_ptr()),
                                   resident(dk_, t, in_[1].structure_ptr()),
                                   resident(dv_, t, in_[2].structure_ptr())};
    for (int k : {AQ, AK, BIAS}) {
        if (!s_.cfg.has[k]) continue;
        const std::int64_t width = k == BIAS ? 1 : s_.shape.D;
        const RaggedTensor& table = in_[std::size_t(s_.cfg.table_at[k])];
        if (table.dtype() == DType::f32 && rows_are_expanded(s_)) { // folded on the device
            g.push_back(resident(swapped(tables_[k], s_.H, s_.U, width), DType::f32,
                                 table.structure_ptr()));
            continue;
        }
        std::vector<float> expanded(std::size_t(s_.H * s_.U * width));
        cuda::download(expanded.data(), tables_[k], expanded.size() * 4);
        g.push_back(RaggedTensor::from_f64(table.dtype(), table.structure_ptr(),
                                           relpos_fold_table_grad(expanded.data(), s_, width)));
    }
    return g;
}

RaggedTensor relpos_forward_gpu(std::span<const RaggedTensor> in, const Attrs& at) {
    RelposOnDevice d(in, at);
    d.forward();
    return d.out();
}

std::vector<RaggedTensor> relpos_backward_gpu(std::span<const RaggedTensor> in,
                                              const RaggedTensor& dO, const Attrs& at) {
    RelposOnDevice d(in, at);
    d.set_dO(dO);
    d.backward();
    return d.gradients();
}

} // namespace rag::jit
