#include "tests/gpu/ptxas.hpp"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <sys/wait.h>

namespace rag::testing {

std::string ptxas_path() {
    std::string p;
    if (const char* e = std::getenv("RAG_PTXAS"); e && *e)
        p = e;
    else if (const char* h = std::getenv("CUDA_HOME"); h && *h)
        p = std::string(h) + "/bin/ptxas";
    else
        p = "/usr/local/cuda/bin/ptxas";
    return access(p.c_str(), X_OK) == 0 ? p : "";
}

PtxasResult run_ptxas(const std::string& ptx, const std::string& arch, const std::string& flags) {
    char name[] = "/tmp/rag_ptx_XXXXXX";
    int fd = mkstemp(name);
    if (fd < 0) throw std::runtime_error("mkstemp failed");
    close(fd);
    std::ofstream(name) << ptx;
    const std::string cmd =
        ptxas_path() + " " + flags + " -arch=" + arch + " -o /dev/null " + name + " 2>&1";
    PtxasResult r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) throw std::runtime_error("popen failed");
    std::array<char, 4096> buf;
    while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) r.output.append(buf.data(), n);
    const int status = pclose(p);
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::remove(name);
    return r;
}

} // namespace rag::testing
