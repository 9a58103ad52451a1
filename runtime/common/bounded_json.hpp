#pragma once

/// JSON text from outside (a request body, chat_template_kwargs from another process, stdin)
/// parsed with its nesting bounded before the document exists: every later use of a JSON value
/// (copy, dump, compare, render) recurses once per level, and 400,000 levels exhaust the stack.

#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "runtime/common/error.hpp"

namespace troupe {

/// `text` parsed, keys in their order. Errors (errc::invalid_argument), to follow the name of
/// what was parsed: "nests objects and lists deeper than N levels" (a container opened at depth
/// `depth_max`, the outermost being at 0), "is not valid JSON: <the parser's message>".
[[nodiscard]] expected<nlohmann::ordered_json> parse_bounded_json(std::string_view text, int depth_max);

}  // namespace troupe
