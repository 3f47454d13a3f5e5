// Checkpoint files in the safetensors format (Hugging Face): an 8-byte little-endian header
// size, a JSON header {name: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}} padded
// with spaces to a multiple of 8 bytes, then the tensors' bytes back to back. Only unbatched
// dense tensors (params fields) are stored. Reading validates every header field against the
// file (sizes, offsets, dtypes, shapes, duplicate names) and fails with a rag::Error naming the
// file, so a hostile or truncated file never allocates more than the file holds.
#pragma once
#include "runtime/tensor.hpp"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rag::safetensors {

using Named = std::vector<std::pair<std::string, RaggedTensor>>;
using Metadata = std::vector<std::pair<std::string, std::string>>;

struct Contents {
    Named tensors; // in the order of their data in the file
    Metadata metadata;
};

// Writes atomically: a temporary file beside `path`, renamed over it once complete.
void save(const std::string& path, const Named& tensors, const Metadata& metadata = {});
Contents load(const std::string& path);
// The same from the file's bytes; `path` only names the file in messages.
Contents parse(std::string_view bytes, const std::string& path);

} // namespace rag::safetensors
