#include "gateway/http_gateway.hpp"

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/engine_actor.hpp"
#include "gateway/http_server.hpp"
#include "gateway/index_html.hpp"  // generated from gateway/web/index.html
#include "openai/metrics.hpp"

namespace troupe::gateway {
namespace {

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void reply_error(http_response& res, const openai::api_error& e) {
  res.reply(e.status, "application/json", openai::render_error(e));
}

/// One completion's answer, written by its client actor's callbacks (one at a time: an actor
/// handles one message at a time). The status is decided by the first event: a request refused
/// before its first chunk (a bad parameter the engine found, a prompt too long, overload) gets
/// its error status; once chunks flow the status is 200 and a later failure ends the stream
/// with an error event.
struct answer {
  std::shared_ptr<http_response> response;
  openai::response_context context;
  bool stream = false;
  bool started = false;  ///< the stream's head is out
};

}  // namespace

struct http_gateway::impl {
  impl(caf::actor_system& s, gateway_options o) : sys(s), options(std::move(o)) {}

  caf::actor_system& sys;
  gateway_options options;
  std::unique_ptr<http_server> server;
  std::mutex metrics_mutex;
  openai::request_metrics metrics;  // guarded by metrics_mutex

  std::mutex serving_mutex;
  std::condition_variable idle;  ///< in_flight became empty
  openai::serving_state state = openai::serving_state::starting;  // guarded by serving_mutex
  actors::balancer_client_actor load_balancer;                   // guarded by serving_mutex
  actors::engine_list engines;                                   // guarded by serving_mutex
  int64_t num_admitted = 0;                                      // guarded by serving_mutex
  /// The completions in flight by admission number, with their client actors once spawned.
  std::map<int64_t, actors::client_actor> in_flight;  // guarded by serving_mutex

  /// One admitted completion: the balancer it goes to, and a ticket that counts it in flight
  /// until dropped (its response holds it until the last byte is written or the client left).
  struct admission {
    int64_t number = 0;
    actors::balancer_client_actor load_balancer;
    std::shared_ptr<const void> ticket;
  };

  /// Admits one more completion, or answers the 503 of a gateway that is starting or draining.
  tl::expected<admission, openai::api_error> admit() {
    std::lock_guard<std::mutex> lock(serving_mutex);
    if (state != openai::serving_state::ready) return tl::unexpected(openai::not_serving_error(state));
    const int64_t number = ++num_admitted;
    in_flight.emplace(number, actors::client_actor{});
    return admission{number, load_balancer, std::shared_ptr<const void>(nullptr, [this, number](const void*) { leave(number); })};
  }
  /// The client actor of admitted completion `number`, which a drain that runs out of time cancels.
  void enroll(int64_t number, const actors::client_actor& client) {
    std::lock_guard<std::mutex> lock(serving_mutex);
    if (auto it = in_flight.find(number); it != in_flight.end()) it->second = client;
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

  void record(const msg::completion_end& end) {
    std::lock_guard<std::mutex> lock(metrics_mutex);
    metrics.record(end);
  }

  void handle(const http_request& req, const std::shared_ptr<http_response>& res);
  void handle_completion(openai::endpoint kind, const http_request& req, const std::shared_ptr<http_response>& res);
  void write_chunk(answer& a, const msg::completion_chunk& chunk);
  void write_end(answer& a, const expected<actors::completion>& outcome);
  void handle_metrics(http_response& res);
};

void http_gateway::impl::handle_completion(openai::endpoint kind, const http_request& req,
                                           const std::shared_ptr<http_response>& res) {
  auto admitted = admit();
  if (!admitted) return reply_error(*res, admitted.error());
  res->hold(std::move(admitted->ticket));
  auto parsed = openai::parse_request(kind, req.body, options.model);
  if (!parsed) return reply_error(*res, parsed.error());
  auto a = std::make_shared<answer>(
      answer{res, {kind, 0, unix_seconds(), &options.model, parsed->include_usage}, parsed->request.stream});
  actors::client_actor client = actors::spawn_client(
      sys, admitted->load_balancer, parsed->request, [this, a](const msg::completion_chunk& c) { write_chunk(*a, c); },
      [this, a](const expected<actors::completion>& outcome) { write_end(*a, outcome); }, options.timeouts);
  enroll(admitted->number, client);
  res->on_abandoned([client, number = admitted->number] {
    spdlog::info("http: the client of completion {} went away: cancelling it", number);
    caf::anon_send(client, msg::cancel_request{});
  });
}

void http_gateway::impl::write_chunk(answer& a, const msg::completion_chunk& chunk) {
  if (!a.stream) return;  // the whole text comes with the end
  a.context.request_id = chunk.request_id;
  if (!a.started) a.response->begin_stream("text/event-stream");
  a.response->write(openai::sse_event(openai::render_chunk(a.context, chunk.text, !a.started)));
  a.started = true;
}

void http_gateway::impl::write_end(answer& a, const expected<actors::completion>& outcome) {
  if (!outcome && !a.started) return reply_error(*a.response, openai::error_from(outcome.error()));
  if (outcome) {
    // A cancelled request (its client went away, or a drain ran out of time) was not answered to its end.
    if (outcome->end.finish_reason != engine::finish_reason::cancelled) record(outcome->end);
    a.context.request_id = outcome->end.request_id;
  }
  if (!a.stream)
    return a.response->reply(200, "application/json", openai::render_response(a.context, outcome->text, outcome->end));
  if (!a.started) a.response->begin_stream("text/event-stream");
  std::string data;
  if (outcome) {
    data = openai::sse_event(openai::render_final_chunk(a.context, outcome->end));
    if (a.context.include_usage) data += openai::sse_event(openai::render_usage_chunk(a.context, outcome->end));
  } else {
    data = openai::sse_event(openai::render_error(openai::error_from(outcome.error())));
  }
  data += openai::sse_done;
  a.response->end_stream(data);
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
    auto report = actors::query_engine(sys, engine);
    if (!report) return reply_error(res, openai::error_from(report.error()));
    reports.push_back(*report);
  }
  const openai::engine_gauges gauges = openai::sum_reports(reports, options.num_kv_blocks_total);
  std::lock_guard<std::mutex> lock(metrics_mutex);
  metrics.num_in_flight = num_in_flight;
  res.reply(200, "text/plain; version=0.0.4", openai::render_metrics(metrics, gauges, options.model.id));
}

void http_gateway::impl::handle(const http_request& req, const std::shared_ptr<http_response>& res) {
  if (req.body_too_large)
    return reply_error(*res, {400, "the request body has " + std::to_string(req.content_length) + " bytes; the limit is " +
                                       std::to_string(options.body_bytes_max), "invalid_request_error", "", ""});
  const std::string route = req.method + " " + req.path;
  if (route == "POST /v1/completions") return handle_completion(openai::endpoint::completions, req, res);
  if (route == "POST /v1/chat/completions") return handle_completion(openai::endpoint::chat_completions, req, res);
  if (route == "GET /v1/models") return res->reply(200, "application/json", openai::render_models(options.model));
  if (route == "GET /") return res->reply(200, "text/html; charset=utf-8", index_html);
  if (route == "GET /metrics") return handle_metrics(*res);
  if (route == "GET /health") {
    const openai::serving_state now = current_state();
    return res->reply(openai::health_status(now), "application/json", openai::render_health(now));
  }
  reply_error(*res, {404, "no route for " + route, "not_found_error", "", ""});
}

expected<std::unique_ptr<http_gateway>> http_gateway::start(caf::actor_system& sys, gateway_options options) {
  auto state = std::make_unique<impl>(sys, std::move(options));
  impl& s = *state;
  http_server_options o{s.options.host, s.options.port, s.options.body_bytes_max, s.options.num_threads};
  auto server = http_server::start(std::move(o), [&s](const http_request& req, const std::shared_ptr<http_response>& res) {
    s.handle(req, res);
  });
  if (!server) return tl::unexpected(server.error());
  s.server = std::move(*server);
  return std::unique_ptr<http_gateway>(new http_gateway(std::move(state)));
}

http_gateway::http_gateway(std::unique_ptr<impl> state) : impl_(std::move(state)) {}

void http_gateway::serve(actors::balancer_client_actor load_balancer, actors::engine_list engines) {
  TROUPE_ASSERT_MSG(load_balancer, "the HTTP gateway serves the load balancer's node");
  std::lock_guard<std::mutex> lock(impl_->serving_mutex);
  TROUPE_ASSERT_MSG(impl_->state == openai::serving_state::starting, "serve() is called once, before drain()");
  impl_->load_balancer = std::move(load_balancer);
  impl_->engines = std::move(engines);
  impl_->state = openai::serving_state::ready;
}

bool http_gateway::drain(std::chrono::milliseconds bound) {
  std::unique_lock<std::mutex> lock(impl_->serving_mutex);
  impl_->state = openai::serving_state::draining;
  spdlog::info("http: draining: {} request(s) in flight", impl_->in_flight.size());
  if (impl_->idle.wait_for(lock, bound, [this] { return impl_->in_flight.empty(); })) return true;
  spdlog::warn("http: {} request(s) still in flight after {} ms: cancelling them", impl_->in_flight.size(), bound.count());
  for (const auto& [number, client] : impl_->in_flight)
    if (client) caf::anon_send(client, msg::cancel_request{});
  return false;
}

http_gateway::~http_gateway() { impl_->server.reset(); }

uint16_t http_gateway::port() const { return impl_->server->port(); }

}  // namespace troupe::gateway
