#include "runtime/common/bounded_json.hpp"

#include <string>

#include <nlohmann/json.hpp>

namespace troupe {
namespace {

/// Thrown by the parser's callback at a container nested deeper than the bound.
struct too_deep {};

}  // namespace

expected<nlohmann::ordered_json> parse_bounded_json(std::string_view text, int depth_max) {
  using json = nlohmann::ordered_json;
  // The parser keeps its own stack; the callback sees each container's depth as it opens.
  const json::parser_callback_t bounded = [depth_max](int depth, json::parse_event_t event, json&) {
    const bool opens = event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
    if (opens && depth >= depth_max) throw too_deep{};
    return true;
  };
  try {
    return json::parse(text, bounded);
  } catch (const too_deep&) {
    return fail(errc::invalid_argument, "nests objects and lists deeper than " + std::to_string(depth_max) + " levels");
  } catch (const json::exception& e) {
    // nlohmann's message quotes what it last read (a token, a number), which may be the whole
    // text; its own text is under 200 bytes.
    return fail(errc::invalid_argument, "is not valid JSON: " + echo(e.what(), 200 + echo_bytes_max));
  }
}

}  // namespace troupe
