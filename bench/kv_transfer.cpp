// KV-cache payload transfer between two processes: CAF remote messages vs ucx_transport.
//
// The process forks a receiver child before either side starts any thread. For each payload
// size and path the sender moves one payload at a time and waits for the receiver's 8-byte ack
// (the byte count), so each sample is one round trip: payload out, ack back. Payloads are
// copied before the clock starts and moved into the message, so no path pays for that copy.
//
// Units: sizes in MiB (2^20 bytes); throughput in MB/s (10^6 bytes/s) = size / round trip.

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "bench/figures.hpp"
#include "transport/ucx_transport.hpp"

struct troupe_bench_payload {
  std::vector<uint8_t> bytes;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, troupe_bench_payload& x) {
  return f(caf::meta::type_name("troupe_bench_payload"), x.bytes);
}

namespace {

using troupe::transport::ucx_options;
using troupe::transport::ucx_transport;
using clock_type = std::chrono::steady_clock;

constexpr size_t mib = size_t{1} << 20;
constexpr int num_warmup = 2;                 // per size and path; not in the statistics
constexpr uint64_t ack_tag_bit = uint64_t{1} << 63;

struct bench_config : caf::actor_system_config {
  bench_config() {
    add_message_type<troupe_bench_payload>("troupe_bench_payload");
    load<caf::io::middleman>();
  }
};

/// What the child tells the parent once it listens.
struct receiver_ports {
  uint16_t caf = 0;
  uint16_t ucx = 0;
};

/// What the parent tells the child before the UCX phase.
struct ucx_plan {
  uint16_t sender_port = 0;
  uint32_t num_messages = 0;
};

struct options {
  std::vector<int> sizes_mib = {1, 4, 16};
  int reps = 15;
  std::string tls = "tcp,shm,self";
};

bool write_all(int fd, const void* data, size_t num_bytes) {
  return ::write(fd, data, num_bytes) == static_cast<ssize_t>(num_bytes);
}

bool read_all(int fd, void* data, size_t num_bytes) {
  return ::read(fd, data, num_bytes) == static_cast<ssize_t>(num_bytes);
}

std::vector<uint8_t> pattern(size_t num_bytes) {
  std::vector<uint8_t> bytes(num_bytes);
  for (size_t i = 0; i < num_bytes; ++i) bytes[i] = static_cast<uint8_t>((i * 131 + 7) & 0xff);
  return bytes;
}

std::vector<uint8_t> encode_count(uint64_t n) {
  std::vector<uint8_t> bytes(sizeof(n));
  std::memcpy(bytes.data(), &n, sizeof(n));
  return bytes;
}

// ---- receiver (child process) ----------------------------------------------------------------

/// Acks every UCX payload from the progress thread, so the ack leaves as soon as UCX delivers.
void serve_ucx(ucx_transport& ucx, const ucx_plan& plan) {
  std::mutex mutex;
  std::condition_variable all_acked;
  uint32_t num_acked = 0;
  for (uint32_t i = 1; i <= plan.num_messages; ++i) {
    ucx.receive(i, [&, i](troupe::expected<std::vector<uint8_t>> bytes) {
      uint64_t count = bytes ? bytes->size() : ~uint64_t{0};
      ucx.send("127.0.0.1", plan.sender_port, ack_tag_bit | i, encode_count(count),
               [&](troupe::expected<void>) {
                 std::lock_guard<std::mutex> lock(mutex);
                 ++num_acked;
                 all_acked.notify_one();
               });
    });
  }
  std::unique_lock<std::mutex> lock(mutex);
  all_acked.wait(lock, [&] { return num_acked == plan.num_messages; });
}

int run_receiver(int to_parent, int from_parent, const std::string& tls) {
  bench_config cfg;
  caf::actor_system sys{cfg};
  auto receiver = sys.spawn([]() -> caf::behavior {
    return {[](troupe_bench_payload& p) -> int64_t { return static_cast<int64_t>(p.bytes.size()); }};
  });
  auto caf_port = sys.middleman().publish(receiver, 0, "127.0.0.1");
  ucx_options ucx_opts;
  ucx_opts.tls = tls;
  auto ucx = ucx_transport::create(ucx_opts);
  if (!caf_port || !ucx) {
    std::fprintf(stderr, "receiver: %s\n", ucx ? "CAF publish failed" : ucx.error().message.c_str());
    return 2;
  }
  receiver_ports ports{*caf_port, (*ucx)->port()};
  if (!write_all(to_parent, &ports, sizeof(ports))) return 3;
  ucx_plan plan;
  if (read_all(from_parent, &plan, sizeof(plan))) serve_ucx(**ucx, plan);
  char eof = 0;
  while (::read(from_parent, &eof, 1) > 0) {
  }  // the parent closes its end once it has every ack
  caf::anon_send_exit(receiver, caf::exit_reason::user_shutdown);
  return 0;
}

// ---- sender (parent process) -----------------------------------------------------------------

using samples = std::vector<double>;  // MB/s, one per repetition

double mb_per_s(size_t num_bytes, clock_type::duration round_trip) {
  return static_cast<double>(num_bytes) / std::chrono::duration<double>(round_trip).count() / 1e6;
}

/// One sample list per size, through CAF's middleman.
std::vector<samples> measure_caf(uint16_t port, const options& opt) {
  bench_config cfg;
  caf::actor_system sys{cfg};
  auto remote = sys.middleman().remote_actor("127.0.0.1", port);
  if (!remote) throw std::runtime_error("CAF: remote_actor failed: " + sys.render(remote.error()));
  caf::scoped_actor self{sys};
  std::vector<samples> result;
  for (int size_mib : opt.sizes_mib) {
    const size_t num_bytes = static_cast<size_t>(size_mib) * mib;
    const auto payload = pattern(num_bytes);
    samples rates;
    for (int rep = 0; rep < num_warmup + opt.reps; ++rep) {
      troupe_bench_payload message{payload};
      auto start = clock_type::now();
      int64_t acked = -1;
      self->request(*remote, caf::infinite, std::move(message))
          .receive([&](int64_t n) { acked = n; },
                   [&](caf::error& e) { throw std::runtime_error("CAF: " + sys.render(e)); });
      auto round_trip = clock_type::now() - start;
      if (acked != static_cast<int64_t>(num_bytes)) throw std::runtime_error("CAF: bad ack");
      if (rep >= num_warmup) rates.push_back(mb_per_s(num_bytes, round_trip));
    }
    result.push_back(std::move(rates));
  }
  return result;
}

/// One sample list per size, through ucx_transport; tags 1, 2, ... in the plan's order.
std::vector<samples> measure_ucx(uint16_t port, int to_child, const options& opt) {
  ucx_options ucx_opts;
  ucx_opts.tls = opt.tls;
  auto ucx = ucx_transport::create(ucx_opts);
  if (!ucx) throw std::runtime_error(ucx.error().message);
  ucx_plan plan{(*ucx)->port(),
                static_cast<uint32_t>(opt.sizes_mib.size() * (num_warmup + opt.reps))};
  if (!write_all(to_child, &plan, sizeof(plan))) throw std::runtime_error("pipe to child");
  std::vector<samples> result;
  uint64_t tag = 0;
  for (int size_mib : opt.sizes_mib) {
    const size_t num_bytes = static_cast<size_t>(size_mib) * mib;
    const auto payload = pattern(num_bytes);
    samples rates;
    for (int rep = 0; rep < num_warmup + opt.reps; ++rep) {
      std::vector<uint8_t> message = payload;
      ++tag;
      std::promise<troupe::expected<std::vector<uint8_t>>> ack;
      auto ack_arrived = ack.get_future();
      auto start = clock_type::now();
      (*ucx)->receive(ack_tag_bit | tag, [&](auto bytes) { ack.set_value(std::move(bytes)); });
      (*ucx)->send("127.0.0.1", port, tag, std::move(message), [](troupe::expected<void> sent) {
        if (!sent) std::fprintf(stderr, "UCX send: %s\n", sent.error().message.c_str());
      });
      auto bytes = ack_arrived.get();
      auto round_trip = clock_type::now() - start;
      if (!bytes || *bytes != encode_count(num_bytes)) throw std::runtime_error("UCX: bad ack");
      if (rep >= num_warmup) rates.push_back(mb_per_s(num_bytes, round_trip));
    }
    result.push_back(std::move(rates));
  }
  return result;
}

void print_table(const options& opt, const std::vector<samples>& caf,
                 const std::vector<samples>& ucx) {
  std::printf("\n%-9s %-5s %5s %10s %10s %10s %10s\n", "size_MiB", "path", "reps", "p10_MB/s",
              "median", "p90_MB/s", "UCX/CAF");
  for (size_t i = 0; i < opt.sizes_mib.size(); ++i) {
    double caf_median = troupe::bench::percentile(caf[i], 50);
    double ucx_median = troupe::bench::percentile(ucx[i], 50);
    std::printf("%-9d %-5s %5zu %10.0f %10.0f %10.0f %10s\n", opt.sizes_mib[i], "CAF",
                caf[i].size(), troupe::bench::percentile(caf[i], 10), caf_median, troupe::bench::percentile(caf[i], 90), "");
    std::printf("%-9d %-5s %5zu %10.0f %10.0f %10.0f %10.2f\n", opt.sizes_mib[i], "UCX",
                ucx[i].size(), troupe::bench::percentile(ucx[i], 10), ucx_median, troupe::bench::percentile(ucx[i], 90),
                ucx_median / caf_median);
  }
}

int run_sender(int from_child, int to_child, pid_t child, const options& opt) {
  receiver_ports ports;
  if (!read_all(from_child, &ports, sizeof(ports))) {
    std::fprintf(stderr, "receiver child did not start\n");
    return 1;
  }
  std::vector<samples> caf;
  std::vector<samples> ucx;
  try {
    caf = measure_caf(ports.caf, opt);
    ucx = measure_ucx(ports.ucx, to_child, opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    ::kill(child, SIGKILL);
    return 1;
  }
  ::close(to_child);
  int status = 0;
  ::waitpid(child, &status, 0);
  print_table(opt, caf, ucx);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "receiver child failed (status %d)\n", status);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options opt;
  CLI::App app{"KV payload transfer between two processes: CAF middleman vs UCX"};
  app.add_option("--sizes", opt.sizes_mib, "payload sizes in MiB")->check(CLI::Range(1, 1024));
  app.add_option("--reps", opt.reps, "measured repetitions per size and path")
      ->check(CLI::Range(1, 10000));
  app.add_option("--tls", opt.tls, "UCX_TLS for both UCX contexts (\"\" = UCX_TLS env)");
  CLI11_PARSE(app, argc, argv);

  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  std::printf("command: %s\n", command.c_str());
  std::printf("units: size in MiB (2^20 B); throughput in MB/s (10^6 B/s) = size / round trip "
              "(payload + 8-byte ack), %d warm-up reps dropped; UCX_TLS=%s\n",
              num_warmup, opt.tls.c_str());
  std::fflush(stdout);

  int to_parent[2];
  int to_child[2];
  if (::pipe(to_parent) != 0 || ::pipe(to_child) != 0) return 1;
  pid_t child = ::fork();  // before any thread exists on either side
  if (child < 0) return 1;
  if (child == 0) {
    ::close(to_parent[0]);
    ::close(to_child[1]);
    ::_exit(run_receiver(to_parent[1], to_child[0], opt.tls));
  }
  ::close(to_parent[1]);
  ::close(to_child[0]);
  return run_sender(to_parent[0], to_child[1], child, opt);
}
