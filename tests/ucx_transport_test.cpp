// ucx_transport over loopback: payload sizes, receive-before/after-send, dead peers, a second
// process, and bad input. Timeouts here only guard against hangs; nothing asserts on speed.

#include "actors/edge/ucx_transport.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace {

using troupe::transport::ucx_options;
using troupe::transport::ucx_transport;
using bytes_t = std::vector<uint8_t>;

constexpr auto hang_guard = std::chrono::seconds(8);
constexpr size_t mib = size_t{1} << 20;

/// Deterministic bytes that differ by position and by `seed`, so a swapped or shifted
/// payload cannot compare equal.
bytes_t pattern(size_t num_bytes, uint64_t seed) {
  bytes_t bytes(num_bytes);
  for (size_t i = 0; i < num_bytes; ++i) {
    bytes[i] = static_cast<uint8_t>((i * 131 + (i >> 11) + seed * 97) & 0xff);
  }
  return bytes;
}

std::unique_ptr<ucx_transport> make_transport() {
  auto created = ucx_transport::create(ucx_options{});
  EXPECT_TRUE(created.has_value()) << (created ? "" : created.error().message);
  return created ? std::move(*created) : nullptr;
}

std::future<troupe::expected<void>> send_async(ucx_transport& from, uint16_t port, uint64_t tag,
                                               bytes_t bytes) {
  auto done = std::make_shared<std::promise<troupe::expected<void>>>();
  auto result = done->get_future();
  from.send("127.0.0.1", port, tag, std::move(bytes),
            [done](troupe::expected<void> r) { done->set_value(std::move(r)); });
  return result;
}

std::future<troupe::expected<bytes_t>> receive_async(ucx_transport& at, uint64_t tag) {
  auto done = std::make_shared<std::promise<troupe::expected<bytes_t>>>();
  auto result = done->get_future();
  at.receive(tag, [done](troupe::expected<bytes_t> r) { done->set_value(std::move(r)); });
  return result;
}

/// The future's value, or a failed expected if it hangs past the guard.
template <class T>
T await(std::future<T>& future) {
  if (future.wait_for(hang_guard) != std::future_status::ready) {
    return troupe::fail(troupe::errc::internal, "hang guard: no callback within 8 s");
  }
  return future.get();
}

/// A loopback port that nobody listens on (bound, then released).
uint16_t unused_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  socklen_t length = sizeof(address);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  ::close(fd);
  return ntohs(address.sin_port);
}

TEST(UcxTransport, CreatePicksAPort) {
  auto transport = make_transport();
  ASSERT_NE(transport, nullptr);
  EXPECT_NE(transport->port(), 0);
}

TEST(UcxTransport, PayloadsOfEverySizeArriveByteExact) {
  auto sender = make_transport();
  auto receiver = make_transport();
  ASSERT_TRUE(sender && receiver);
  const std::vector<size_t> sizes = {0, 1, 1 * mib, 16 * mib};
  std::vector<std::future<troupe::expected<void>>> sends;
  for (size_t i = 0; i < sizes.size(); ++i) {
    sends.push_back(send_async(*sender, receiver->port(), 100 + i, pattern(sizes[i], i)));
  }
  // Receive in reverse order: each receive must pick its own tag, not the next message.
  for (size_t k = sizes.size(); k-- > 0;) {
    auto received = receive_async(*receiver, 100 + k);
    auto bytes = await(received);
    ASSERT_TRUE(bytes.has_value()) << bytes.error().message;
    EXPECT_EQ(bytes->size(), sizes[k]);
    EXPECT_TRUE(*bytes == pattern(sizes[k], k)) << "payload of " << sizes[k] << " B differs";
  }
  for (auto& send : sends) {
    auto sent = await(send);
    EXPECT_TRUE(sent.has_value()) << sent.error().message;
  }
}

TEST(UcxTransport, ReceivePostedBeforeTheSend) {
  auto sender = make_transport();
  auto receiver = make_transport();
  ASSERT_TRUE(sender && receiver);
  for (size_t num_bytes : {size_t{1000}, 4 * mib}) {
    auto received = receive_async(*receiver, 7);
    EXPECT_NE(received.wait_for(std::chrono::milliseconds(50)), std::future_status::ready);
    auto sent = send_async(*sender, receiver->port(), 7, pattern(num_bytes, 7));
    auto bytes = await(received);
    ASSERT_TRUE(bytes.has_value()) << bytes.error().message;
    EXPECT_TRUE(*bytes == pattern(num_bytes, 7));
    EXPECT_TRUE(await(sent).has_value());
  }
}

TEST(UcxTransport, ReceivePostedAfterTheSendCompleted) {
  auto sender = make_transport();
  auto receiver = make_transport();
  ASSERT_TRUE(sender && receiver);
  // Eager size: the send completes before anyone receives, so UCX must buffer the message.
  auto sent = send_async(*sender, receiver->port(), 9, pattern(1000, 9));
  auto send_result = await(sent);
  ASSERT_TRUE(send_result.has_value()) << send_result.error().message;
  // Make sure the message has reached the receiver before receiving it: a second message on the
  // same endpoint is delivered after it (UCX keeps one endpoint's tagged messages in order), so
  // once that one is received, tag 9's is there, unexpected, waiting in UCX's buffers.
  auto marker_sent = send_async(*sender, receiver->port(), 99, pattern(10, 99));
  auto marker = receive_async(*receiver, 99);
  ASSERT_TRUE(await(marker).has_value());
  ASSERT_TRUE(await(marker_sent).has_value());
  auto received = receive_async(*receiver, 9);
  auto bytes = await(received);
  ASSERT_TRUE(bytes.has_value()) << bytes.error().message;
  EXPECT_TRUE(*bytes == pattern(1000, 9));
  // Rendezvous size: the send stays in flight until the late receive fetches the data.
  auto big_sent = send_async(*sender, receiver->port(), 10, pattern(8 * mib, 10));
  EXPECT_NE(big_sent.wait_for(std::chrono::milliseconds(50)), std::future_status::ready);
  auto big_received = receive_async(*receiver, 10);
  auto big = await(big_received);
  ASSERT_TRUE(big.has_value()) << big.error().message;
  EXPECT_TRUE(*big == pattern(8 * mib, 10));
  EXPECT_TRUE(await(big_sent).has_value());
}

TEST(UcxTransport, ReceivesOfOneTagAreServedInPostingOrder) {
  auto sender = make_transport();
  auto receiver = make_transport();
  ASSERT_TRUE(sender && receiver);
  auto first = receive_async(*receiver, 3);
  auto second = receive_async(*receiver, 3);
  auto sent_a = send_async(*sender, receiver->port(), 3, bytes_t{'a'});
  ASSERT_TRUE(await(sent_a).has_value());
  auto sent_b = send_async(*sender, receiver->port(), 3, bytes_t{'b', 'b'});
  ASSERT_TRUE(await(sent_b).has_value());
  auto a = await(first);
  auto b = await(second);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(*a, bytes_t{'a'});
  EXPECT_EQ(*b, (bytes_t{'b', 'b'}));
}

TEST(UcxTransport, SendToADeadPortFailsNamingTheAddress) {
  auto sender = make_transport();
  ASSERT_TRUE(sender);
  const uint16_t port = unused_port();
  auto sent = send_async(*sender, port, 1, pattern(100, 1));
  auto result = await(sent);
  ASSERT_FALSE(result.has_value());
  EXPECT_EQ(result.error().code, troupe::errc::io_error) << result.error().message;
  EXPECT_NE(result.error().message.find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << result.error().message;
  // The failed endpoint is dropped, so the transport still works for a live peer.
  auto receiver = make_transport();
  ASSERT_TRUE(receiver);
  auto received = receive_async(*receiver, 2);
  auto sent_again = send_async(*sender, receiver->port(), 2, pattern(10, 2));
  EXPECT_TRUE(await(sent_again).has_value());
  auto bytes = await(received);
  ASSERT_TRUE(bytes.has_value()) << bytes.error().message;
  EXPECT_EQ(*bytes, pattern(10, 2));
}

// Issue 47: the receive buffer was sized from the sender's announced length (any length was
// allocated). Now a message over max_message_bytes is refused, nothing allocated for it, and the
// transport serves on.
TEST(UcxTransport, AMessageOverTheBoundIsRefusedAndTheNextArrives) {
  ucx_options bounded;
  bounded.max_message_bytes = 1 * mib;
  auto created = ucx_transport::create(bounded);
  ASSERT_TRUE(created.has_value()) << created.error().message;
  auto receiver = std::move(*created);
  auto sender = make_transport();
  ASSERT_TRUE(sender);
  auto big = receive_async(*receiver, 5);
  auto sent_big = send_async(*sender, receiver->port(), 5, pattern(2 * mib, 5));
  auto refused = await(big);
  ASSERT_FALSE(refused.has_value()) << "received " << refused->size() << " bytes";
  EXPECT_EQ(refused.error().code, troupe::errc::invalid_argument);
  EXPECT_EQ(refused.error().message, "UCX: receive of tag 5 refused: the message of 2097152 bytes exceeds the largest "
                                     "this node takes, 1048576 ([limits] max_message_mib)");
  (void)await(sent_big);  // the sender may or may not learn of it
  auto at_bound = receive_async(*receiver, 6);
  auto sent = send_async(*sender, receiver->port(), 6, pattern(1 * mib, 6));
  auto bytes = await(at_bound);
  ASSERT_TRUE(bytes.has_value()) << bytes.error().message;
  EXPECT_TRUE(*bytes == pattern(1 * mib, 6));
  EXPECT_TRUE(await(sent).has_value());
}

// Issue 47: the listener accepted any peer. With allowed_peers it takes only those hosts.
TEST(UcxTransport, AListenerWithAllowedPeersRejectsOtherHosts) {
  ucx_options elsewhere_only;
  elsewhere_only.allowed_peers = {"10.255.255.1"};  // the sender below connects from 127.0.0.1
  auto created = ucx_transport::create(elsewhere_only);
  ASSERT_TRUE(created.has_value()) << created.error().message;
  auto guarded = std::move(*created);
  ucx_options loopback_only;
  loopback_only.allowed_peers = {"127.0.0.1"};
  auto open = ucx_transport::create(loopback_only);
  ASSERT_TRUE(open.has_value()) << open.error().message;
  auto sender = make_transport();
  ASSERT_TRUE(sender);
  auto never = receive_async(*guarded, 3);
  auto send_rejected = send_async(*sender, guarded->port(), 3, pattern(100, 3));
  EXPECT_FALSE(await(send_rejected).has_value()) << "the send to a listener that rejects its host succeeded";
  EXPECT_NE(never.wait_for(std::chrono::milliseconds(200)), std::future_status::ready);
  auto received = receive_async(**open, 4);
  auto sent = send_async(*sender, (*open)->port(), 4, pattern(100, 4));
  EXPECT_TRUE(await(sent).has_value());
  auto bytes = await(received);
  ASSERT_TRUE(bytes.has_value()) << bytes.error().message;
  EXPECT_EQ(*bytes, pattern(100, 4));
  guarded.reset();  // cancels the pending receive before its future goes
}

TEST(UcxTransport, DestructionCancelsAPendingReceiveExactlyOnce) {
  auto receiver = make_transport();
  ASSERT_TRUE(receiver);
  std::atomic<int> num_calls{0};
  troupe::errc code = troupe::errc::internal;
  receiver->receive(5, [&](troupe::expected<bytes_t> r) {
    ++num_calls;
    code = r ? troupe::errc::internal : r.error().code;
  });
  receiver.reset();
  EXPECT_EQ(num_calls.load(), 1);
  EXPECT_EQ(code, troupe::errc::cancelled);
}

TEST(UcxTransport, CreateOnAPortInUseFailsNamingTheAddress) {
  auto first = make_transport();
  ASSERT_TRUE(first);
  ucx_options options;
  options.port = first->port();
  auto second = ucx_transport::create(options);
  ASSERT_FALSE(second.has_value());
  EXPECT_NE(second.error().message.find("127.0.0.1:" + std::to_string(first->port())),
            std::string::npos)
      << second.error().message;
}

TEST(UcxTransport, CreateRejectsBadInput) {
  ucx_options empty_host;
  empty_host.address = "";
  auto created = ucx_transport::create(empty_host);
  ASSERT_FALSE(created.has_value());
  EXPECT_EQ(created.error().code, troupe::errc::invalid_argument);
  ucx_options bad_host;
  bad_host.address = "no.such.host.invalid";
  created = ucx_transport::create(bad_host);
  ASSERT_FALSE(created.has_value());
  EXPECT_NE(created.error().message.find("no.such.host.invalid"), std::string::npos);
}

// ---- two processes ---------------------------------------------------------------------------

constexpr uint64_t cross_process_tag = 42;
constexpr size_t cross_process_bytes = 4 * mib;

/// The child's whole life: listen, tell the parent the port, check one payload. Exit codes:
/// 0 ok, 2 create failed, 3 pipe failed, 4 receive failed, 5 bytes differ.
int run_receiver_child(int port_fd) {
  auto created = ucx_transport::create(ucx_options{});
  if (!created) return 2;
  auto receiver = std::move(*created);
  uint16_t port = receiver->port();
  if (::write(port_fd, &port, sizeof(port)) != static_cast<ssize_t>(sizeof(port))) return 3;
  ::close(port_fd);
  auto received = receive_async(*receiver, cross_process_tag);
  auto bytes = await(received);
  if (!bytes) return 4;
  return *bytes == pattern(cross_process_bytes, cross_process_tag) ? 0 : 5;
}

bool read_with_guard(int fd, void* out, size_t num_bytes) {
  pollfd ready{fd, POLLIN, 0};
  if (::poll(&ready, 1, static_cast<int>(hang_guard.count() * 1000)) != 1) return false;
  return ::read(fd, out, num_bytes) == static_cast<ssize_t>(num_bytes);
}

int wait_for_child(pid_t child) {
  // Woken by the child's exit (a pidfd polled with the hang guard as its timeout), no polling.
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, child, 0));
  pollfd p{fd, POLLIN, 0};
  const bool ended = fd >= 0 && ::poll(&p, 1, static_cast<int>(std::chrono::milliseconds(hang_guard).count())) == 1;
  if (fd >= 0) ::close(fd);
  int status = 0;
  if (!ended) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    return -1;
  }
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -2;
}

TEST(UcxTransport, TwoProcessesMoveFourMiB) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    ::_exit(run_receiver_child(fds[1]));  // _exit: the child must not run gtest's teardown
  }
  ::close(fds[1]);
  uint16_t port = 0;
  bool got_port = read_with_guard(fds[0], &port, sizeof(port));
  ::close(fds[0]);
  if (got_port) {
    // Created after fork, so the child never inherits this process's UCX state.
    auto sender = make_transport();
    ASSERT_TRUE(sender);
    auto sent = send_async(*sender, port, cross_process_tag,
                           pattern(cross_process_bytes, cross_process_tag));
    auto result = await(sent);
    EXPECT_TRUE(result.has_value()) << result.error().message;
    EXPECT_EQ(wait_for_child(child), 0);
  } else {
    ADD_FAILURE() << "child did not report its port";
    EXPECT_EQ(wait_for_child(child), 0);
  }
}

}  // namespace
