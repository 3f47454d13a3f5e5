// rag::Error: every user-facing failure (bad shapes, dtypes, lengths, devices) is thrown as this
// type with a message that names the sample and the extents involved. Nothing else escapes.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace rag {

class Error : public std::runtime_error {
  public:
    explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// fail("sample ", i, ": extent ", n) builds the message from its pieces and throws.
template <class... Parts> [[noreturn]] void fail(const Parts&... parts) {
    std::ostringstream os;
    (os << ... << parts);
    throw Error(os.str());
}

} // namespace rag
