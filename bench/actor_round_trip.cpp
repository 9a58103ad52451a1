// bench_actor_round_trip: what one request/response between two actors costs on the actor
// system a node runs (actors::configure_real_time, the engine's configuration), event-based on
// both sides as the engine actor talks to its executor. Issue 52, point 5 asks for the block
// manager as an actor of its own: an engine whose step loop asked it something and waited would
// pay this once per step (compare bench_serve's one-client TPOT, a decode step through the
// actors), and an engine that leases blocks ahead pays it off the step's path.
//
//   bench_actor_round_trip [--round-trips N] [--runs R] [--ids K]
//
// Each run: N (default 20,000) round trips one after the other, each carrying K (default 16)
// block ids each way; prints the mean round trip per run and the median over R (default 9) runs.

#include <algorithm>
#include <chrono>
#include <memory>
#include <cstdio>
#include <future>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>

#include "actors/system/type_ids.hpp"
#include "bench/figures.hpp"

namespace troupe::bench {
namespace {

/// Sends `left` requests to `server` one after the other (each after the previous answer),
/// then sets `done`.
void ask_in_turn(caf::event_based_actor* self, const caf::actor& server, std::vector<int32_t> ids, int32_t left,
                 std::shared_ptr<std::promise<void>> done) {
  if (left == 0) {
    done->set_value();
    self->quit();
    return;
  }
  self->request(server, caf::infinite, ids).then([=](std::vector<int32_t>& back) {
    ask_in_turn(self, server, std::move(back), left - 1, done);
  });
}

int run(int argc, char** argv) {
  std::printf("$ %s\n", command_line(argc, argv).c_str());
  int32_t round_trips = 20000;
  int32_t runs = 9;
  int32_t ids = 16;
  parse_arguments(argc, argv, [&](const std::string& flag, const auto& next) {
    if (flag == "--round-trips") round_trips = std::max(1, std::stoi(next()));
    else if (flag == "--runs") runs = std::max(1, std::stoi(next()) | 1);  // odd: the median is a run
    else if (flag == "--ids") ids = std::max(0, std::stoi(next()));
    else return false;
    return true;
  });
  caf::actor_system_config cfg;
  actors::configure_real_time(cfg, 1);
  caf::actor_system sys{cfg};
  const caf::actor server = sys.spawn([]() -> caf::behavior {
    return {[](std::vector<int32_t>& block_ids) { return std::move(block_ids); }};
  });
  std::vector<double> per_trip_us;
  for (int32_t r = 0; r < runs; r++) {
    auto done = std::make_shared<std::promise<void>>();
    std::future<void> finished = done->get_future();
    const double start = now_seconds();
    sys.spawn([=](caf::event_based_actor* self) {
      ask_in_turn(self, server, std::vector<int32_t>(static_cast<size_t>(ids), 7), round_trips, done);
    });
    finished.wait();
    per_trip_us.push_back((now_seconds() - start) * 1e6 / round_trips);
    std::printf("run %d: %d round trips of %d block ids, %.2f us each\n", r + 1, round_trips, ids, per_trip_us.back());
  }
  const summary s = summarize(per_trip_us);
  std::printf("round trip: median %.2f us (min %.2f, max %.2f) over %d runs\n", s.median, s.min, s.max, runs);
  caf::anon_send_exit(server, caf::exit_reason::user_shutdown);
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
