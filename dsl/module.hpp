// The embedding API: load a .rag program, call its functions on RaggedTensors, initialise
// params groups. Each function is compiled once per argument schemas (its specialisation
// key) and reused when only lengths change; stats() counts compilations and cache hits.
#pragma once
#include "runtime/error.hpp"
#include "runtime/tensor.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rag {

namespace frontend {
struct Program;
}

// A value crossing the API: a tensor, a params record (fields in declaration order) or a tuple.
struct Value {
    enum class Kind { tensor, record, tuple } kind = Kind::tensor;
    RaggedTensor tensor;
    std::string record;
    std::vector<std::pair<std::string, RaggedTensor>> fields;
    std::vector<Value> elems;

    Value() = default;
    Value(RaggedTensor t) : tensor(std::move(t)) {} // NOLINT: implicit on purpose
    static Value tuple(std::vector<Value> elems);
    const RaggedTensor& field(std::string_view name) const;
    std::string type_str() const;
};

// Writes a params record's fields as they are (no program to check them against).
void save_checkpoint(const Value& params, const std::string& path);

// A compile error: the formatted diagnostics of the whole file.
class CompileError : public Error {
  public:
    using Error::Error;
};

// Where calls run: the reference interpreter (the oracle), the LLVM-compiled CPU tier, or the
// CUDA device (jit/gpu_function.hpp: fused kernels on the GPU, other steps on the host).
enum class Tier { interpreter, jit, gpu };

struct FnStats {
    int compilations = 0;
    int cache_hits = 0;
    double compile_seconds = 0; // every compile cost of its calls (jit/compile_clock.hpp)
    int disk_cache_hits = 0;    // compiled modules loaded from RAG_CACHE_DIR instead
    // Where the plan steps of the latest call ran (compiled tiers; jit/placement.hpp): compiled
    // kernels, device kernels, and by op name reference kernels and host fallbacks (op_dtype).
    std::int64_t compiled_steps = 0, device_steps = 0;
    std::map<std::string, std::int64_t> reference_steps, host_steps;
    // GPU tier: bytes the latest call copied to and from the device (results the caller reads
    // later are downloaded then, and not counted here).
    std::int64_t uploaded_bytes = 0, downloaded_bytes = 0;
};

class Module {
  public:
    static std::shared_ptr<Module> load(const std::string& path);
    static std::shared_ptr<Module> compile(const std::string& source,
                                           const std::string& path = "<input>");
    ~Module();

    std::vector<std::string> functions() const;
    Value call(std::string_view fn, const std::vector<Value>& args);
    // Deterministic initialisation of a params group (see docs/language.md for the generator).
    Value init(std::string_view params, std::uint64_t seed) const;
    // The IR of fn specialised on these arguments (or on its declared types).
    // Reverse mode from the host: the gradient of sum_k <result element k, cotangent k> for
    // every argument. `cotangents` has one entry per element of fn's result (one entry when the
    // result is not a tuple), in order; nullopt is a zero cotangent, as is any entry for an
    // integer tensor. Returns one entry per argument: its gradient (a tensor, or a record of the
    // argument's type whose integer fields are zero) or nullopt for an argument without float
    // tensors. The gradient comes from the same autodiff as `grad` (ir::vjp), compiled once per
    // argument schemas.
    std::vector<std::optional<Value>> vjp(std::string_view fn, const std::vector<Value>& args,
                                          const std::vector<std::optional<Value>>& cotangents);
    // The same in two calls, so that a caller that needs fn's result first (the PyTorch bridge)
    // runs fn once: call_saving returns fn's result and what its reverse pass reads; backward
    // returns what vjp does. Its stats are under "<fn>_forward" and "<fn>_backward".
    struct Saved;
    std::pair<Value, std::shared_ptr<const Saved>> call_saving(std::string_view fn,
                                                               const std::vector<Value>& args);
    std::vector<std::optional<Value>> backward(const Saved& saved,
                                               const std::vector<std::optional<Value>>& cotangents);

    std::string ir(std::string_view fn,
                   const std::optional<std::vector<Value>>& args = std::nullopt);
    // How the CPU tier runs fn on its declared types: fused loops, GEMMs, reference kernels.
    std::string plan(std::string_view fn);
    std::map<std::string, FnStats> stats() const { return stats_; }
    void set_tier(Tier t) { tier_ = t; }
    Tier tier() const { return tier_; }
    // Padded execution (docs/design.md): calls run the program on the dense envelope
    // B x N_max x ... with masks, the baseline padded frameworks use; same valid results.
    void set_padded(bool on) { padded_ = on; }
    bool padded() const { return padded_; }
    const frontend::Program& program() const { return *prog_; }
    // Notes from loading (a definition shadowing the standard library's), formatted.
    const std::string& notes() const { return notes_; }

    // Checkpoints (dsl/checkpoint.cpp): safetensors files, one tensor per dotted field name.
    // The fields of a params type (Adam[...] included) as init makes them, in order.
    std::vector<std::pair<std::string, Schema>> param_fields(std::string_view type) const;
    // Writes a params record after checking it against its type's fields.
    void save_params(const Value& params, const std::string& path) const;
    // A params record of `type` from a file; a missing, extra, mis-shaped or mis-typed name is
    // an error naming it with the expected and the found schema.
    Value load_params(std::string_view type, const std::string& path) const;

  private:
    struct Compiled;
    struct Split;
    explicit Module(std::unique_ptr<frontend::Program> prog);
    const Compiled& specialise(std::string_view fn, const std::vector<Value>& args);
    const Split& specialise_split(std::string_view fn, const std::vector<Value>& args);
    void build(Compiled& c) const; // compiles c.lowered.fn for the current tier
    // Runs c on flat tensors (checking them against its inputs); stats go under `fn`.
    std::vector<RaggedTensor> run(const Compiled& c, std::string_view fn,
                                  std::vector<RaggedTensor> flat);

    std::unique_ptr<frontend::Program> prog_;
    std::string notes_;
    std::map<std::string, std::unique_ptr<Compiled>> cache_;
    std::map<std::string, std::unique_ptr<Split>> splits_;
    std::map<std::string, FnStats> stats_;
    Tier tier_ = Tier::jit;
    bool padded_ = false;
};

} // namespace rag
