// Conversions between NumPy / DLPack and rag tensors for the Python module.
//
// Decisions (docs in bindings/README.md):
// - dtypes map to NumPy one to one (f16 float16, f32 float32, f64 float64, i32 int32, i64 int64,
//   bool bool_). bf16 has no NumPy dtype: raw storage views (`values`, the buffer protocol)
//   show its bits as uint16, conversions to arrays (`to_list`, `to_padded`, unbatched results)
//   widen to float32 (exact). On input, uint16 arrays (and ml_dtypes.bfloat16) are bf16 bits;
//   float arrays become bf16 by rounding to nearest even when bf16 is asked for.
// - Views share the tensor's 64-byte-aligned Buffer: a capsule holding a copy of the
//   shared_ptr is the NumPy base object, so an array outlives the tensor safely.
// - Arrays coming in are adopted without a copy when they are C-contiguous, writeable,
//   64-byte aligned and already of the target dtype; otherwise they are copied once.
#pragma once
#include "bindings/dlpack.hpp"
#include "bindings/initialised.hpp"
#include "runtime/tensor.hpp"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace rag::bind {

namespace py = pybind11;

// ---- dtypes ---------------------------------------------------------------------------------
py::dtype storage_dtype(DType t); // the element type of raw views: bf16 -> uint16
py::dtype value_dtype(DType t);   // the element type of converted arrays: bf16 -> float32
std::optional<DType> dtype_of(const py::dtype& d); // uint16 and ml_dtypes bfloat16 -> bf16
DType dtype_arg(py::handle h); // "f32", "float32", np.float32, np.dtype(...): rag::Error if unknown
DType infer_dtype(const py::array& a); // rag::Error naming the NumPy dtype if it has no rag dtype

// `a` (any array-like) as an array of storage_dtype(t). `casting` is NumPy's casting rule for
// conversions between NumPy dtypes ("same_kind" for arguments, "unsafe" for explicit dtypes).
py::array as_storage(py::handle a, DType t, const char* casting);

// ---- buffers and views ----------------------------------------------------------------------
// The NumPy base object that keeps `b` alive.
py::object keep_alive(const Buffer& b);
// A view over `b` (strides in bytes).
py::array view(const Buffer& b, DType t, std::vector<py::ssize_t> shape,
               std::vector<py::ssize_t> strides, std::size_t byte_offset);
// bf16 bits (any shape and strides) to a new float32 array; other arrays are returned as is.
py::array widen(const py::array& a, DType t);
// The storage of a C-contiguous array of storage_dtype(t): adopted or copied.
Buffer buffer_of(const py::array& a, DType t);

// ---- tensors --------------------------------------------------------------------------------
// The packed values: [rows, non-ragged extents...] for batched tensors, the array itself for
// unbatched ones. Zero copy; bf16 shows as uint16 bits.
py::array values_view(const RaggedTensor& t);
// Sample i in logical axis order. Zero copy (strided when ragged axes are not leading); bf16
// widened to float32 (a copy).
py::array sample_array(const RaggedTensor& t, std::int64_t i);
// An unbatched tensor as its array (zero copy, bf16 widened); batched: rag::Error.
py::array dense_array(const RaggedTensor& t);
py::array to_padded(const RaggedTensor& t, py::handle value);
py::array mask(const RaggedTensor& t);

// A dense tensor from an array-like: unbatched, or batched with axis 0 as the batch axis.
RaggedTensor tensor_from_array(py::handle a, DType t, bool batched, const char* casting);
// A batch from per-sample arrays with declared per-sample axes (rag::Error naming the sample).
RaggedTensor pack(const std::vector<py::array>& samples, DType t, std::vector<Axis> axes);
// The same values with per-sample axes `axes` (a ragged/fixed change or renamed ragged axes):
// shares the buffer when the storage layout is unchanged, repacks otherwise.
RaggedTensor with_axes(const RaggedTensor& t, std::vector<Axis> axes);
// Per-sample axes from a spec: "~N, ~N, 128", "[B, ~N, 384]" or "f32[B, ~N, 384]" (the dtype,
// when given, is stored in *dtype). `rank` is the sample rank, used to drop a leading batch name.
std::vector<Axis> axes_from_spec(std::string spec, int rank, std::optional<DType>* dtype);
// Names for ragged axes without declared names: N, M, L, K, J, I, H, G.
std::string ragged_name(int k);

// ---- packed values and lengths --------------------------------------------------------------
// Lengths (a sequence or array of integers) as a C-contiguous int64 array; `what` starts the
// rag::Error for anything else, floats included (2.5 is not truncated to 2).
py::array_t<std::int64_t, py::array::c_style> integer_array(py::handle obj,
                                                            const std::string& what);
// A batch from its packed values ([rows, static extents...], as `values` shows them; any array
// or DLPack producer, adopted without a copy when C-contiguous, 64-byte aligned and of the
// dtype) and one row of B lengths per ragged name (a dict by name, a list in order of first
// appearance, or one row when there is one name), with per-sample axes from `spec`.
RaggedTensor from_packed(py::handle values, py::handle lengths, const std::string& spec,
                         py::handle dtype);
// (values view, [one int64 array of B lengths per ragged name]): from_packed's inverse.
py::tuple packed(const RaggedTensor& t);

// ---- DLPack ---------------------------------------------------------------------------------
// (device type, id) of __dlpack_device__: CUDA device 0 while the values have a current device
// copy (a GPU-tier result, to('cuda'), a CUDA import), else the CPU.
std::tuple<int, int> dlpack_device(const RaggedTensor& t);
// __dlpack__(stream=, max_version=, dl_device=, copy=): a capsule over the packed values (see
// values_view) where they are (dlpack_device) or on dl_device. `versioned`: a DLPack 1.x
// "dltensor_versioned" capsule when max_version >= (1, 0), else the legacy "dltensor" one.
// CPU exports hand out the host bytes (a device copy is dropped: the capsule is writable).
// CUDA exports share the device copy (rag's later host reads download it again, since the
// consumer may write it), ordered before the consumer's `stream` (None: the legacy default
// stream; -1: none); a CPU tensor asked for on CUDA is uploaded (refused with copy=False).
py::capsule to_dlpack(const RaggedTensor& t, py::handle stream, py::handle max_version,
                      py::handle dl_device, py::handle copy);
// Takes a producer (an object with __dlpack__, asked for a versioned capsule first) or a
// capsule of either kind. CPU memory: adopted, but read-only tensors (the DLPack 1.x flag) are
// copied. CUDA device 0 (the producer is passed rag's stream): adopted as a device-resident
// tensor sharing the producer's memory when contiguous and 16-byte aligned, else copied on the
// device (strided memory is refused).
RaggedTensor from_dlpack(py::handle obj, bool batched);

} // namespace rag::bind
