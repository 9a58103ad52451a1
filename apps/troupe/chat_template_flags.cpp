// The chat template flags of serve, node and render-chat: a Jinja file to serve instead of the
// model's own template, and the date its strftime_now formats (today's unless given).
#include <chrono>
#include <ctime>
#include <fstream>

#include "apps/troupe/commands.hpp"
#include "runtime/tokenizer/served_template.hpp"

namespace troupe::cli {

void chat_template_flags::add_to(CLI::App* cmd) {
  cmd->add_option("--chat-template", file,
                  "a Jinja chat template file to render chats with, instead of the model's own "
                  "(docs/chat-templates.md)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--template-date", date,
                  "the date YYYY-MM-DD a chat template's strftime_now formats (default: today, UTC)");
}

expected<std::string> read_bounded(std::istream& in, size_t bytes_max, const std::string& what) {
  std::string text(bytes_max + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > bytes_max)
    return fail(errc::too_long, what + " is longer than " + std::to_string(bytes_max) + " bytes");
  if (in.bad()) return fail(errc::io_error, "cannot read " + what);
  return text;
}

expected<std::optional<std::string>> chat_template_flags::read_file() const {
  if (file.empty()) return std::nullopt;
  std::ifstream in(file, std::ios::binary);
  if (!in) return fail(errc::io_error, "cannot open chat template '" + echo(file, echo_path_bytes_max) + "'");
  auto text = read_bounded(in, jinja::limits{}.template_bytes_max, "chat template '" + echo(file, echo_path_bytes_max) + "'");
  if (!text) return tl::unexpected(text.error());
  return std::optional<std::string>(std::move(*text));
}

expected<jinja::civil_date> chat_template_flags::resolve_date() const {
  if (!date.empty()) return parse_civil_date(date);
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  jinja::civil_date d;
  d.year = utc.tm_year + 1900;
  d.month = utc.tm_mon + 1;
  d.day = utc.tm_mday;
  return d;
}

}  // namespace troupe::cli
