// Writes the PTX of every kernel bench/results/gpu_static.md reports (tests/gpu/report_kernels.hpp)
// for sm_80 and sm_90, for bench/gpu/static_report.py to assemble and disassemble:
//
//   rag_gpu_kernels OUTDIR
//
// OUTDIR/manifest.tsv: one line per kernel and arch: id, family, map, pass, dtype, arch, entry
// name, PTX file (relative to OUTDIR).
#include "jit/kir_nvptx.hpp"
#include "tests/gpu/report_kernels.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

int main(int argc, char** argv) {
    if (argc != 2) {
        std::cerr << "usage: rag_gpu_kernels OUTDIR\n";
        return 2;
    }
    namespace fs = std::filesystem;
    const fs::path dir = argv[1];
    fs::create_directories(dir);
    std::ofstream manifest(dir / "manifest.tsv");
    try {
        for (const auto& r : rag::testing::report_kernels()) {
            const rag::kir::Kernel k = r.make();
            for (const char* arch : {"sm_80", "sm_90"}) {
                std::string file = r.id + "." + arch + ".ptx";
                for (char& c : file)
                    if (c == '/') c = '.';
                std::ofstream(dir / file) << rag::jit::kir_ptx(k, arch);
                manifest << r.id << '\t' << r.family << '\t' << r.map << '\t' << r.pass << '\t'
                         << r.dtype << '\t' << arch << '\t' << k.name << '\t' << file << '\n';
            }
            std::cerr << r.id << '\n';
        }
    } catch (const std::exception& e) {
        std::cerr << "rag_gpu_kernels: " << e.what() << '\n';
        return 1;
    }
    return 0;
}
