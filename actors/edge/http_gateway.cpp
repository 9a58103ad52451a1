#include "actors/edge/http_gateway.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <utility>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/engine_actor.hpp"
#include "actors/edge/http_server.hpp"
#include "actors/edge/index_html.hpp"  // generated from actors/edge/web/index.html
#include "runtime/openai/log_lines.hpp"
#include "runtime/openai/metrics.hpp"

namespace troupe::gateway {
namespace {

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void reply_error(http_response& res, const openai::api_error& e) {
  res.reply(e.status, "application/json", openai::render_error(e));
}

/// The value of header `name` (lower case), or "".
std::string_view header(const http_request& req, std::string_view name) {
  for (const auto& [key, value] : req.headers)
    if (key == name) return value;
  return {};
}

/// Whether a preflight's Access-Control-Request-Headers is a plain list of header names (what
/// is echoed back as allowed).
bool is_header_list(std::string_view names) {
  return names.size() <= 1024 && std::all_of(names.begin(), names.end(), [](unsigned char c) {
           return std::isalnum(c) || c == '-' || c == '_' || c == ',' || c == ' ';
         });
}

/// Routes anyone may call when the gateway has API keys: health checks, the web page (it asks
/// for the key), and CORS preflights (a browser sends no credentials with them).
bool is_open_route(const http_request& req, bool metrics_public) {
  return req.method == "OPTIONS" || (req.method == "GET" && (req.path == "/health" || req.path == "/")) ||
         (metrics_public && req.method == "GET" && req.path == "/metrics");
}

/// One HTTP request's access-log line, written when its response is over (the last byte
/// written or the client gone): the response holds it. A completion's answer fills in its id,
/// tokens, TTFT and finish reasons; its prompts only where the format logs them.
class access_entry {
 public:
  access_entry(const http_request& req, const std::shared_ptr<http_response>& res, openai::access_log_format format,
               std::shared_ptr<spdlog::logger> logger)
      : response_(res), format_(format), logger_(std::move(logger)) {
    record_.route = req.method + " " + req.path;
    record_.client = req.peer;
  }
  access_entry(const access_entry&) = delete;
  access_entry& operator=(const access_entry&) = delete;
  ~access_entry() {
    if (const auto res = response_.lock()) record_.status = res->status();
    record_.e2e_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
    logger_->info(format_.json ? openai::render_access_json(record_, format_) : openai::render_access_text(record_, format_));
  }

  void prompts(const std::vector<openai::prompt_input>& prompts) {
    if (!format_.prompts) return;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const openai::prompt_input& p : prompts) record_.prompts.push_back(p.text);
  }
  /// The answer `id`, of `usage`, whose choices ended with `ends`.
  void answered(const std::string& id, const openai::usage_counts& usage, const std::vector<msg::completion_end>& ends) {
    std::lock_guard<std::mutex> lock(mutex_);
    record_.request_id = id;
    record_.prompt_tokens = usage.prompt_tokens;
    record_.completion_tokens = usage.completion_tokens;
    for (const msg::completion_end& end : ends) {
      if (end.num_generated_tokens > 0 && !record_.ttft_ms) record_.ttft_ms = static_cast<double>(end.ttft_ns) / 1e6;
      const std::string reason = engine::to_string(end.finish_reason);
      if (("," + record_.finish_reason + ",").find("," + reason + ",") == std::string::npos)
        record_.finish_reason += (record_.finish_reason.empty() ? "" : ",") + reason;
    }
  }

 private:
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::weak_ptr<http_response> response_;
  const openai::access_log_format format_;
  const std::shared_ptr<spdlog::logger> logger_;
  std::mutex mutex_;
  openai::access_record record_;  // guarded by mutex_
};

/// What came of one choice's completion so far.
struct choice_state {
  bool streamed = false;  ///< its first chunk is out
  openai::token_logprobs next;  ///< where its next streamed tokens' texts start (logprobs)
  openai::streamed_calls calls;  ///< its tool calls streamed so far
  std::optional<actors::completion> done;
};

/// One request's answer: its choices' completions (one client actor each), whose callbacks run
/// on their actors' threads and take turns on `mutex`. The status is decided by the first
/// event: a request refused before its first chunk (a bad parameter the engine found, a prompt
/// too long, overload) gets its error status; once chunks flow the status is 200 and a later
/// failure ends the stream with an error event. A failure of one choice cancels the others.
struct answer {
  std::mutex mutex;
  std::shared_ptr<http_response> response;
  /// The request's access-log line, which its response holds (so written when the response ends).
  std::weak_ptr<access_entry> access;
  std::shared_ptr<const tokenizer> tok;  ///< context.tok's owner
  openai::response_context context;  // request_id: the first completion heard from
  bool stream = false;
  int32_t n = 1;                    ///< choices per prompt
  int32_t max_tokens = 0;           ///< the request's (for /metrics)
  openai::tool_choice tool_mode;    ///< a forced one's calls are read from the choices' texts
  std::optional<uint64_t> seed;     ///< reported; a lone choice without a seed: its end's
  bool named = false;               ///< context.request_id is set
  bool started = false;             ///< the stream's head is out
  bool over = false;                ///< answered (everything, or an error): later events are dropped
  std::vector<choice_state> choices;
  int32_t num_done = 0;
  std::vector<actors::client_actor> clients;  ///< those spawned so far

  void name(int64_t request_id) {
    if (!std::exchange(named, true)) context.request_id = request_id;
  }
  void cancel_clients() const {
    for (const actors::client_actor& client : clients) caf::anon_send(client, msg::cancel_request{});
  }
};

/// The answer to `p` before any event: a state per choice (with the token before its first, for
/// logprobs) and the seed it reports when known now.
std::shared_ptr<answer> new_answer(const openai::parsed_request& p, openai::response_context context,
                                   std::shared_ptr<http_response> response, std::weak_ptr<access_entry> access,
                                   std::shared_ptr<const tokenizer> tok, std::optional<uint64_t> seed) {
  auto a = std::make_shared<answer>();
  a->response = std::move(response);
  a->access = std::move(access);
  a->tok = std::move(tok);
  a->context = context;
  a->context.tok = a->tok.get();
  a->stream = p.request.stream;
  a->n = p.n;
  a->max_tokens = p.request.max_tokens;
  a->tool_mode = p.tool_mode;
  a->seed = seed;
  a->choices.resize(static_cast<size_t>(openai::num_choices(p)));
  for (size_t k = 0; k < a->choices.size(); k++) {
    a->choices[k].next.prev_token = openai::token_before_output(p.prompts[k / static_cast<size_t>(p.n)], *a->tok);
    a->choices[k].calls = openai::streamed_calls(p.tool_mode);
  }
  return a;
}

/// One /v1/embeddings answer: an embedding request per input (one client actor each), whose
/// callbacks take turns on `mutex`; the first failure answers with its error and cancels the rest.
struct embedding_answer {
  std::mutex mutex;
  std::shared_ptr<http_response> response;
  std::weak_ptr<access_entry> access;
  bool base64 = false;
  std::vector<std::optional<msg::completion_end>> ends;  ///< per input, once done
  size_t num_done = 0;
  bool over = false;
  std::vector<actors::client_actor> clients;
};

}  // namespace

struct http_gateway::impl : std::enable_shared_from_this<http_gateway::impl> {
  impl(caf::actor_system& s, gateway_options o)
      : sys(s),
        options(std::move(o)),
        requests(std::numeric_limits<int64_t>::max(), options.limits.max_in_flight_per_address),
        access_logger(gateway::access_logger()) {}

  caf::actor_system& sys;
  gateway_options options;
  address_counts requests;  ///< completions in flight by client address
  std::unique_ptr<http_server> server;
  std::mutex metrics_mutex;
  openai::request_metrics metrics;  // guarded by metrics_mutex
  /// The access log's logger ("access", apps/troupe/logging; the default one where there is none).
  std::shared_ptr<spdlog::logger> access_logger;

  std::mutex serving_mutex;
  std::condition_variable idle;  ///< in_flight became empty
  openai::serving_state state = openai::serving_state::starting;  // guarded by serving_mutex
  actors::balancer_client_actor load_balancer;                   // guarded by serving_mutex
  actors::engine_list engines;                                   // guarded by serving_mutex
  std::shared_ptr<const tokenizer> tok;                          // guarded by serving_mutex
  int32_t context_tokens = 0;                                    // guarded by serving_mutex
  std::shared_ptr<const served_template> chat;                   // guarded by serving_mutex
  int64_t num_admitted = 0;                                      // guarded by serving_mutex
  /// The completions in flight by admission number, with their client actors once spawned.
  std::map<int64_t, std::vector<actors::client_actor>> in_flight;  // guarded by serving_mutex
  std::mt19937_64 seeds{std::random_device{}()};  // guarded by serving_mutex

  /// `f(gateway, args...)` for a callback that may come after the gateway is gone (a client
  /// actor's, or a ticket a response drops late): then it does nothing. While it runs, the
  /// gateway stays.
  template <class F>
  auto guarded(F f) {
    return [gateway = weak_from_this(), f = std::move(f)](auto&&... args) {
      if (const std::shared_ptr<impl> g = gateway.lock()) f(*g, std::forward<decltype(args)>(args)...);
    };
  }

  /// One admitted completion: the balancer it goes to, and a ticket that counts it in flight
  /// until dropped (its response holds it until the last byte is written or the client left).
  struct admission {
    int64_t number = 0;
    actors::balancer_client_actor load_balancer;
    std::shared_ptr<const tokenizer> tok;
    std::shared_ptr<const void> ticket;
  };

  /// Admits one more completion, or answers the 503 of a gateway that is starting or draining.
  tl::expected<admission, openai::api_error> admit() {
    std::lock_guard<std::mutex> lock(serving_mutex);
    if (state != openai::serving_state::ready) return tl::unexpected(openai::not_serving_error(state));
    const int64_t number = ++num_admitted;
    in_flight.emplace(number, std::vector<actors::client_actor>{});
    return admission{number, load_balancer, tok,
                     std::shared_ptr<const void>(nullptr, guarded([number](impl& g, const void*) { g.leave(number); }))};
  }
  /// Counts a request of the client's address (a 429 past its limit) and admits it (`admit`),
  /// its response holding both; nothing when refused, with the error answered.
  std::optional<admission> enter(const http_request& req, http_response& res) {
    std::shared_ptr<const void> counted = requests.enter(req.peer);
    if (!counted) {
      reply_error(res, {429, too_many_in_flight(options.limits), "rate_limit_error", "", "overloaded"});
      return std::nullopt;
    }
    res.hold(std::move(counted));
    auto admitted = admit();
    if (!admitted) {
      reply_error(res, admitted.error());
      return std::nullopt;
    }
    res.hold(std::move(admitted->ticket));
    return std::move(*admitted);
  }
  /// A client actor of admitted completion `number`, which a drain that runs out of time cancels.
  void enroll(int64_t number, const actors::client_actor& client) {
    std::lock_guard<std::mutex> lock(serving_mutex);
    if (auto it = in_flight.find(number); it != in_flight.end()) it->second.push_back(client);
  }
  /// The seed of an answer of several choices that was given none.
  uint64_t draw_seed() {
    std::lock_guard<std::mutex> lock(serving_mutex);
    return seeds();
  }
  void leave(int64_t number) {
    std::lock_guard<std::mutex> lock(serving_mutex);
    const size_t erased = in_flight.erase(number);
    TROUPE_ASSERT(erased == 1);
    if (in_flight.empty()) idle.notify_all();
  }
  openai::serving_state current_state() {
    std::lock_guard<std::mutex> lock(serving_mutex);
    return state;
  }

  void record(const msg::completion_end& end, int32_t max_tokens) {
    std::lock_guard<std::mutex> lock(metrics_mutex);
    metrics.record(end, max_tokens);
  }
  /// Every choice of `a` is done: each prompt's n and its choices' most generated tokens, unless
  /// one of them was cancelled (not answered to its end).
  void record_prompts(const answer& a) {
    std::lock_guard<std::mutex> lock(metrics_mutex);
    for (size_t first = 0; first < a.choices.size(); first += static_cast<size_t>(a.n)) {
      int32_t most = 0;
      bool cancelled = false;
      for (size_t k = first; k < first + static_cast<size_t>(a.n); k++) {
        const msg::completion_end& end = a.choices[k].done->end;
        most = std::max(most, end.num_generated_tokens);
        cancelled = cancelled || end.finish_reason == engine::finish_reason::cancelled;
      }
      if (!cancelled) metrics.record_parallel(a.n, most);
    }
  }

  /// Spawns the client actor of one of `a`'s requests (an answer or an embedding_answer),
  /// counted in its admission (a drain that runs out of time cancels it) and in `a` (cancelled
  /// at once if another of its requests failed already).
  template <class Answer>
  void spawn_for(Answer& a, const admission& admitted, msg::completion_request request,
                 actors::chunk_callback on_chunk, actors::done_callback on_done) {
    actors::client_actor client = actors::spawn_client(sys, admitted.load_balancer, std::move(request),
                                                       std::move(on_chunk), std::move(on_done), options.timeouts);
    enroll(admitted.number, client);
    std::lock_guard<std::mutex> lock(a.mutex);
    a.clients.push_back(client);
    if (a.over) caf::anon_send(client, msg::cancel_request{});
  }

  void handle(const http_request& req, const std::shared_ptr<http_response>& res);
  [[nodiscard]] bool check_origin(const http_request& req, http_response& res) const;
  [[nodiscard]] bool check_key(const http_request& req, http_response& res) const;
  void handle_completion(openai::endpoint kind, const http_request& req, const std::shared_ptr<http_response>& res,
                         const std::shared_ptr<access_entry>& access);
  void handle_embeddings(const http_request& req, const std::shared_ptr<http_response>& res,
                         const std::shared_ptr<access_entry>& access);
  void embedding_done(embedding_answer& a, size_t index, const expected<actors::completion>& outcome);
  void write_chunk(answer& a, int32_t index, const msg::completion_chunk& chunk);
  void write_end(answer& a, int32_t index, const expected<actors::completion>& outcome);
  void finish_answer(answer& a, const openai::usage_counts& usage);
  [[nodiscard]] static std::vector<msg::completion_end> ends_of(const answer& a);
  [[nodiscard]] static openai::usage_counts usage_of(const answer& a);
  void fail_answer(answer& a, const error& e);
  void handle_metrics(http_response& res);
  void handle_models(http_response& res);
  void handle_tokenize(const http_request& req, http_response& res);
  void handle_detokenize(const http_request& req, http_response& res);

  /// What /tokenize and /detokenize read: the tokenizer, the chat template and the context.
  struct vocabulary {
    std::shared_ptr<const tokenizer> tok;
    std::shared_ptr<const served_template> chat;
    int32_t context_tokens = 0;
  };
  /// The vocabulary once `serve` handed it over (draining too), else the 503 of a gateway starting.
  tl::expected<vocabulary, openai::api_error> current_vocabulary() {
    std::lock_guard<std::mutex> lock(serving_mutex);
    if (!tok) return tl::unexpected(openai::not_serving_error(state));
    return vocabulary{tok, chat, context_tokens};
  }
};

void http_gateway::impl::handle_completion(openai::endpoint kind, const http_request& req,
                                           const std::shared_ptr<http_response>& res,
                                           const std::shared_ptr<access_entry>& access) {
  const std::optional<admission> admitted = enter(req, *res);
  if (!admitted) return;
  auto parsed = openai::parse_request(kind, req.body, options.model, admitted->tok.get());
  if (!parsed) return reply_error(*res, parsed.error());
  // A client asks for its priority; it gets no more urgent one than its allowance.
  parsed->request.priority = std::max(parsed->request.priority, options.limits.priority_min);
  // A lone choice without a seed reports the one its request actor draws.
  std::optional<uint64_t> seed;
  if (parsed->request.has_seed) seed = parsed->request.seed;
  if (openai::needs_seed(*parsed)) seed = draw_seed();
  std::vector<msg::completion_request> requests = openai::choice_requests(*parsed, seed.value_or(0));
  const openai::response_context context{kind, 0, unix_seconds(), &options.model, parsed->include_usage, parsed->logprobs};
  access->prompts(parsed->prompts);
  const std::shared_ptr<answer> a = new_answer(*parsed, context, res, access, admitted->tok, seed);
  for (size_t k = 0; k < requests.size(); k++) {
    const auto index = static_cast<int32_t>(k);
    spawn_for(*a, *admitted, std::move(requests[k]),
              guarded([a, index](impl& g, const msg::completion_chunk& c) { g.write_chunk(*a, index, c); }),
              guarded([a, index](impl& g, const expected<actors::completion>& outcome) { g.write_end(*a, index, outcome); }));
  }
  res->on_abandoned([a, number = admitted->number] {
    spdlog::info("http: the client of completion {} went away: cancelling it", number);
    std::lock_guard<std::mutex> lock(a->mutex);
    a->cancel_clients();
  });
}

/// Admitted and counted as a completion is: each input is an embedding request of its own, all
/// placed at once (batched by the engines, with the same bits as alone).
void http_gateway::impl::handle_embeddings(const http_request& req, const std::shared_ptr<http_response>& res,
                                           const std::shared_ptr<access_entry>& access) {
  const std::optional<admission> admitted = enter(req, *res);
  if (!admitted) return;
  auto parsed = openai::parse_embeddings_request(req.body, options.model, *admitted->tok, options.embedding_dim,
                                                 options.pooling);
  if (!parsed) return reply_error(*res, parsed.error());
  access->prompts(parsed->inputs);
  std::vector<msg::completion_request> inputs = openai::embedding_requests(*parsed);
  auto a = std::make_shared<embedding_answer>();
  a->response = res;
  a->access = access;
  a->base64 = parsed->base64;
  a->ends.resize(inputs.size());
  for (size_t k = 0; k < inputs.size(); k++) {
    inputs[k].priority = std::max(inputs[k].priority, options.limits.priority_min);
    spawn_for(*a, *admitted, std::move(inputs[k]), [](const msg::completion_chunk&) {},
              guarded([a, k](impl& g, const expected<actors::completion>& outcome) { g.embedding_done(*a, k, outcome); }));
  }
  res->on_abandoned([a] {
    std::lock_guard<std::mutex> lock(a->mutex);
    for (const actors::client_actor& client : a->clients) caf::anon_send(client, msg::cancel_request{});
  });
}

void http_gateway::impl::embedding_done(embedding_answer& a, size_t index, const expected<actors::completion>& outcome) {
  std::lock_guard<std::mutex> lock(a.mutex);
  if (a.over) return;
  const bool cancelled = outcome && outcome->end.finish_reason == engine::finish_reason::cancelled;
  if (!outcome || cancelled) {  // a cancelled one was refused no vector: its client left, or a drain ran out
    a.over = true;
    for (const actors::client_actor& client : a.clients) caf::anon_send(client, msg::cancel_request{});
    return reply_error(*a.response, openai::error_from(outcome ? error{errc::unavailable, "the embedding was cancelled"}
                                                               : outcome.error()));
  }
  a.ends[index] = outcome->end;
  if (++a.num_done < a.ends.size()) return;
  a.over = true;
  std::vector<msg::completion_end> ends;
  openai::usage_counts usage;
  for (const std::optional<msg::completion_end>& end : a.ends) {
    ends.push_back(*end);
    usage.prompt_tokens += end->num_prompt_tokens;
  }
  if (const auto access = a.access.lock())
    access->answered("embd-" + std::to_string(static_cast<uint64_t>(ends.front().request_id)), usage, ends);
  a.response->reply(200, "application/json", openai::render_embeddings(ends, a.base64, options.model.id));
}

void http_gateway::impl::write_chunk(answer& a, int32_t index, const msg::completion_chunk& chunk) {
  if (!a.stream) return;  // the whole text comes with the end
  std::lock_guard<std::mutex> lock(a.mutex);
  if (a.over) return;
  a.name(chunk.request_id);
  if (!std::exchange(a.started, true)) a.response->begin_stream("text/event-stream");
  choice_state& choice = a.choices[static_cast<size_t>(index)];
  openai::choice_output delta;
  delta.index = index;
  delta.text = chunk.text;
  delta.logprobs = std::move(choice.next);
  delta.reasoning = chunk.reasoning_text;
  delta.tool_calls = choice.calls.push(delta.text, chunk.tool_calls);
  delta.logprobs.tokens = chunk.tokens;
  delta.logprobs.logprobs = chunk.logprobs;
  delta.logprobs.top_logprobs = chunk.top_logprobs;
  choice.next = openai::after(*a.tok, delta.logprobs);
  // A forced choice's scaffolding ("[", "{\"name\": ") read into no call part is no news.
  const bool news = !delta.text.empty() || !delta.reasoning.empty() || !delta.tool_calls.empty() || a.context.logprobs;
  if (a.tool_mode.forced() && !news) return;
  a.response->write(openai::sse_event(openai::render_chunk(a.context, delta, !std::exchange(choice.streamed, true))));
}

void http_gateway::impl::write_end(answer& a, int32_t index, const expected<actors::completion>& outcome) {
  std::lock_guard<std::mutex> lock(a.mutex);
  if (a.over) return;
  if (!outcome) return fail_answer(a, outcome.error());
  const msg::completion_end& end = outcome->end;
  // A cancelled request (its client went away, or a drain ran out of time) was not answered to its end.
  if (end.finish_reason != engine::finish_reason::cancelled) record(end, a.max_tokens);
  a.name(end.request_id);
  if (!a.seed) a.seed = end.seed;
  choice_state& choice = a.choices[static_cast<size_t>(index)];
  choice.done = *outcome;
  a.num_done++;
  const bool last = a.num_done == static_cast<int32_t>(a.choices.size());
  const std::optional<openai::usage_counts> usage = last ? std::optional(usage_of(a)) : std::nullopt;
  if (a.stream) {
    if (!std::exchange(a.started, true)) a.response->begin_stream("text/event-stream");
    a.response->write(openai::sse_event(openai::render_final_chunk(
        a.context, index, end.finish_reason, *a.seed, choice.calls.num_calls() > 0, usage ? &*usage : nullptr)));
  }
  if (!last) return;
  record_prompts(a);
  if (const auto access = a.access.lock()) access->answered(openai::response_id(a.context), *usage, ends_of(a));
  finish_answer(a, *usage);
}

/// The ends of every choice of `a`, all done.
std::vector<msg::completion_end> http_gateway::impl::ends_of(const answer& a) {
  std::vector<msg::completion_end> ends;
  for (const choice_state& choice : a.choices) ends.push_back(choice.done->end);
  return ends;
}

/// The usage of every choice of `a`, all done.
openai::usage_counts http_gateway::impl::usage_of(const answer& a) { return openai::sum_usage(ends_of(a), a.n); }

/// Every choice is done, using `usage` in all: the response, or the stream's end (with the usage
/// chunk where asked for).
void http_gateway::impl::finish_answer(answer& a, const openai::usage_counts& usage) {
  a.over = true;
  if (a.stream) {
    std::string data;
    if (a.context.include_usage) data = openai::sse_event(openai::render_usage_chunk(a.context, *a.seed, usage));
    data += openai::sse_done;
    return a.response->end_stream(data);
  }
  std::vector<openai::choice_output> outputs;
  for (size_t k = 0; k < a.choices.size(); k++) {
    const choice_state& choice = a.choices[k];
    const actors::completion& done = *choice.done;
    std::string text = done.text;
    std::vector<openai::tool_call_part> calls = openai::whole_calls(a.tool_mode, text, done.tool_calls);
    outputs.push_back({static_cast<int32_t>(k), std::move(text), done.end.finish_reason,
                       {done.tokens, done.logprobs, done.top_logprobs, choice.next.prev_token, 0},
                       done.reasoning_text, std::move(calls)});
  }
  a.response->reply(200, "application/json", openai::render_response(a.context, outputs, *a.seed, usage));
}

/// A choice failed: the error (its status before the stream started, else an error event), and
/// the other choices are cancelled.
void http_gateway::impl::fail_answer(answer& a, const error& e) {
  a.over = true;
  a.cancel_clients();
  if (!a.started) return reply_error(*a.response, openai::error_from(e));
  a.response->end_stream(openai::sse_event(openai::render_error(openai::error_from(e))) + std::string(openai::sse_done));
}

void http_gateway::impl::handle_metrics(http_response& res) {
  actors::engine_list queried;
  int64_t num_in_flight = 0;
  {
    std::lock_guard<std::mutex> lock(serving_mutex);
    queried = engines;
    num_in_flight = static_cast<int64_t>(in_flight.size());
  }
  std::vector<msg::engine_report> reports;
  for (const actors::engine_actor& engine : queried) {
    auto report = actors::query_engine(sys, engine, options.engine_query_timeout);
    if (!report) return reply_error(res, openai::error_from({errc::unavailable, report.error().message}));
    reports.push_back(*report);
  }
  const openai::engine_gauges gauges = openai::sum_reports(reports, options.kv_cache);
  std::lock_guard<std::mutex> lock(metrics_mutex);
  metrics.num_in_flight = num_in_flight;
  res.reply(200, "text/plain; version=0.0.4", openai::render_metrics(metrics, gauges, options.model.id));
}

/// CORS: a request from a browser page of another origin is served only when that origin is
/// allowed (its answer then names it in Access-Control-Allow-Origin), else refused with a 403 (a
/// preflight too); a page of the gateway's own origin always is. Answers preflights. True: go on.
bool http_gateway::impl::check_origin(const http_request& req, http_response& res) const {
  const std::string_view origin = header(req, "origin");
  const cors_origins& allowed = options.access.origins;
  if (origin.empty()) {
    if (req.method != "OPTIONS") return true;
    res.add_header("Allow", "GET, POST, OPTIONS");
    res.reply(200, "text/plain; charset=utf-8", "");
    return false;
  }
  if (!allowed.allows(origin, req.secure ? "https" : "http", header(req, "host"))) {
    spdlog::info("http: refused a {} {} from {}: origin {} is not allowed (--allowed-origins)", req.method, req.path,
                 req.peer, echo(origin, 80));
    reply_error(res, {403, "the origin " + echo(origin, 80) + " may not call this API (--allowed-origins)",
                      "permission_error", "", "origin_not_allowed"});
    return false;
  }
  if (allowed.lists(origin)) {
    res.add_header("Access-Control-Allow-Origin", origin);
    res.add_header("Vary", "Origin");
  }
  if (req.method != "OPTIONS") return true;
  res.add_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
  const std::string_view asked = header(req, "access-control-request-headers");
  res.add_header("Access-Control-Allow-Headers", is_header_list(asked) && !asked.empty() ? asked : "Authorization, Content-Type");
  res.add_header("Access-Control-Max-Age", "600");
  res.reply(200, "text/plain; charset=utf-8", "");
  return false;
}

/// With API keys, every route but the open ones needs `Authorization: Bearer KEY` (else a 401,
/// as OpenAI answers). True: go on.
bool http_gateway::impl::check_key(const http_request& req, http_response& res) const {
  const api_keys& keys = options.access.keys;
  if (keys.empty() || is_open_route(req, options.access.metrics_public)) return true;
  const std::string_view given = header(req, "authorization");
  if (!given.empty() && keys.accepts_authorization(given)) return true;
  res.add_header("WWW-Authenticate", "Bearer");
  reply_error(res, {401, given.empty() ? "this API needs a key: send the header Authorization: Bearer KEY"
                                       : "the API key given in the Authorization header is not valid",
                    "invalid_request_error", "", "invalid_api_key"});
  return false;
}

void http_gateway::impl::handle_models(http_response& res) {
  int32_t context = 0;
  {
    std::lock_guard<std::mutex> lock(serving_mutex);
    context = context_tokens;
  }
  res.reply(200, "application/json", openai::render_models(options.model, context));
}

void http_gateway::impl::handle_tokenize(const http_request& req, http_response& res) {
  auto v = current_vocabulary();
  if (!v) return reply_error(res, v.error());
  auto parsed = openai::parse_tokenize_request(req.body, options.model);
  if (!parsed) return reply_error(res, parsed.error());
  auto tokens = openai::tokenize(*parsed, *v->tok, *v->chat);
  if (!tokens) return reply_error(res, tokens.error());
  res.reply(200, "application/json",
            openai::render_tokenize(*tokens, v->context_tokens, *v->tok, parsed->return_token_strs));
}

void http_gateway::impl::handle_detokenize(const http_request& req, http_response& res) {
  auto v = current_vocabulary();
  if (!v) return reply_error(res, v.error());
  auto tokens = openai::parse_detokenize_request(req.body, options.model, *v->tok);
  if (!tokens) return reply_error(res, tokens.error());
  res.reply(200, "application/json", openai::render_detokenize(*tokens, *v->tok));
}

void http_gateway::impl::handle(const http_request& req, const std::shared_ptr<http_response>& res) {
  const auto access = std::make_shared<access_entry>(req, res, options.access_log, access_logger);
  res->hold(access);
  if (!check_origin(req, *res) || !check_key(req, *res)) return;
  if (req.body_too_large)
    return reply_error(*res, {400, "the request body has " + std::to_string(req.content_length) + " bytes; the limit is " +
                                       std::to_string(options.body_bytes_max), "invalid_request_error", "", ""});
  const std::string route = req.method + " " + req.path;
  if (route == "POST /v1/completions") return handle_completion(openai::endpoint::completions, req, res, access);
  if (route == "POST /v1/chat/completions") return handle_completion(openai::endpoint::chat_completions, req, res, access);
  if (route == "GET /v1/models") return handle_models(*res);
  if (route == "POST /v1/embeddings") return handle_embeddings(req, res, access);
  if (route == "POST /tokenize") return handle_tokenize(req, *res);
  if (route == "POST /detokenize") return handle_detokenize(req, *res);
  if (route == "GET /") return res->reply(200, "text/html; charset=utf-8", index_html);
  if (route == "GET /metrics") return handle_metrics(*res);
  if (route == "GET /health") {
    const openai::serving_state now = current_state();
    return res->reply(openai::health_status(now), "application/json", openai::render_health(now));
  }
  reply_error(*res, {404, "no route for " + route, "not_found_error", "", ""});
}

expected<std::unique_ptr<http_gateway>> http_gateway::start(caf::actor_system& sys, gateway_options options) {
  auto state = std::make_shared<impl>(sys, std::move(options));
  impl& s = *state;
  http_server_options o{s.options.address, s.options.port,   s.options.body_bytes_max, s.options.num_threads,
                        s.options.limits,  s.options.access.tls, s.options.stop_timeout};
  auto server = http_server::start(std::move(o), [&s](const http_request& req, const std::shared_ptr<http_response>& res) {
    s.handle(req, res);
  });
  if (!server) return tl::unexpected(server.error());
  s.server = std::move(*server);
  return std::unique_ptr<http_gateway>(new http_gateway(std::move(state)));
}

http_gateway::http_gateway(std::shared_ptr<impl> state) : impl_(std::move(state)) {}

void http_gateway::serve(actors::balancer_client_actor load_balancer, actors::engine_list engines,
                         std::shared_ptr<const tokenizer> tok, int32_t context_tokens,
                         std::shared_ptr<const served_template> chat) {
  TROUPE_ASSERT_MSG(tok, "the HTTP gateway needs the served model's tokenizer");
  TROUPE_ASSERT_MSG(load_balancer, "the HTTP gateway serves the load balancer's node");
  std::lock_guard<std::mutex> lock(impl_->serving_mutex);
  TROUPE_ASSERT_MSG(impl_->state == openai::serving_state::starting, "serve() is called once, before drain()");
  impl_->load_balancer = std::move(load_balancer);
  impl_->engines = std::move(engines);
  impl_->tok = std::move(tok);
  impl_->context_tokens = context_tokens;
  {
    // No completion is recorded before the gateway serves: the token histograms' buckets reach
    // the context (vLLM's 1-2-5 series up to max_model_len).
    std::lock_guard<std::mutex> metrics_lock(impl_->metrics_mutex);
    impl_->metrics = openai::request_metrics(context_tokens);
  }
  impl_->chat = chat ? std::move(chat) : std::make_shared<const served_template>();
  impl_->state = openai::serving_state::ready;
}

bool http_gateway::drain(std::chrono::milliseconds bound) {
  std::unique_lock<std::mutex> lock(impl_->serving_mutex);
  impl_->state = openai::serving_state::draining;
  spdlog::info("http: draining: {} request(s) in flight", impl_->in_flight.size());
  if (impl_->idle.wait_for(lock, bound, [this] { return impl_->in_flight.empty(); })) return true;
  spdlog::warn("http: {} request(s) still in flight after {} ms: cancelling them", impl_->in_flight.size(), bound.count());
  for (const auto& [number, clients] : impl_->in_flight)
    for (const actors::client_actor& client : clients) caf::anon_send(client, msg::cancel_request{});
  return false;
}

http_gateway::~http_gateway() { impl_->server.reset(); }

uint16_t http_gateway::port() const { return impl_->server->port(); }

}  // namespace troupe::gateway
