#pragma once

/// What a render may use and what it is given besides the context. A template is input: every
/// resource it can make the interpreter spend has a bound here, and passing one is an error
/// value naming the bound, never a crash.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::jinja {

struct limits {
  size_t template_bytes_max = 1 << 20;     ///< the source's size
  size_t output_bytes_max = 16 << 20;      ///< the rendered text (and any string built on the way)
  size_t loop_iterations_max = 1 << 20;    ///< for-loop bodies run, all loops together; also range()'s length
  size_t nesting_depth_max = 128;          ///< the parse tree's height (blocks, brackets, operator chains)
  size_t call_depth_max = 32;              ///< macro calls in progress (recursion)
  /// Expressions and blocks being evaluated at once, across macro calls: what bounds the stack.
  size_t eval_depth_max = 256;
};

/// `strftime_now(fmt)` formats this date, never the clock: the caller passes the day it wants
/// the prompt to say (and reports it, so a render can be replayed).
struct civil_date {
  int year = 1970;
  int month = 1;   ///< 1..12
  int day = 1;     ///< 1..31
  int hour = 0;
  int minute = 0;
  int second = 0;
};

struct render_options {
  limits bounds;
  civil_date date;
  /// Context keys whose strings are the template's own text, not data: the special tokens the
  /// caller takes from the model's vocabulary. Every other context string is data.
  std::vector<std::string> template_owned_keys = {"bos_token", "eos_token"};
};

}  // namespace troupe::jinja
