// The wire format: every registered message type crosses CAF's binary serializer inside a
// caf::message (which needs its registered name) unchanged, with every field set to a value other
// than its default; a newly registered type without a round trip here fails the test. Enums from
// another process are representable out of range: the receivers' checks are tested too.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <caf/all.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "actors/cache_tier_actor.hpp"
#include "actors/system/cluster_messages.hpp"
#include "actors/system/protocols.hpp"
#include "actors/system/type_ids.hpp"
#include "tests/support/actor_config.hpp"
#include "tests/support/kv_blocks.hpp"
#include "messages/client.hpp"
#include "messages/control.hpp"
#include "messages/engine.hpp"
#include "messages/executor.hpp"
#include "messages/expert.hpp"

namespace troupe::testing {
namespace {

/// The printed form of each field a type's `inspect` visits, in order (nested structs whole).
struct field_printer {
  using result_type = void;
  static constexpr bool reads_state = true;
  static constexpr bool writes_state = false;
  std::vector<std::string> fields;

  template <class... Ts>
  void operator()(Ts&&... xs) {
    (record(xs), ...);
  }

  template <class T>
  void record(const T& x) {
    if constexpr (!caf::meta::is_annotation<T>::value) fields.push_back(caf::deep_to_string(x));
  }
};

/// Whether `inspect` visits T's fields (a struct, a handle); a container has no inspect of its own.
template <class T, class = void>
struct is_inspected : std::false_type {};
template <class T>
struct is_inspected<T, std::void_t<decltype(inspect(std::declval<field_printer&>(), std::declval<T&>()))>>
    : std::true_type {};

template <class T>
std::vector<std::string> fields_of(T x) {
  field_printer f;
  inspect(f, x);
  return f.fields;
}

/// Every field of `x` differs from the same field of a default T: a round trip that dropped
/// or swapped a field could otherwise pass unnoticed.
template <class T>
void expect_every_field_set(const T& x, const std::string& name) {
  const std::vector<std::string> got = fields_of(x);
  const std::vector<std::string> defaults = fields_of(T{});
  ASSERT_EQ(got.size(), defaults.size()) << name;
  for (size_t i = 0; i < got.size(); i++)
    EXPECT_NE(got[i], defaults[i]) << name << ": field " << i << " keeps its default " << defaults[i];
}

class Protocol : public ::testing::Test {
 protected:
  caf::actor_system_config cfg_;
  caf::actor_system sys_{configure(cfg_, /*deterministic=*/true)};
  caf::actor some_actor_ = sys_.spawn([] { return caf::behavior{[](int32_t) {}}; });
  caf::actor other_actor_ = sys_.spawn([] { return caf::behavior{[](int32_t) {}}; });
  std::set<std::string> tested_;  // registered names with a round trip below

  /// The test actors as the typed handles the messages carry (they never receive anything).
  template <class Handle>
  Handle some() const { return caf::actor_cast<Handle>(some_actor_); }
  template <class Handle>
  Handle other() const { return caf::actor_cast<Handle>(other_actor_); }

  /// Round-trips `x` through a caf::message and the binary serializer; expects every field
  /// set, the same printed value back and a byte-identical second serialization.
  template <class T>
  void expect_round_trip(const T& x) {
    const std::string name = cfg_.type_names_by_rtti.count(typeid(T)) ? cfg_.type_names_by_rtti.at(typeid(T)) : "";
    ASSERT_FALSE(name.empty()) << typeid(T).name() << " is not registered";
    tested_.insert(name);
    if constexpr (is_inspected<T>::value)
      expect_every_field_set(x, name);
    else
      EXPECT_NE(caf::deep_to_string(x), caf::deep_to_string(T{})) << name << " is its default";
    std::vector<char> buf;
    caf::binary_serializer sink{sys_, buf};
    if (auto err = sink(caf::make_message(x))) FAIL() << name << ": serializing: " << sys_.render(err);
    caf::message back;
    caf::binary_deserializer source{sys_, buf};
    if (auto err = source(back)) FAIL() << name << ": deserializing: " << sys_.render(err);
    ASSERT_TRUE(back.match_elements<T>()) << name;
    EXPECT_EQ(caf::deep_to_string(back.get_as<T>(0)), caf::deep_to_string(x)) << name;
    std::vector<char> again;
    caf::binary_serializer sink2{sys_, again};
    EXPECT_FALSE(sink2(back));
    EXPECT_EQ(buf, again) << name << ": a second serialization differs";
  }

  void TearDown() override {
    caf::anon_send_exit(some_actor_, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(other_actor_, caf::exit_reason::user_shutdown);
    dynamic_cast<caf::scheduler::test_coordinator&>(sys_.scheduler()).run();  // else ~actor_system waits
  }
};

sampling::sampling_params full_sampling() {
  return {0.7f, 0.5f, 3, 0.05f, 1, 0.25f, -0.5f, 1.5f, {{7, -100.0f}, {9, 2.5f}}};
}

msg::completion_request full_completion_request() {
  msg::completion_request r;
  r.prompt = "héllo";
  r.prompt_tokens = {1, 2};
  r.max_tokens = 33;
  r.temperature = 0.5f;
  r.top_p = 0.9f;
  r.top_k = 4;
  r.min_p = 0.25f;
  r.presence_penalty = 0.5f;
  r.frequency_penalty = -1.0f;
  r.repetition_penalty = 1.25f;
  r.logit_bias = {{5, -100.0f}};
  r.has_seed = true;
  r.seed = 77;
  r.stop = {"a", "b"};
  r.stop_token_ids = {2, 3};
  r.ignore_eos = true;
  r.priority = -2;
  r.cache_class = "agent";
  r.num_top_logprobs = 3;
  r.stream = false;
  r.messages = {{"assistant", "hi", R"({"tool_calls":[]})"}};
  r.grammar_kind = "regex";
  r.grammar = "[a-z]+";
  r.grammar_trigger_token_ids = {7};
  r.grammar_trigger_strings = {"<tool>"};
  r.chat_template_kwargs = R"({"enable_thinking":false})";
  r.tools = R"([{"type":"function","function":{"name":"f"}}])";
  r.add_generation_prompt = false;
  r.pooling = engine::pooling_mode::cls;
  return r;
}

engine::request full_engine_request() {
  engine::request r;
  r.id = 5;
  r.prompt = {1, 300, 301};
  r.max_tokens = 9;
  r.sampling = full_sampling();
  r.seed = 1234567890123ull;
  r.n = 3;
  r.stop = {"x"};
  r.stop_token_ids = {2};
  r.ignore_eos = true;
  r.priority = 4;
  r.batch_tokens = true;
  r.cache_class = kv::cache_class::agent;
  r.grammar = grammar::grammar_spec{grammar::grammar_kind::gbnf, "root ::= \"a\"", {9}, {"<call>"}};
  r.num_resumed_tokens = 1;
  r.cache_tier = 2;
  r.pooling = engine::pooling_mode::mean;
  return r;
}

/// Every field of the report set, each to its own value, by name.
msg::engine_report full_engine_report() {
  msg::engine_report r;
  r.num_steps = 1;
  r.num_generated_tokens = 2;
  r.num_preemptions = 3;
  r.num_executor_failures = 4;
  r.num_waiting = 5;
  r.num_requests = 6;
  r.num_blocks_in_use = 7;
  r.executor_busy_ns = 8;
  r.elapsed_ns = 9;
  r.num_timed_steps = 10;
  r.step_time_error_raw = 0.25;
  r.step_time_error_corrected = 0.125;
  r.num_prefix_hit_tokens = 13;
  r.num_host_hit_tokens = 14;
  r.num_demoted_blocks = 15;
  r.num_demoted_bytes = 16;
  r.num_promoted_blocks = 17;
  r.num_promoted_bytes = 18;
  r.host_tier_expired_blocks = 19;
  r.preempted_ns = 11;
  r.num_draft_slots = 21;
  r.num_draft_rows = 22;
  r.num_accepted_drafts = 23;
  r.num_handoffs_recomputed = 24;
  r.num_disk_hit_tokens = 25;
  r.num_swap_in_tokens = 26;
  r.disk_tier_expired_blocks = 27;
  r.moe_lb_last_window = 1.5;
  r.num_moe_windows = 28;
  r.num_expert_moves = 29;
  r.num_scheduled_tokens = 30;
  r.num_discarded_tokens = 31;
  r.num_recomputed_tokens = 32;
  r.num_speculative_rows = 33;
  r.num_swap_ins = 34;
  r.num_resumed_requests = 35;
  r.num_prefix_query_tokens = 36;
  r.num_steps_by_tokens[2] = 37;
  r.num_handoffs_timed = 38;
  r.handoff_ns = 39;
  r.handoff_bytes = 40;
  r.num_tier_fetches = 41;
  r.num_tier_fetches_declined = 42;
  return r;
}

// f16 rows: 2 bytes each (0.5, 1.5 and their negatives).
engine::kv_data full_kv() { return {2, 1, 1, {0x00, 0x38, 0x00, 0x3e}, {0x00, 0xb8, 0x00, 0xbe}, kv::kv_dtype::f16}; }

kv::kv_block full_kv_block() {
  kv::kv_block b = block_of(token_range(4, 1), 0, 4);
  b.dtype = kv::kv_dtype::f16;  // its bytes read as half as many values (a test of the fields only)
  return b;
}

engine::exec_chunk full_chunk() {
  engine::exec_chunk c;
  c.seq = 3;
  c.first_position = 10;
  c.tokens = {engine::previous_sample};
  c.first_block = 1;
  c.block_table = {0, 5};
  c.num_samples = 2;
  c.seed = 11;
  c.sampling = full_sampling();
  c.num_prompt_tokens = 8;
  c.context_prefix = {1, 300};
  c.export_kv = true;
  c.speculative = true;
  c.num_draft_slots = 4;
  c.grammar = 2;
  c.pooling = engine::pooling_mode::last;
  return c;
}

msg::sampled full_sampled() {
  return {1, 2, 42, -0.5f, {{3, -1.0f}}, engine::finish_reason::length, 4, 5, 6, 7};
}

msg::sampled_batch full_sampled_batch() {
  return {1, {4, 5}, {-0.5f, -0.25f}, {{{3, -1.0f}}, {}}, {20, 10}, engine::finish_reason::stop, 4, 5, 6, 7, {0.6f, -0.8f}};
}

msg::completion_end full_end() {
  msg::completion_end e;
  e.request_id = 3;
  e.stream = 14;
  e.finish_reason = engine::finish_reason::cancelled;
  e.seed = 9;
  e.num_prompt_tokens = 4;
  e.num_generated_tokens = 5;
  e.queue_ns = 6;
  e.ttft_ns = 7;
  e.e2e_ns = 8;
  e.itl_ns = {1, 2};
  e.num_cached_tokens = 10;
  e.num_preemptions = 11;
  e.num_recomputed_tokens = 12;
  e.num_chunks = 13;
  e.num_failovers = 2;
  e.embedding = {0.6f, 0.0f, -0.8f};
  return e;
}

TEST_F(Protocol, EveryRegisteredTypeSurvivesARoundTripWithEveryFieldSet) {
  expect_round_trip(full_completion_request());
  expect_round_trip(msg::completion_chunk{3, 11, 2, "hi", {7, 8}, {-1.5f, -2.5f}, {{{7, -1.5f}}, {{8, -2.5f}, {9, -3.0f}}},
                                             "hm", {{"f", R"({"a":1})"}}});
  expect_round_trip(full_end());
  expect_round_trip(msg::completion_error{3, 11, errc::too_long, "m", 2});
  expect_round_trip(msg::cancel_request{12});
  expect_round_trip(msg::submit{full_engine_request()});
  expect_round_trip(msg::rejected{1, errc::overloaded, "full"});
  expect_round_trip(full_sampled());
  expect_round_trip(full_sampled_batch());
  expect_round_trip(msg::release{8});
  expect_round_trip(full_engine_report());
  expect_round_trip(msg::submit_completion{full_completion_request(), some<actors::stream_receiver_actor>(), 11});
  expect_round_trip(msg::place_request{1, 2, 3, {4, 5}, some<actors::engine_actor>(), true});
  expect_round_trip(msg::placement{some<actors::engine_actor>(), other<actors::engine_actor>(), "p", "d", "host", 4, "err", 1});
  expect_round_trip(msg::submit_prefill{full_engine_request(), some<actors::engine_actor>(), "host", 4});
  expect_round_trip(msg::prefilled{6});
  expect_round_trip(msg::kv_handoff{full_engine_request(), some<actors::request_actor>(), {1, 2, 3}, 7, 8});
  expect_round_trip(msg::kv_arrived{7, {1, 2}, "lost"});
  expect_round_trip(msg::report_to{some<actors::balancer_actor>(), 2, 30, true,
                                   {some<actors::cache_tier_actor>(), other<actors::cache_tier_actor>()}});
  expect_round_trip(msg::tier_report_to{some<actors::balancer_actor>(), 2, 30, {"node-a", "node-b"}});
  expect_round_trip(msg::load_report{1, 2, 3, 4, 5, true, 7, true, {8, 9}, {10}});
  expect_round_trip(msg::engine_lost{some<actors::engine_actor>(), "silent"});
  expect_round_trip(msg::forwarded{3, "drained", {1, 2, 3}});
  engine::exec_plan plan{4, {{{0, 1}, full_kv()}}, {{1, 2}}, {full_chunk()}, {1}, {3}, {{{5, 6}, 20}}, {1.5, 2.5}};
  expect_round_trip(plan);
  expect_round_trip(
      engine::exec_result{4, {{{9, -0.25f, {{9, -0.25f}}}}}, {{3, "nan"}}, {{3, full_kv()}}, {full_kv()}, {full_kv()}, {{0.6f, -0.8f}}, 6, {1, 2}, {0, 1}, 12345, 1.25, 3});
  expect_round_trip(msg::tier_lookup{{1, 2, 3, 4}});
  expect_round_trip(msg::tier_put{full_kv_block(), kv::cache_class::agent});
  expect_round_trip(msg::tier_get{0x1234});
  expect_round_trip(msg::tier_got{true, full_kv_block()});
  expect_round_trip(msg::tier_fetch{{1, 2, 3, 4}, 1, 2, 5'000'000});
  expect_round_trip(msg::tier_blocks{{full_kv_block(), full_kv_block()}, {0, 1}});
  expect_round_trip(msg::tier_report{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  expect_round_trip(msg::tier_events{1, 2, true, {3, 4}, {5}, true});
  expect_round_trip(msg::disk_put{full_kv_block(), kv::cache_class::agent});
  expect_round_trip(msg::disk_stored{true, 3});
  expect_round_trip(msg::disk_fetch{{0x1234, 0x5678}, 5'000'000});
  expect_round_trip(msg::disk_blocks{{full_kv_block(), full_kv_block()}});
  expect_round_trip(msg::disk_report{1, 2, 3, 4, 5});
  expect_round_trip(moe::expert_request{2, 3, {1, 4}, {0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f}, {{1, {4}}, {3, {1, 4}}}});
  expect_round_trip(moe::expert_reply{{0.25f, -0.5f}});
  expect_round_trip(msg::fetch_experts{{{1, 2}, {3, 0}}});
  expect_round_trip(msg::expert_set{{moe::expert_weights{1, 2, {0.5f}, {1.5f}, {2.5f}}}});
  expect_round_trip(msg::drop_experts{{{1, 2}}});
  expect_round_trip(some<actors::request_actor>());
  expect_round_trip(some<actors::executor_actor>());
  expect_round_trip(actors::engine_list{some<actors::engine_actor>(), other<actors::engine_actor>()});
  expect_round_trip(actors::expert_shard_list{some<actors::expert_shard_actor>(), other<actors::expert_shard_actor>()});
  expect_round_trip(some<actors::cache_tier_actor>());

  std::set<std::string> registered;
  // CAF adds its own types and std::vector<T> of each registered T: troupe's are "troupe::*".
  for (const auto& [rtti, name] : cfg_.type_names_by_rtti)
    if (name.rfind("troupe::", 0) == 0) registered.insert(name);
  EXPECT_EQ(registered.size(), 48u) << "actors/system/type_ids.cpp registers 48 types";
  EXPECT_EQ(tested_, registered) << "a registered message type has no round trip here (or one is gone)";
}

TEST_F(Protocol, NestedStructsHaveEveryFieldSetToo) {
  // expect_round_trip checks top-level fields; a nested struct counts as one field there.
  expect_every_field_set(full_engine_request(), "engine::request");
  expect_every_field_set(full_chunk(), "engine::exec_chunk");
  expect_every_field_set(full_kv(), "engine::kv_data");
  expect_every_field_set(engine::kv_import{{0, 1}, full_kv()}, "engine::kv_import");
  expect_every_field_set(engine::kv_export{3, full_kv()}, "engine::kv_export");
  expect_every_field_set(engine::exec_failure{3, "nan"}, "engine::exec_failure");
  expect_every_field_set(sampling::sample_result{9, -0.25f, {{9, -0.25f}}}, "sampling::sample_result");
  expect_every_field_set(sampling::token_logprob{9, -0.25f}, "sampling::token_logprob");
  expect_every_field_set(full_sampling(), "sampling::sampling_params");
  expect_every_field_set(sampling::token_bias{7, -100.0f}, "sampling::token_bias");
  expect_every_field_set(kv::block_copy{1, 2}, "kv::block_copy");
  expect_every_field_set(full_kv_block(), "kv::kv_block");
  expect_every_field_set(moe::expert_batch{3, {1, 4}}, "moe::expert_batch");
  expect_every_field_set(moe::expert_id{1, 2}, "moe::expert_id");
  expect_every_field_set(moe::expert_weights{1, 2, {0.5f}, {1.5f}, {2.5f}}, "moe::expert_weights");
}

TEST_F(Protocol, TheCheckerNoticesAFieldLeftAtItsDefault) {
  // A check that cannot fail is a defect.
  msg::release unset;
  EXPECT_EQ(fields_of(unset), fields_of(msg::release{}));
  EXPECT_NE(fields_of(msg::release{1}), fields_of(msg::release{}));
}

TEST(ProtocolEnums, OutOfRangeValuesFromAnotherProcessAreRecognised) {
  EXPECT_TRUE(is_valid(errc::internal));
  EXPECT_TRUE(is_valid(errc::invalid_argument));
  EXPECT_FALSE(is_valid(static_cast<errc>(static_cast<uint8_t>(errc::internal) + 1)));
  EXPECT_FALSE(is_valid(static_cast<errc>(255)));
  EXPECT_TRUE(is_valid(engine::finish_reason::cancelled));
  EXPECT_FALSE(is_valid(static_cast<engine::finish_reason>(static_cast<uint8_t>(engine::finish_reason::cancelled) + 1)));
  EXPECT_STREQ(to_string(engine::finish_reason::cancelled), "cancelled");
  EXPECT_STREQ(to_string(errc::overloaded), "overloaded");
}

TEST(ProtocolEnums, AnEnumTravelsAsItsUnderlyingIntegerAndAnOutOfRangeOneDeserializes) {
  // The value is kept as sent: the receiving handler decides (tests in actors_test.cpp).
  caf::actor_system_config cfg;
  caf::actor_system sys{configure(cfg, /*deterministic=*/true)};
  msg::rejected bad{1, static_cast<errc>(200), "from a newer peer"};
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  ASSERT_FALSE(sink(bad));
  msg::rejected back;
  caf::binary_deserializer source{sys, buf};
  ASSERT_FALSE(source(back));
  EXPECT_EQ(static_cast<int>(back.code), 200);
  EXPECT_FALSE(is_valid(back.code));
}

}  // namespace
}  // namespace troupe::testing
