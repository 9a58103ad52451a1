#pragma once

/// The log lines the server writes for operators: one access record per HTTP request, in text
/// (`key=value`) or as JSON fields (`--log-format json`), and a whole JSON log line. Pure: the
/// gateway measures and fills the record, apps/troupe/logging writes the lines.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::openai {

/// How the access log is written: `json` fields or text, with the prompts or without.
struct access_log_format {
  bool json = false;
  bool prompts = false;  ///< `--log-prompts`: the prompt texts are logged (never otherwise)
};

/// One HTTP request as the access log records it; what a route does not have stays empty.
struct access_record {
  std::string request_id;  ///< a completion's response id ("cmpl-…"); "" for other routes
  std::string route;       ///< "POST /v1/completions"
  int status = 0;          ///< 0: no response was started
  std::string client;      ///< the peer's address
  std::optional<int64_t> prompt_tokens;
  std::optional<int64_t> completion_tokens;
  std::optional<double> ttft_ms;  ///< the first choice's first token, from arrival at the request actor
  double e2e_ms = 0;              ///< the request's arrival at the gateway to its response's last byte
  std::string finish_reason;      ///< the choices' reasons, distinct ones joined by ','
  std::vector<std::string> prompts;  ///< only where the format logs prompts
};

/// The record as text: `access request_id=… route="…" status=… client=… prompt_tokens=…
/// completion_tokens=… ttft_ms=… e2e_ms=… finish_reason=…` ("-" for what it lacks), then
/// `prompts=[…]` (a JSON array of strings) where `format.prompts`.
[[nodiscard]] std::string render_access_text(const access_record& r, const access_log_format& format);

/// The record as one JSON object: {"msg":"access","request_id":…,"route":…,"status":…,
/// "client":…,"prompt_tokens":…,"completion_tokens":…,"ttft_ms":…,"e2e_ms":…,
/// "finish_reason":…} (null for what it lacks), with "prompts" where `format.prompts`.
[[nodiscard]] std::string render_access_json(const access_record& r, const access_log_format& format);

/// One log line as a JSON object (no newline): {"time":…,"level":…,"logger":…,"msg":…}.
/// `fields`, a JSON object's text (an access record's), is merged in instead of "msg" when not empty.
[[nodiscard]] std::string render_log_json(std::string_view time, std::string_view level, std::string_view logger,
                                          std::string_view msg, std::string_view fields = {});

}  // namespace troupe::openai
