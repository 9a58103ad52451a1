#include "apps/troupe/logging.hpp"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string_view>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace troupe::cli {
namespace {

log_options applied;

/// `t` in UTC as ISO 8601 with milliseconds: "2026-12-06T03:00:17.123Z".
std::string iso_time(spdlog::log_clock::time_point t) {
  const std::time_t seconds = spdlog::log_clock::to_time_t(t);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() % 1000;
  std::tm utc{};
  ::gmtime_r(&seconds, &utc);
  char day[24];
  std::strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &utc);
  char out[32];
  std::snprintf(out, sizeof out, "%s.%03dZ", day, static_cast<int>(ms));
  return out;
}

/// Each line one JSON object (openai::render_log_json); the access logger's message is its
/// record's fields, merged in.
class json_formatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const std::string_view logger(msg.logger_name.data(), msg.logger_name.size());
    const std::string_view text(msg.payload.data(), msg.payload.size());
    const auto level = spdlog::level::to_string_view(msg.level);
    const std::string line = openai::render_log_json(iso_time(msg.time), std::string_view(level.data(), level.size()),
                                                     logger, text, logger == "access" ? text : std::string_view()) +
                             "\n";
    dest.append(line.data(), line.data() + line.size());
  }
  [[nodiscard]] std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<json_formatter>(); }
};

}  // namespace

void add_log_flags(CLI::App& app, log_options& o) {
  app.add_option("--log-level", o.level, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.add_option("--log-format", o.format,
                 "text, or json: each log line one JSON object (time, level, logger, msg; an access line's fields)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app.add_flag("--log-prompts", o.prompts, "the access log carries each request's prompt text (never otherwise)");
}

void make_loggers() {
  // stdout carries only generated text; every log line goes to stderr.
  const auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("troupe", sink));
  spdlog::register_logger(std::make_shared<spdlog::logger>("access", sink));
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
}

void apply_log_options(const log_options& o) {
  applied = o;
  spdlog::set_level(spdlog::level::from_str(o.level));
  if (o.format == "json") spdlog::set_formatter(std::make_unique<json_formatter>());
}

const log_options& log_settings() { return applied; }

openai::access_log_format access_log_settings() { return {applied.format == "json", applied.prompts}; }

}  // namespace troupe::cli
