#include "gateway/http_gateway.hpp"

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <variant>

#include <sys/socket.h>

#include <httplib.h>
#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/engine_actor.hpp"
#include "gateway/blocking_queue.hpp"
#include "gateway/index_html.hpp"  // generated from gateway/web/index.html
#include "openai/metrics.hpp"

namespace troupe::gateway {
namespace {

/// What a client actor reports to the HTTP thread serving its request.
using event = std::variant<msg::completion_chunk, expected<actors::completion>>;

/// The client actor's own bounds (first-token and between-token timeouts) guarantee that an
/// end is pushed eventually.
using event_queue = blocking_queue<event>;

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void reply_error(httplib::Response& res, const openai::api_error& e) {
  res.status = e.status;
  res.set_content(openai::render_error(e), "application/json");
}

/// One streamed request: its queue, what its chunks share, and whether its stream ended.
struct stream_state {
  std::shared_ptr<event_queue> events;
  openai::response_context context;
  actors::client_actor client;
  std::optional<event> pending;  ///< the first event, taken before the response began
  std::shared_ptr<const void> ticket;  ///< counts the request in flight until the stream is dropped
  bool first_chunk = true;
  bool finished = false;
};

}  // namespace

struct http_gateway::impl {
  impl(caf::actor_system& s, gateway_options o) : sys(s), options(std::move(o)) {}

  caf::actor_system& sys;
  gateway_options options;
  httplib::Server server;
  std::thread listener;
  uint16_t port = 0;
  int listen_fd = -1;  ///< the listening socket, once httplib made it
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
  /// until dropped (by the handler, or with a stream's state once its last byte is written).
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

  void handle_completion(openai::endpoint kind, const httplib::Request& req, httplib::Response& res);
  void answer_whole(event_queue& events, openai::response_context& context, httplib::Response& res);
  void answer_stream(std::shared_ptr<stream_state> s, httplib::Response& res);
  bool write_next(stream_state& s, httplib::DataSink& sink);
  bool write_end(stream_state& s, const expected<actors::completion>& outcome, httplib::DataSink& sink);
  void handle_metrics(httplib::Response& res);
  void route();
};

void http_gateway::impl::handle_completion(openai::endpoint kind, const httplib::Request& req, httplib::Response& res) {
  auto admitted = admit();
  if (!admitted) return reply_error(res, admitted.error());
  if (req.body.size() > options.body_bytes_max)
    return reply_error(res, {400, "the request body has " + std::to_string(req.body.size()) + " bytes; the limit is " +
                                      std::to_string(options.body_bytes_max), "invalid_request_error", "", ""});
  auto parsed = openai::parse_request(kind, req.body, options.model);
  if (!parsed) return reply_error(res, parsed.error());
  auto events = std::make_shared<event_queue>();
  actors::client_actor client = actors::spawn_client(
      sys, admitted->load_balancer, parsed->request, [events](const msg::completion_chunk& c) { events->push(c); },
      [events](const expected<actors::completion>& outcome) { events->push(outcome); }, options.timeouts);
  enroll(admitted->number, client);
  openai::response_context context{kind, 0, unix_seconds(), &options.model, parsed->include_usage};
  if (!parsed->request.stream) return answer_whole(*events, context, res);
  answer_stream(std::make_shared<stream_state>(stream_state{events, context, client, events->pop(), std::move(admitted->ticket)}), res);
}

void http_gateway::impl::answer_whole(event_queue& events, openai::response_context& context, httplib::Response& res) {
  for (;;) {
    event e = events.pop();
    const auto* outcome = std::get_if<expected<actors::completion>>(&e);
    if (!outcome) continue;  // the text is in the completion too
    if (!*outcome) return reply_error(res, openai::error_from(outcome->error()));
    record((*outcome)->end);
    context.request_id = (*outcome)->end.request_id;
    res.set_content(openai::render_response(context, (*outcome)->text, (*outcome)->end), "application/json");
    return;
  }
}

/// The status is decided by the first event: a request refused before its first chunk (a bad
/// parameter the engine found, a prompt too long, overload) gets its error status; once chunks
/// flow the status is 200 and a later failure ends the stream with an error event.
void http_gateway::impl::answer_stream(std::shared_ptr<stream_state> s, httplib::Response& res) {
  if (const auto* outcome = std::get_if<expected<actors::completion>>(&*s->pending); outcome && !*outcome)
    return reply_error(res, openai::error_from(outcome->error()));
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [this, s](size_t, httplib::DataSink& sink) { return write_next(*s, sink); },
      [s](bool) {
        if (s->finished) return;
        spdlog::info("http: the client of request {} went away: cancelling it", s->context.request_id);
        caf::anon_send(s->client, msg::cancel_request{s->context.request_id});
      });
}

bool http_gateway::impl::write_next(stream_state& s, httplib::DataSink& sink) {
  event e = s.pending ? std::move(*s.pending) : s.events->pop();
  s.pending.reset();
  if (const auto* outcome = std::get_if<expected<actors::completion>>(&e)) return write_end(s, *outcome, sink);
  const auto& chunk = std::get<msg::completion_chunk>(e);
  s.context.request_id = chunk.request_id;
  const std::string data = openai::sse_event(openai::render_chunk(s.context, chunk.text, s.first_chunk));
  s.first_chunk = false;
  return sink.write(data.data(), data.size());
}

bool http_gateway::impl::write_end(stream_state& s, const expected<actors::completion>& outcome, httplib::DataSink& sink) {
  std::string data;
  if (outcome) {
    record(outcome->end);
    s.context.request_id = outcome->end.request_id;
    data = openai::sse_event(openai::render_final_chunk(s.context, outcome->end));
    if (s.context.include_usage) data += openai::sse_event(openai::render_usage_chunk(s.context, outcome->end));
  } else {
    data = openai::sse_event(openai::render_error(openai::error_from(outcome.error())));
  }
  data += openai::sse_done;
  s.finished = true;
  if (!sink.write(data.data(), data.size())) return false;
  sink.done();
  return true;
}

void http_gateway::impl::handle_metrics(httplib::Response& res) {
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
  res.set_content(openai::render_metrics(metrics, gauges, options.model.id), "text/plain; version=0.0.4");
}

void http_gateway::impl::route() {
  using openai::endpoint;
  server.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_completion(endpoint::completions, req, res);
  });
  server.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_completion(endpoint::chat_completions, req, res);
  });
  server.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(openai::render_models(options.model), "application/json");
  });
  server.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(index_html.data(), index_html.size(), "text/html; charset=utf-8");
  });
  server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const openai::serving_state now = current_state();
    res.status = openai::health_status(now);
    res.set_content(openai::render_health(now), "application/json");
  });
  server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) { handle_metrics(res); });
  // httplib's own refusals (no such route, a body far over the limit) have no body: give them
  // an OpenAI error, a body over the limit as the 400 the API promises.
  server.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413)
      return reply_error(res, {400, "the request body is over the limit of " + std::to_string(options.body_bytes_max) +
                                        " bytes", "invalid_request_error", "", ""});
    reply_error(res, {res.status, "no route for " + req.method + " " + req.path, "not_found_error", "", ""});
  });
}

expected<std::unique_ptr<http_gateway>> http_gateway::start(caf::actor_system& sys, gateway_options options) {
  if (options.num_threads < 1) return fail(errc::invalid_argument, "the HTTP gateway needs at least one thread");
  auto state = std::make_unique<impl>(sys, std::move(options));
  impl& s = *state;
  const size_t num_threads = static_cast<size_t>(s.options.num_threads);
  s.server.new_task_queue = [num_threads] { return new httplib::ThreadPool(num_threads); };
  // httplib reads a body up to twice the limit, so one moderately over it gets a clean 400.
  s.server.set_payload_max_length(2 * s.options.body_bytes_max);
  s.route();
  // httplib's default options set SO_REUSEPORT, which lets a second server bind the same port
  // and silently share it: only SO_REUSEADDR here, and the socket is kept to raise the backlog.
  s.server.set_socket_options([&s](int fd) {
    const int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    s.listen_fd = fd;
  });
  const int bound = s.options.port == 0 ? s.server.bind_to_any_port(s.options.host)
                                        : (s.server.bind_to_port(s.options.host, s.options.port) ? s.options.port : -1);
  if (bound <= 0)
    return fail(errc::io_error, "cannot listen for HTTP on " + s.options.host + ":" + std::to_string(s.options.port));
  s.port = static_cast<uint16_t>(bound);
  // httplib listens with a backlog of 5: a burst of connections overflows it and waits out a SYN
  // retransmission (1 s). Listening again on the bound socket raises the backlog (Linux).
  if (::listen(s.listen_fd, SOMAXCONN) != 0)
    return fail(errc::io_error, "cannot listen for HTTP on " + s.options.host + ":" + std::to_string(bound));
  s.listener = std::thread([&s] { s.server.listen_after_bind(); });
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

http_gateway::~http_gateway() {
  impl_->server.stop();
  impl_->listener.join();
}

uint16_t http_gateway::port() const { return impl_->port; }

}  // namespace troupe::gateway
