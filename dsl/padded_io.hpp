// The boundary of padded execution (docs/design.md, "Padded execution"): arguments go in at
// their dense envelope, results come back at their samples' true extents.
#pragma once
#include "runtime/tensor.hpp"

#include <map>
#include <string>
#include <vector>

namespace rag {

// t with its schema kept but every sample stored at the envelope extents (padding 0).
// Values without a ragged axis are returned as they are.
RaggedTensor to_envelope(const RaggedTensor& t);

// bool[B, ~name] at the envelope max(lengths): true at positions < lengths[i].
RaggedTensor envelope_mask(const std::string& name, const std::vector<std::int64_t>& lengths);

// The valid entries of a value stored at its envelope: each ragged axis takes the lengths of
// its name. rag::Error for a ragged axis whose lengths are unknown.
RaggedTensor from_envelope(const RaggedTensor& t,
                           const std::map<std::string, std::vector<std::int64_t>>& lengths);

} // namespace rag
