#pragma once

/// Errors a caller can cause are values (`expected<T>`); broken invariants are `TROUPE_ASSERT`s,
/// always on, that abort with a message. Nothing in runtime/ throws across its interface.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include <tl/expected.hpp>

namespace troupe {

/// The class of a user-causable error; the message says what exactly is wrong. It crosses
/// processes as its underlying integer (messages/): keep `internal` last and append new codes
/// before it only with care, since a peer validates the range with `is_valid`.
enum class errc : uint8_t {
  invalid_argument,  ///< a parameter outside its documented range
  malformed_file,    ///< a file exists but its contents are wrong (header, size, encoding)
  io_error,          ///< a file cannot be opened, read or mapped
  invalid_utf8,      ///< text input is not valid UTF-8
  too_long,          ///< a request does not fit the model's context or the KV pool
  not_found,         ///< an id or name that does not exist
  overloaded,        ///< a bounded queue is full; retry later
  cancelled,         ///< the request was cancelled by its client
  unavailable,       ///< no live engine can take the work (its node is down or unreachable)
  internal,          ///< a component failed (e.g. an executor crashed); the request cannot go on
};

[[nodiscard]] const char* to_string(errc code);

/// Whether `code` names one of the codes above: a value that came from another process is
/// checked with this before it is trusted (an out-of-range value is representable, not UB).
[[nodiscard]] constexpr bool is_valid(errc code) {
  return static_cast<uint8_t>(code) <= static_cast<uint8_t>(errc::internal);
}

struct error {
  errc code = errc::internal;
  std::string message;
};

template <class T>
using expected = tl::expected<T, error>;

/// `return fail(errc::invalid_argument, "top_p must be in (0, 1], got 1.5");`
[[nodiscard]] inline tl::unexpected<error> fail(errc code, std::string message) {
  return tl::unexpected<error>(error{code, std::move(message)});
}

/// The most bytes of a value from outside (a request's key, a file's name field) that an error
/// message quotes: an error must not echo a megabyte back, nor grow with the input.
inline constexpr size_t echo_bytes_max = 64;

/// The most bytes of a file path an error message quotes (a path in a file or a request).
inline constexpr size_t echo_path_bytes_max = 512;

/// `text` as an error message quotes it: whole, or its first `bytes_max` bytes (never ending
/// inside a UTF-8 character) followed by "...".
[[nodiscard]] std::string echo(std::string_view text, size_t bytes_max = echo_bytes_max);

[[noreturn]] void assertion_failed(const char* expr, const char* file, int line,
                                   const char* message);

}  // namespace troupe

/// Always-on assertion (also in release builds): an invariant violation is a bug, never a
/// user error, and continuing would silently corrupt state.
#define TROUPE_ASSERT(expr)                                               \
  do {                                                                    \
    if (!(expr)) ::troupe::assertion_failed(#expr, __FILE__, __LINE__, ""); \
  } while (false)

#define TROUPE_ASSERT_MSG(expr, msg)                                         \
  do {                                                                       \
    if (!(expr)) ::troupe::assertion_failed(#expr, __FILE__, __LINE__, msg); \
  } while (false)
