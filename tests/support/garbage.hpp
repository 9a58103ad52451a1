#pragma once

// Random and adversarial messages for the fuzz tests (issue 21, point 3): any registered message
// type — and the atoms of the actors' interfaces — with field values a remote peer could send:
// extreme and negative integers, NaN and infinite floats, out-of-range enums, empty, long and
// nested vectors, invalid UTF-8, null and live actor handles. Seeded: the same messages on every
// run of a seed.

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <caf/all.hpp>

#include "actors/system/atoms.hpp"
#include "actors/system/cluster_messages.hpp"
#include "messages/control.hpp"
#include "messages/engine.hpp"
#include "messages/executor.hpp"
#include "messages/kv_payload.hpp"

namespace troupe::testing {

/// The handles a forged message may carry (each list may hold null handles).
struct handle_pool {
  std::vector<actors::engine_actor> engines;
  std::vector<actors::balancer_actor> balancers;
  std::vector<actors::request_actor> requests;
  std::vector<actors::stream_receiver_actor> receivers;
  std::vector<actors::executor_actor> executors;
};

/// The shape of the served model, so some forged KV payloads decode and reach an engine's checks.
struct model_shape {
  int32_t num_layers = 0;
  int32_t kv_dim = 0;
};

class garbage {
 public:
  /// Message kinds: the 26 types of actors/system/type_ids.cpp in registration order, then 7 atoms.
  static constexpr int num_types = 26;
  static constexpr int num_kinds = num_types + 7;

  /// `finite_only`: no infinite floats, for a peer that sends over CAF 0.17.6's serializer,
  /// which loops forever on one (detail::pack754): the sender would stall, not the server.
  garbage(uint64_t seed, handle_pool pool, model_shape shape, bool finite_only = false)
      : rng_(seed), pool_(std::move(pool)), shape_(shape), finite_only_(finite_only) {}

  handle_pool& pool() { return pool_; }
  uint64_t draw() { return rng_(); }
  size_t below(size_t n) { return static_cast<size_t>(rng_() % n); }

  /// A message of kind `kind` in [0, num_kinds).
  caf::message make(int kind) {
    switch (kind) {
      case 0: return caf::make_message(completion_request());
      case 1: return caf::make_message(msg::completion_chunk{i64(), u64(), i32(), str(), vec([&] { return token(); }),
                                                            vec([&] { return f32(); }), vec([&] { return top(); }), str(),
                                                            vec([&] { return serve::tool_call{str(), str()}; })});
      case 2: return caf::make_message(completion_end());
      case 3: return caf::make_message(msg::completion_error{i64(), u64(), enum_of<errc>(), str(), i32()});
      case 4: return caf::make_message(msg::cancel_request{i64()});
      case 5: return caf::make_message(msg::submit{request()});
      case 6: return caf::make_message(msg::rejected{i64(), enum_of<errc>(), str()});
      case 7: return caf::make_message(sampled());
      case 8: return caf::make_message(sampled_batch());
      case 9: return caf::make_message(msg::release{i64()});
      case 10: return caf::make_message(engine_report());
      case 11: return caf::make_message(msg::submit_completion{completion_request(), pick(pool_.receivers), u64()});
      case 12: return caf::make_message(msg::place_request{i64(), i32(), i32(), {}});
      case 13: return caf::make_message(msg::placement{pick(pool_.engines), pick(pool_.engines), str(), str(), str(),
                                                       port(), str()});
      case 14: return caf::make_message(msg::submit_prefill{request(), pick(pool_.engines), str(), port()});
      case 15: return caf::make_message(msg::prefilled{i64()});
      case 16: return caf::make_message(kv_handoff());
      case 17: return caf::make_message(msg::kv_arrived{u64(), bytes(), str()});
      case 18: return caf::make_message(msg::report_to{pick(pool_.balancers), i32(), i32()});
      case 19: return caf::make_message(msg::load_report{i32(), i64(), i64(), i64(), i64()});
      case 20: return caf::make_message(msg::engine_lost{pick(pool_.engines), str()});
      case 21: return caf::make_message(exec_plan());
      case 22: return caf::make_message(exec_result());
      case 23: return caf::make_message(pick(pool_.requests));
      case 24: return caf::make_message(pick(pool_.executors));
      case 25: return caf::make_message(actors::engine_list{pick(pool_.engines), pick(pool_.engines)});
      case 26: return caf::make_message(actors::stats_atom::value);
      case 27: return caf::make_message(actors::executor_atom::value);
      case 28: return caf::make_message(actors::ping_atom::value);
      case 29: return caf::make_message(actors::engines_atom::value);
      case 30: return caf::make_message(actors::report_atom::value);
      case 31: return caf::make_message(actors::heartbeat_atom::value);
      default: return caf::make_message(actors::timeout_atom::value, i64());
    }
  }

 private:
  bool coin() { return (rng_() & 1) != 0; }

  template <class T>
  T pick(const std::vector<T>& v) {
    return v.empty() || below(4) == 0 ? T{} : v[below(v.size())];
  }

  int32_t i32() {
    switch (below(8)) {
      case 0: return 0;
      case 1: return 1;
      case 2: return -1;
      case 3: return std::numeric_limits<int32_t>::min();
      case 4: return std::numeric_limits<int32_t>::max();
      case 5: return static_cast<int32_t>(below(600));
      case 6: return static_cast<int32_t>(below(20));
      default: return static_cast<int32_t>(rng_());
    }
  }
  int64_t i64() {
    switch (below(4)) {
      case 0: return std::numeric_limits<int64_t>::min();
      case 1: return std::numeric_limits<int64_t>::max();
      case 2: return static_cast<int64_t>(rng_());
      default: return i32();
    }
  }
  uint64_t u64() { return coin() ? rng_() : below(4); }
  uint16_t port() { return static_cast<uint16_t>(coin() ? 0 : rng_()); }
  int32_t token() { return below(3) == 0 ? i32() : static_cast<int32_t>(below(512)); }
  float f32() {
    switch (below(9)) {
      case 0: return 0.0f;
      case 1: return -0.0f;
      case 2: return 1.0f;
      case 3: return -1.0f;
      case 4: return std::numeric_limits<float>::quiet_NaN();
      case 5: return finite_only_ ? 3e38f : std::numeric_limits<float>::infinity();
      case 6: return finite_only_ ? -3e38f : -std::numeric_limits<float>::infinity();
      case 7: return 3e38f;
      default: return static_cast<float>(below(2001)) / 1000.0f - 1.0f;
    }
  }
  template <class E>
  E enum_of() {
    return static_cast<E>(static_cast<uint8_t>(coin() ? below(12) : rng_()));
  }

  /// A vector length: mostly short, sometimes empty, now and then thousands (`nested`: short only,
  /// so vectors of vectors stay small).
  size_t length(bool nested = false) {
    switch (below(8)) {
      case 0: return 0;
      case 1: return 1;
      case 6: return below(64);
      case 7: return nested ? below(16) : 2000 + below(2000);
      default: return below(8);
    }
  }
  template <class F>
  std::vector<std::invoke_result_t<F&>> vec(F&& f, bool nested = false) {
    std::vector<std::invoke_result_t<F&>> v(length(nested));
    for (auto& x : v) x = f();
    return v;
  }
  std::string str() {
    switch (below(5)) {
      case 0: return "";
      case 1: return "Once upon a time";
      case 2: return "\xff\xfe\xc0 not UTF-8";
      case 3: return std::string(length(), 'a');
      default: {
        std::string s(below(64), ' ');
        for (char& c : s) c = static_cast<char>(rng_());
        return s;
      }
    }
  }
  std::vector<uint8_t> bytes() {
    return vec([&] { return static_cast<uint8_t>(rng_()); });
  }

  sampling::sampling_params sampling() {
    return {f32(), f32(), i32(), f32(), i32(), f32(), f32(), f32(), logit_bias()};
  }
  std::vector<sampling::token_bias> logit_bias() {
    return vec([&] { return sampling::token_bias{token(), f32()}; }, true);
  }
  std::vector<sampling::token_logprob> top() {
    return vec([&] { return sampling::token_logprob{token(), f32()}; }, true);
  }

  msg::completion_request completion_request() {
    msg::completion_request r;
    r.prompt = str();
    if (coin()) r.prompt_tokens = vec([&] { return token(); });
    r.max_tokens = coin() ? static_cast<int32_t>(below(24)) : i32();
    r.temperature = f32();
    r.top_p = coin() ? 1.0f : f32();
    r.top_k = i32();
    r.min_p = coin() ? 0.0f : f32();
    r.presence_penalty = coin() ? 0.0f : f32();
    r.frequency_penalty = coin() ? 0.0f : f32();
    r.repetition_penalty = coin() ? 1.0f : f32();
    if (coin()) r.logit_bias = logit_bias();
    r.has_seed = coin();
    r.seed = u64();
    if (coin()) r.stop = vec([&] { return str(); }, true);
    if (coin()) r.stop_token_ids = vec([&] { return token(); });
    r.ignore_eos = coin();
    r.priority = i32();
    r.num_top_logprobs = coin() ? 0 : i32();
    r.stream = coin();
    return r;
  }

  /// Garbage in the report's first fields, drawn in their order (the rest stay 0).
  msg::engine_report engine_report() {
    msg::engine_report r;
    for (int64_t* field : {&r.num_steps, &r.num_generated_tokens, &r.num_preemptions, &r.num_executor_failures,
                           &r.num_waiting, &r.num_requests, &r.num_blocks_in_use, &r.executor_busy_ns, &r.elapsed_ns,
                           &r.num_timed_steps})
      *field = i64();
    r.step_time_error_raw = f32();
    r.step_time_error_corrected = f32();
    return r;
  }

  msg::completion_end completion_end() {
    return msg::completion_end{i64(), u64(), enum_of<engine::finish_reason>(), u64(), i32(), i32(), i64(), i64(),
                               i64(), vec([&] { return i64(); }), i32(), i32(), i32(), i32()};
  }

  engine::request request() {
    engine::request r;
    r.id = i64();
    r.prompt = vec([&] { return token(); });
    r.max_tokens = coin() ? static_cast<int32_t>(below(24)) : i32();
    r.sampling = coin() ? sampling::sampling_params{} : sampling();
    r.seed = u64();
    r.n = coin() ? 1 : i32();
    if (coin()) r.stop = vec([&] { return str(); }, true);
    if (coin()) r.stop_token_ids = vec([&] { return token(); });
    r.ignore_eos = coin();
    r.priority = i32();
    r.batch_tokens = coin();
    return r;
  }

  msg::sampled sampled() {
    return msg::sampled{i64(), coin() ? 0 : i32(), token(), f32(), top(), enum_of<engine::finish_reason>(),
                        i32(), i32(), i32(), i64()};
  }

  msg::sampled_batch sampled_batch() {
    msg::sampled_batch b;
    b.request_id = i64();
    b.tokens = vec([&] { return token(); });
    const bool same = coin();  // equal lengths, to get past the size check
    b.logprobs = same ? std::vector<float>(b.tokens.size(), -0.5f) : vec([&] { return f32(); });
    b.top_logprobs = same ? std::vector<std::vector<sampling::token_logprob>>(b.tokens.size())
                          : vec([&] { return top(); }, true);
    b.age_ns = same ? std::vector<int64_t>(b.tokens.size(), 1000) : vec([&] { return i64(); });
    b.finish = enum_of<engine::finish_reason>();
    b.num_cached_tokens = i32();
    b.num_preemptions = i32();
    b.num_recomputed_tokens = i32();
    b.scheduled_age_ns = same ? 0 : i64();
    return b;
  }

  engine::kv_data kv_data() {
    engine::kv_data kv;
    const bool fits = coin();  // of the model's shape, consistent
    kv.num_layers = fits ? shape_.num_layers : i32();
    kv.kv_dim = fits ? shape_.kv_dim : i32();
    kv.num_tokens = fits ? static_cast<int32_t>(below(8)) : i32();
    kv.dtype = fits ? kv::kv_dtype::f32 : static_cast<kv::kv_dtype>(rng_());  // any byte from a peer
    const size_t n = fits ? static_cast<size_t>(kv.num_layers) * kv.num_tokens * kv.kv_dim * sizeof(float) : length();
    kv.keys.assign(n, static_cast<uint8_t>(rng_()));
    kv.values.assign(fits ? n : length(), static_cast<uint8_t>(rng_()));
    return kv;
  }

  msg::kv_handoff kv_handoff() {
    msg::kv_handoff h{request(), pick(pool_.requests), {}, coin() ? 0 : u64()};
    if (coin()) {
      const engine::kv_data kv = kv_data();
      if (kv.consistent()) h.payload = msg::encode_kv_payload(coin() ? h.request.id : i64(), kv);
    }
    if (h.payload.empty()) h.payload = bytes();
    return h;
  }

  engine::exec_chunk exec_chunk() {
    engine::exec_chunk c;
    c.seq = coin() ? static_cast<int64_t>(below(8)) : i64();
    c.first_position = coin() ? static_cast<int32_t>(below(32)) : i32();
    c.tokens = vec([&] { return below(8) == 0 ? sched::previous_sample : token(); });
    c.first_block = coin() ? 0 : i32();
    c.block_table = vec([&] { return coin() ? static_cast<int32_t>(below(1100)) : i32(); });
    c.num_samples = coin() ? static_cast<int32_t>(below(3)) : i32();
    c.seed = u64();
    c.sampling = coin() ? sampling::sampling_params{} : sampling();
    c.num_prompt_tokens = coin() ? static_cast<int32_t>(below(32)) : i32();
    if (coin()) c.context_prefix = vec([&] { return token(); });
    c.export_kv = coin();
    return c;
  }

  engine::exec_plan exec_plan() {
    engine::exec_plan p;
    p.step = coin() ? static_cast<int64_t>(below(64)) : i64();
    p.imports = vec([&] { return engine::kv_import{vec([&] { return i32(); }, true), kv_data()}; }, true);
    p.copies = vec([&] { return kv::block_copy{i32(), i32()}; });
    p.chunks = vec([&] { return exec_chunk(); }, true);
    p.released = vec([&] { return i64(); });
    p.readouts = vec([&] {
      return engine::kv_readout{vec([&] { return coin() ? static_cast<int32_t>(below(1100)) : i32(); }),
                                coin() ? static_cast<int32_t>(below(64)) : i32()};
    });
    return p;
  }

  engine::exec_result exec_result() {
    engine::exec_result r;
    r.step = i64();
    r.samples = vec([&] { return vec([&] { return sampling::sample_result{token(), f32(), top()}; }, true); }, true);
    r.failures = vec([&] { return engine::exec_failure{i64(), str()}; }, true);
    r.exports = vec([&] { return engine::kv_export{i64(), kv_data()}; }, true);
    r.read_out = vec([&] { return kv_data(); }, true);
    r.measured_ns = i64();
    return r;
  }

  std::mt19937_64 rng_;
  handle_pool pool_;
  model_shape shape_;
  bool finite_only_;
};

/// Sends `m` to `dest` as a remote peer could: whatever its interface, from `sender` (null: none).
inline void send_raw(const caf::actor& dest, const caf::strong_actor_ptr& sender, caf::message m) {
  if (dest) dest->enqueue(sender, caf::make_message_id(), std::move(m), nullptr);
}

}  // namespace troupe::testing
