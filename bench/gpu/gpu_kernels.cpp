// Writes the PTX of every kernel bench/results/gpu_static.md reports (tests/gpu/report_kernels.hpp)
// for sm_80 and sm_90, for bench/gpu/static_report.py to assemble and disassemble:
//
//   rag_gpu_kernels OUTDIR
//
// OUTDIR/manifest.tsv: one line per kernel and arch: id, family, map, pass, dtype, arch, entry
// name, PTX file (relative to OUTDIR), dynamic shared memory per block (bytes; ptxas reports
// only the static), scratch bytes per block at N = 8K (relpos and attention; else 0), which
// caps the blocks a launch uses (jit/kir_gpu.hpp's kir_gpu_blocks). OUTDIR/banks.tsv: one line per
// warp-wide shared-memory access of each relpos and attention kernel (jit/kir_banks.hpp, the same
// at both archs): id, array, kind, degree; evaluated at the report's N = 8K with the instance's
// strip or part the whole sample (the parameters of an unbounded map: Delta = N - 1).
#include "jit/kir_banks.hpp"
#include "jit/kir_nvptx.hpp"
#include "tests/gpu/report_kernels.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
    // An option is not a directory name (`--help` once made a directory of that name).
    if (argc != 2 || argv[1][0] == '-') {
        std::cerr << "usage: rag_gpu_kernels OUTDIR\n"
                     "writes every report kernel's PTX, manifest.tsv and banks.tsv into OUTDIR\n";
        return argc == 2 && std::string(argv[1]) == "--help" ? 0 : 2;
    }
    namespace fs = std::filesystem;
    const fs::path dir = argv[1];
    fs::create_directories(dir);
    std::ofstream manifest(dir / "manifest.tsv"), banks(dir / "banks.tsv");
    // H, Delta, U, G, W, WP, WS (jit/relpos_programs.hpp's RelposParam order) at N = 8K.
    const std::int64_t N = 8192, U = 2 * N - 1;
    const std::int64_t params[] = {12, N - 1, U, 64, std::min(N + 63, U), U, N};
    // The strip list (offset, length, start) or part list (offset, length, first, end).
    auto tiles = [&](int, std::int64_t at) { return at % 2 ? N : 0; };
    try {
        for (const auto& r : rag::testing::report_kernels()) {
            const rag::kir::Kernel k = r.make();
            if (r.family == "relpos" || r.family == "attention")
                for (const auto& a : rag::jit::kir_bank_conflicts(k, params, tiles))
                    banks << r.id << '\t' << a.array << '\t' << a.kind << '\t' << a.degree << '\n';
            const bool relpos = r.family == "relpos" || r.family == "attention";
            const std::int64_t scratch = relpos ? rag::jit::kir_scratch_bytes(k, params) : 0;
            for (const char* arch : {"sm_80", "sm_90"}) {
                std::string file = r.id + "." + arch + ".ptx";
                for (char& c : file)
                    if (c == '/') c = '.';
                std::ofstream(dir / file) << rag::jit::kir_ptx(k, arch);
                manifest << r.id << '\t' << r.family << '\t' << r.map << '\t' << r.pass << '\t'
                         << r.dtype << '\t' << arch << '\t' << k.name << '\t' << file << '\t'
                         << rag::jit::kir_dynamic_shared_bytes(k) << '\t' << scratch << '\n';
            }
            std::cerr << r.id << '\n';
        }
    } catch (const std::exception& e) {
        std::cerr << "rag_gpu_kernels: " << e.what() << '\n';
        return 1;
    }
    return 0;
}
