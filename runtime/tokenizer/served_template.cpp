#include "runtime/tokenizer/served_template.hpp"

#include <array>
#include <charconv>
#include <cstdio>
#include <utility>

#include <nlohmann/json.hpp>

namespace troupe {
namespace {

using json = nlohmann::ordered_json;

/// The keys chat_template_kwargs may not set, and why.
constexpr std::array<std::pair<std::string_view, std::string_view>, 6> reserved_keys{{
    {"messages", "the request's own field"},
    {"tools", "the request's own field"},
    {"add_generation_prompt", "the request's own field"},
    {"bos_token", "the model's token text"},
    {"eos_token", "the model's token text"},
    {"date_string", "the server's --template-date"},
}};

/// The text of special token `id` as a template names it ("" if it is none).
std::string special_text(const special_tokens& specials, std::int32_t id) {
  for (const auto& [text, token] : specials.by_text)
    if (token == id) return text;
  return "";
}

/// The segments of a rendered text: its template-owned runs are template text, the rest user.
std::vector<segment> segments_of(const jinja::text& rendered) {
  std::vector<segment> out;
  for (const jinja::origin_span& s : rendered.spans())
    out.push_back(segment{rendered.str().substr(s.begin, s.end - s.begin),
                          s.from == jinja::origin::templ ? origin::template_text : origin::user});
  return out;
}

/// The Jinja context: the kwargs' keys (none reserved), then the request's and the model's.
expected<json> context_of(const json& request, const jinja_chat_options& o) {
  json ctx = json::object();
  const auto kwargs = request.find("chat_template_kwargs");
  if (kwargs != request.end() && !kwargs->is_null())
    for (const auto& [key, value] : kwargs->items()) {
      for (const auto& [reserved, why] : reserved_keys)
        if (key == reserved)
          return fail(errc::invalid_argument,
                      "chat_template_kwargs may not set '" + key + "' (" + std::string(why) + ")");
      ctx[key] = value;
    }
  ctx["messages"] = request.at("messages");
  if (const auto tools = request.find("tools"); tools != request.end() && !tools->is_null()) ctx["tools"] = *tools;
  ctx["add_generation_prompt"] = request.value("add_generation_prompt", true);
  ctx["bos_token"] = o.bos_token;
  ctx["eos_token"] = o.eos_token;
  return ctx;
}

/// The days of `month` (1..12) in `year` of the Gregorian calendar.
int days_in_month(int year, int month) {
  static constexpr std::array<int, 12> days{31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  return month == 2 && leap ? 29 : days[static_cast<size_t>(month - 1)];
}

}  // namespace

jinja_chat_options jinja_options_for(const tokenizer& tok, const jinja::civil_date& date) {
  const special_tokens specials = special_tokens::of(tok);
  jinja_chat_options o;
  o.bos_token = special_text(specials, tok.bos_id());
  o.eos_token = special_text(specials, tok.eos_id());
  o.strip_bos = tok.adds_bos();
  o.date = date;
  return o;
}

served_template served_template::builtin(chat_template t) {
  served_template s;
  s.stop_format_ = t;
  return s;
}

expected<served_template> served_template::jinja(std::string_view source, jinja_chat_options options) {
  auto program = jinja::program::parse(source, options.bounds);
  if (!program) return fail(errc::invalid_argument, options.source_name + " does not parse: " + program.error().message);
  served_template s;
  s.program_ = std::move(*program);
  s.stop_format_ = recognise_chat_template(source).value_or(chat_template::plain);
  s.options_ = std::move(options);
  return s;
}

expected<std::vector<segment>> served_template::render(const json& request) const {
  TROUPE_ASSERT(request.is_object() && request.contains("messages"));
  return program_ ? render_jinja(request) : render_builtin(request);
}

/// The built-in formats take messages of a role and a string content, and no tools.
expected<std::vector<segment>> served_template::render_builtin(const json& request) const {
  if (request.contains("tools") && !request["tools"].is_null() && !request["tools"].empty())
    return fail(errc::invalid_argument, std::string("the built-in ") + to_string(stop_format_) +
                                            " chat template takes no tools (the model has no template of its own)");
  std::vector<chat_message> messages;
  for (const json& m : request["messages"]) {
    const json& content = m.contains("content") ? m["content"] : json();
    if (!m.contains("role") || !m["role"].is_string() || !(content.is_string() || content.is_null()))
      return fail(errc::invalid_argument, "the built-in chat templates take messages of a role and a string content");
    if (m.contains("tool_calls") || m.value("role", "") == "tool")
      return fail(errc::invalid_argument, std::string("the built-in ") + to_string(stop_format_) +
                                              " chat template takes no tool calls or tool results (the model has no "
                                              "template of its own)");
    messages.push_back({m["role"].get<std::string>(), content.is_null() ? "" : content.get<std::string>()});
  }
  return render_chat(stop_format_, messages, request.value("add_generation_prompt", true));
}

expected<std::vector<segment>> served_template::render_jinja(const json& request) const {
  auto context = context_of(request, options_);
  if (!context) return tl::unexpected(context.error());
  jinja::render_options ro;
  ro.bounds = options_.bounds;
  ro.date = options_.date;
  auto rendered = program_->render(*context, ro);
  if (!rendered) return fail(errc::invalid_argument, options_.source_name + " failed: " + rendered.error().message);
  const std::string& bos = options_.bos_token;
  const bool starts_with_bos = !bos.empty() && rendered->str().compare(0, bos.size(), bos) == 0 &&
                               rendered->origin_of(0, bos.size()) == jinja::origin::templ;
  if (options_.strip_bos && starts_with_bos)
    return segments_of(rendered->substr(bos.size()));
  return segments_of(*rendered);
}

std::string served_template::description() const {
  if (!program_) return std::string("the built-in ") + to_string(stop_format_) + " chat format";
  return options_.source_name + " (Jinja), strftime_now date " + to_string(options_.date);
}

expected<served_template> choose_served_template(const std::string& name, const std::optional<std::string>& jinja_source,
                                                 const tokenizer& tok, jinja_chat_options options) {
  if (jinja_source) return served_template::jinja(*jinja_source, std::move(options));
  if (name == "auto" && !tok.chat_template_text().empty())
    return served_template::jinja(tok.chat_template_text(), std::move(options));
  auto t = name == "auto" ? expected<chat_template>(chat_template::bare) : parse_chat_template(name);
  if (!t) return tl::unexpected(t.error());
  if (auto ok = check_chat_template(*t, tok); !ok) return tl::unexpected(ok.error());
  return served_template::builtin(*t);
}

expected<jinja::civil_date> parse_civil_date(std::string_view text) {
  const auto bad = [&] {
    return fail(errc::invalid_argument, "'" + echo(std::string(text)) + "' is not a date YYYY-MM-DD");
  };
  if (text.size() != 10 || text[4] != '-' || text[7] != '-') return bad();
  jinja::civil_date d;
  for (const auto& [begin, out] : {std::pair{0, &d.year}, std::pair{5, &d.month}, std::pair{8, &d.day}}) {
    const std::string_view digits = text.substr(static_cast<size_t>(begin), begin == 0 ? 4 : 2);
    for (const char c : digits)
      if (c < '0' || c > '9') return bad();
    std::from_chars(digits.data(), digits.data() + digits.size(), *out);
  }
  if (d.month < 1 || d.month > 12 || d.day < 1 || d.day > days_in_month(d.year, d.month)) return bad();
  return d;
}

std::string to_string(const jinja::civil_date& date) {
  char out[16];
  std::snprintf(out, sizeof out, "%04d-%02d-%02d", date.year, date.month, date.day);
  return out;
}

}  // namespace troupe
