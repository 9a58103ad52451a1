// KV-cache payload transfer between two processes: CAF remote messages in plaintext, CAF remote
// messages over mutual TLS, and ucx_transport.
//
// The process makes certificates with `troupe certs` (a node 'receiver', a client 'sender'),
// then forks a receiver child before either side starts any thread. For each payload size and
// path the sender moves one payload at a time and waits for the receiver's 8-byte ack (the byte
// count), so each sample is one round trip: payload out, ack back. Payloads are copied before
// the clock starts and moved into the message, so no path pays for that copy.
//
// The two CAF paths run side by side. Each process runs one actor system per path, configured as
// a troupe process is: actors::configure_network without credentials (plaintext) or with them
// (mutual TLS), and the same network_limits (max_message_bytes above the largest payload); the
// receiver publishes and the sender reaches with actors/system/connect.hpp. One system per path, not
// one system with two ports: CAF keeps one route per pair of actor systems, so a second
// connection between the same two systems carries nothing (strace: the messages to both
// handles took the plaintext connection, and "TLS" measured plaintext). The sender alternates
// the paths within each repetition (plaintext first on even ones, TLS first on odd ones), so
// both see the same machine; the TLS/plaintext ratio is the ratio of their medians.
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
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "actors/system/connect.hpp"
#include "actors/system/network_limits.hpp"
#include "actors/system/tls.hpp"
#include "bench/figures.hpp"
#include "bench/troupe_process.hpp"
#include "actors/edge/ucx_transport.hpp"

struct troupe_bench_payload {
  std::vector<uint8_t> bytes;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, troupe_bench_payload& x) {
  return f(caf::meta::type_name("troupe_bench_payload"), x.bytes);
}

namespace {

namespace fs = std::filesystem;
using troupe::actors::network_limits;
using troupe::actors::tls_credentials;
using troupe::transport::ucx_options;
using troupe::transport::ucx_transport;
using clock_type = std::chrono::steady_clock;

constexpr size_t mib = size_t{1} << 20;
constexpr int num_warmup = 2;                 // per size and path; not in the statistics
constexpr uint64_t ack_tag_bit = uint64_t{1} << 63;

/// The middleman (and the OpenSSL manager) is loaded by actors::configure_network.
struct bench_config : caf::actor_system_config {
  bench_config() { add_message_type<troupe_bench_payload>("troupe_bench_payload"); }
};

/// What the child tells the parent once it listens.
struct receiver_ports {
  uint16_t caf = 0;      ///< plaintext
  uint16_t caf_tls = 0;  ///< mutual TLS
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
  std::string ucx_tls = "tcp,shm,self";  ///< UCX_TLS: UCX's transports, not Transport Layer Security
  std::string troupe;                    ///< the binary that makes the certificates
};

/// The same in both processes and for both CAF paths: every payload fits in one CAF message
/// (the largest size plus 1 MiB for the message's framing; the default limit is 64 MiB).
network_limits limits_for(const options& opt) {
  network_limits limits;
  const int largest_mib = *std::max_element(opt.sizes_mib.begin(), opt.sizes_mib.end());
  limits.max_message_bytes = static_cast<uint32_t>((static_cast<size_t>(largest_mib) + 1) * mib);
  return limits;
}

/// One CAF path's actor system in one process: configure_network with `tls` (empty: plaintext)
/// and limits_for(opt).
class caf_node {
 public:
  caf_node(const options& opt, const tls_credentials& tls) {
    if (auto configured = troupe::actors::configure_network(cfg_, tls, limits_for(opt)); !configured)
      throw std::runtime_error(configured.error().message);
    sys_ = std::make_unique<caf::actor_system>(cfg_);
  }

  caf::actor_system& sys() { return *sys_; }

 private:
  bench_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
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

/// Answers each payload with its size.
caf::actor spawn_receiver(caf::actor_system& sys) {
  return sys.spawn([]() -> caf::behavior {
    return {[](troupe_bench_payload& p) -> int64_t { return static_cast<int64_t>(p.bytes.size()); }};
  });
}

int run_receiver(int to_parent, int from_parent, const options& opt, const tls_credentials& tls) try {
  caf_node plaintext{opt, {}};
  caf_node over_tls{opt, tls};
  const caf::actor receivers[2] = {spawn_receiver(plaintext.sys()), spawn_receiver(over_tls.sys())};
  auto caf_port = troupe::actors::publish_actor(plaintext.sys(), receivers[0], 0, "127.0.0.1");
  auto caf_tls_port = troupe::actors::publish_actor(over_tls.sys(), receivers[1], 0, "127.0.0.1");
  if (!caf_port || !caf_tls_port)
    throw std::runtime_error("CAF publish: " + (caf_port ? caf_tls_port : caf_port).error().message);
  ucx_options ucx_opts;
  ucx_opts.tls = opt.ucx_tls;
  auto ucx = ucx_transport::create(ucx_opts);
  if (!ucx) throw std::runtime_error(ucx.error().message);
  receiver_ports ports{*caf_port, *caf_tls_port, (*ucx)->port()};
  if (!write_all(to_parent, &ports, sizeof(ports))) return 3;
  ucx_plan plan;
  if (read_all(from_parent, &plan, sizeof(plan))) serve_ucx(**ucx, plan);
  char eof = 0;
  while (::read(from_parent, &eof, 1) > 0) {
  }  // the parent closes its end once it has every ack
  for (const caf::actor& receiver : receivers) caf::anon_send_exit(receiver, caf::exit_reason::user_shutdown);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "receiver: %s\n", e.what());
  return 2;
}

// ---- sender (parent process) -----------------------------------------------------------------

using samples = std::vector<double>;  // MB/s, one per repetition

double mb_per_s(size_t num_bytes, clock_type::duration round_trip) {
  return static_cast<double>(num_bytes) / std::chrono::duration<double>(round_trip).count() / 1e6;
}

/// One sample list per size and CAF path.
struct caf_samples {
  std::vector<samples> plaintext;
  std::vector<samples> tls;
};

/// Both CAF paths, each from its own actor system (the plaintext one without credentials, the
/// TLS one with the client certificate), alternating within each repetition.
caf_samples measure_caf(const receiver_ports& ports, const options& opt, const tls_credentials& tls) {
  caf_node nodes[2] = {{opt, {}}, {opt, tls}};
  const uint16_t remote_ports[2] = {ports.caf, ports.caf_tls};
  const char* names[2] = {"CAF", "CAF TLS"};
  caf::actor remotes[2];
  std::unique_ptr<caf::scoped_actor> selves[2];
  for (int path = 0; path < 2; ++path) {
    auto reached = troupe::actors::reach_any(nodes[path].sys(), "127.0.0.1", remote_ports[path], {});
    if (!reached) throw std::runtime_error(names[path] + (": cannot reach the receiver: " + reached.error().message));
    remotes[path] = caf::actor_cast<caf::actor>(std::move(reached->actor));
    selves[path] = std::make_unique<caf::scoped_actor>(nodes[path].sys());
  }
  caf_samples result;
  for (int size_mib : opt.sizes_mib) {
    const size_t num_bytes = static_cast<size_t>(size_mib) * mib;
    const auto payload = pattern(num_bytes);
    samples rates[2];
    for (int rep = 0; rep < num_warmup + opt.reps; ++rep) {
      for (int k = 0; k < 2; ++k) {
        const int path = (rep + k) % 2;
        caf::scoped_actor& self = *selves[path];
        troupe_bench_payload message{payload};
        auto start = clock_type::now();
        int64_t acked = -1;
        self->request(remotes[path], caf::infinite, std::move(message))
            .receive([&](int64_t n) { acked = n; },
                     [&](caf::error& e) {
                       throw std::runtime_error(names[path] + (": " + nodes[path].sys().render(e)));
                     });
        auto round_trip = clock_type::now() - start;
        if (acked != static_cast<int64_t>(num_bytes)) throw std::runtime_error(names[path] + std::string(": bad ack"));
        if (rep >= num_warmup) rates[path].push_back(mb_per_s(num_bytes, round_trip));
      }
    }
    result.plaintext.push_back(std::move(rates[0]));
    result.tls.push_back(std::move(rates[1]));
  }
  return result;
}

/// One sample list per size, through ucx_transport; tags 1, 2, ... in the plan's order.
std::vector<samples> measure_ucx(uint16_t port, int to_child, const options& opt) {
  ucx_options ucx_opts;
  ucx_opts.tls = opt.ucx_tls;
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

void print_row(int size_mib, const char* path, const samples& rates, double baseline_median) {
  using troupe::bench::percentile;
  const double median = percentile(rates, 50);
  std::printf("%-9d %-8s %5zu %10.0f %10.0f %10.0f", size_mib, path, rates.size(), percentile(rates, 10), median,
              percentile(rates, 90));
  if (baseline_median > 0)
    std::printf(" %10.2f\n", median / baseline_median);
  else
    std::printf(" %10s\n", "");
}

void print_table(const options& opt, const caf_samples& caf, const std::vector<samples>& ucx) {
  std::printf("\n%-9s %-8s %5s %10s %10s %10s %10s\n", "size_MiB", "path", "reps", "p10_MB/s", "median",
              "p90_MB/s", "x_CAF");
  for (size_t i = 0; i < opt.sizes_mib.size(); ++i) {
    const double caf_median = troupe::bench::percentile(caf.plaintext[i], 50);
    print_row(opt.sizes_mib[i], "CAF", caf.plaintext[i], 0);
    print_row(opt.sizes_mib[i], "CAF-TLS", caf.tls[i], caf_median);
    print_row(opt.sizes_mib[i], "UCX", ucx[i], caf_median);
  }
  std::printf("\nTLS/plaintext CAF, ratio of medians:");
  for (size_t i = 0; i < opt.sizes_mib.size(); ++i)
    std::printf(" %d MiB %.2f%s", opt.sizes_mib[i],
                troupe::bench::percentile(caf.tls[i], 50) / troupe::bench::percentile(caf.plaintext[i], 50),
                i + 1 < opt.sizes_mib.size() ? ";" : "\n");
}

int run_sender(int from_child, int to_child, pid_t child, const options& opt, const tls_credentials& tls) {
  receiver_ports ports;
  if (!read_all(from_child, &ports, sizeof(ports))) {
    std::fprintf(stderr, "receiver child did not start\n");
    ::waitpid(child, nullptr, 0);
    return 1;
  }
  caf_samples caf;
  std::vector<samples> ucx;
  try {
    caf = measure_caf(ports, opt, tls);
    ucx = measure_ucx(ports.ucx, to_child, opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
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
  opt.troupe = troupe::bench::default_troupe_binary(argv[0]);
  CLI::App app{"KV payload transfer between two processes: CAF middleman (plaintext and mutual TLS) vs UCX"};
  app.add_option("--sizes", opt.sizes_mib, "payload sizes in MiB")->check(CLI::Range(1, 1024));
  app.add_option("--reps", opt.reps, "measured repetitions per size and path")
      ->check(CLI::Range(1, 10000));
  app.add_option("--ucx-tls", opt.ucx_tls,
                 "UCX_TLS (UCX's transports) for both UCX contexts (\"\" = UCX_TLS env)");
  app.add_option("--troupe", opt.troupe, "the troupe binary (its `certs` command makes the TLS certificates)");
  CLI11_PARSE(app, argc, argv);

  std::printf("command: %s\n", troupe::bench::command_line(argc, argv).c_str());
  std::printf("units: size in MiB (2^20 B); throughput in MB/s (10^6 B/s) = size / round trip "
              "(payload + 8-byte ack), %d warm-up reps dropped; x_CAF = median / plaintext CAF median; "
              "CAF-TLS = CAF over mutual TLS (certificates from troupe certs); UCX_TLS=%s\n",
              num_warmup, opt.ucx_tls.c_str());
  std::fflush(stdout);

  // Certificates before the fork (posix_spawn starts no thread here): the child reads its own.
  const fs::path dir = fs::temp_directory_path() / ("troupe_bench_kv_transfer_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto certs = troupe::bench::make_certs(opt.troupe, dir, "receiver", "sender");
  if (!certs) {
    std::fprintf(stderr, "%s\n", certs.error().message.c_str());
    fs::remove_all(dir);
    return 1;
  }

  int to_parent[2];
  int to_child[2];
  if (::pipe(to_parent) != 0 || ::pipe(to_child) != 0) return 1;
  pid_t child = ::fork();  // before any thread exists on either side
  if (child < 0) return 1;
  if (child == 0) {
    ::close(to_parent[0]);
    ::close(to_child[1]);
    ::_exit(run_receiver(to_parent[1], to_child[0], opt, troupe::bench::credentials_of(*certs, "receiver")));
  }
  ::close(to_parent[1]);
  ::close(to_child[0]);
  const int rc = run_sender(to_parent[0], to_child[1], child, opt, troupe::bench::credentials_of(*certs, "sender"));
  fs::remove_all(dir);
  return rc;
}
