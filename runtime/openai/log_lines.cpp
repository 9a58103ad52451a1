#include "runtime/openai/log_lines.hpp"


#include <nlohmann/json.hpp>

namespace troupe::openai {
namespace {

using ordered = nlohmann::ordered_json;

/// Milliseconds to the microsecond.
double rounded_ms(double ms) { return static_cast<double>(static_cast<int64_t>(ms * 1000.0 + 0.5)) / 1000.0; }

/// A JSON string, with invalid UTF-8 replaced (a prompt's bytes are the client's).
std::string quoted(const std::string& s) { return ordered(s).dump(-1, ' ', false, ordered::error_handler_t::replace); }

ordered access_fields(const access_record& r, const access_log_format& format) {
  ordered j;
  j["msg"] = "access";
  j["request_id"] = r.request_id.empty() ? ordered() : ordered(r.request_id);
  j["route"] = r.route;
  j["status"] = r.status;
  j["client"] = r.client;
  j["prompt_tokens"] = r.prompt_tokens ? ordered(*r.prompt_tokens) : ordered();
  j["completion_tokens"] = r.completion_tokens ? ordered(*r.completion_tokens) : ordered();
  j["ttft_ms"] = r.ttft_ms ? ordered(rounded_ms(*r.ttft_ms)) : ordered();
  j["e2e_ms"] = rounded_ms(r.e2e_ms);
  j["finish_reason"] = r.finish_reason.empty() ? ordered() : ordered(r.finish_reason);
  if (format.prompts) j["prompts"] = r.prompts;
  return j;
}

}  // namespace

std::string render_access_text(const access_record& r, const access_log_format& format) {
  const ordered j = access_fields(r, format);
  std::string out = "access";
  for (const auto& [key, value] : j.items()) {
    if (key == "msg") continue;
    out += " " + key + "=";
    if (value.is_null())
      out += "-";
    else if (key == "route" || key == "prompts")
      out += value.dump(-1, ' ', false, ordered::error_handler_t::replace);
    else
      out += value.is_string() ? value.get<std::string>() : value.dump();
  }
  return out;
}

std::string render_access_json(const access_record& r, const access_log_format& format) {
  return access_fields(r, format).dump(-1, ' ', false, ordered::error_handler_t::replace);
}

std::string render_log_json(std::string_view time, std::string_view level, std::string_view logger,
                            std::string_view msg, std::string_view fields) {
  std::string out = "{\"time\":" + quoted(std::string(time)) + ",\"level\":" + quoted(std::string(level)) +
                    ",\"logger\":" + quoted(std::string(logger)) + ",";
  if (fields.size() > 2 && fields.front() == '{') return out.append(fields.substr(1));
  return out + "\"msg\":" + quoted(std::string(msg)) + "}";
}

}  // namespace troupe::openai
