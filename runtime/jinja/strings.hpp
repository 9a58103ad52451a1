#pragma once

/// Python's string operations over provenance text (text.hpp): each result byte keeps the
/// origin of the byte it came from, and a byte that replaces or transforms data is data.
/// Positions Python counts in characters are UTF-8 code points here.

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "runtime/jinja/text.hpp"

namespace troupe::jinja {

/// The byte offset where each code point starts, then the size (a lone continuation byte counts
/// as one character, so invalid UTF-8 still indexes).
[[nodiscard]] std::vector<size_t> code_point_starts(const std::string& s);
/// `s.strip(chars)`, `lstrip`, `rstrip`; no chars strips whitespace.
[[nodiscard]] text strip(const text& s, const std::optional<std::string>& chars, bool left, bool right);
/// `s.upper()`, `lower()`, `title()`, `capitalize()` (ASCII letters; other bytes unchanged).
enum class letter_case { upper, lower, title, capitalize };
[[nodiscard]] text change_case(const text& s, letter_case to);
/// `s.replace(old, replacement, count)` (count < 0: all).
[[nodiscard]] text replace(const text& s, const std::string& old, const text& replacement, int64_t count);
/// `s.split(sep, maxsplit)`; no sep splits at whitespace runs and drops empty pieces.
[[nodiscard]] std::vector<text> split(const text& s, const std::optional<std::string>& sep, int64_t maxsplit);
/// Jinja2's `indent(width, first, blank)`: lines after the first (and the first when `first`)
/// get `indentation`; blank lines only when `blank`.
[[nodiscard]] text indent(const text& s, const text& indentation, bool first, bool blank);

}  // namespace troupe::jinja
