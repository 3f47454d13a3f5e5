#include "dsl/repl.hpp"

namespace rag {

int run_repl(std::FILE*, std::FILE* out) {
    std::fputs("rag repl: not implemented yet\n", out);
    return 1;
}

} // namespace rag
