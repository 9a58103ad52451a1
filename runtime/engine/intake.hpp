#pragma once

/// The engine's intake: what becomes of work between its arrival at the engine actor and the
/// policy's call for it (engine_policy.hpp), decided without an actor system. Each call returns one
/// step (`intake_step`) the actor performs.
///
/// - Duplicates: a request that arrives twice from the same request actor is dropped
///   (`here_already`, asked before the arrival's KV is decoded). That
///   happens when a prefill engine is lost while its hand-off is on the way, and the request
///   actor places the request again on the same decode engine: the first copy serves it (a
///   rejection would end the request). Twice means the policy serves the id for that actor
///   already, or its grammar compiles here for it.
/// - Grammars: a request with a grammar waits here while it compiles (`compile`). It is refused
///   at once when the engine has no vocabulary or the spec does not fit the vocabulary, and
///   when its answer says it did not compile or the request's resumed tokens do not fit the
///   compiled grammar (check_resumed: a forged token never reaches the executor's step).
///   Otherwise it enters the policy with the compiled grammar. A release from its request actor
///   while it compiles forgets it: the compile's answer then finds it gone and is dropped.
/// - Counting: the policy counts a submit received when it gets one; a submit that never gets
///   there (refused or dropped here) says `count_received` (engine_policy::note_received). Other
///   work is counted when it arrives.
///
/// `Caller` names a request actor (the engine actor uses addresses); only `==` is used. Pure.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "runtime/engine/engine_policy.hpp"
#include "runtime/grammar/constraint.hpp"

namespace troupe::engine {

/// The policy's call that takes a request in.
enum class entry { submit, import, recompute };

/// A request on its way into the policy.
struct arrival {
  request req;
  entry how = entry::submit;
  request_id payload_id = 0;  ///< import: the request id inside the KV payload
  kv_data kv{};               ///< import: the decoded KV
  /// Whether the policy counted it received already (all but a submit).
  [[nodiscard]] bool counted() const { return how != entry::submit; }
};

/// Hand `a` to the policy (enter_policy).
struct enter {
  arrival a;
};

/// Refuse request `id` to its caller (before the policy saw it).
struct refuse {
  request_id id = 0;
  errc code = errc::internal;
  std::string message;
  bool count_received = false;
};

/// Compile `a.req.grammar` (the grammar actor), then answer `compiled` with `a`, or
/// `compile_failed` when no answer comes.
struct compile {
  arrival a;
};

/// Request `id` was released while its grammar compiled: nothing to do beyond counting it.
struct drop {
  request_id id = 0;
  bool count_received = false;
};

using intake_step = std::variant<enter, refuse, compile, drop>;

/// The policy's call for `a` (its `how`).
[[nodiscard]] effects enter_policy(engine_policy& policy, arrival a, int64_t now_ns);

/// Why `a`'s grammar cannot be compiled for an engine with `vocabulary` (null: none), if so.
[[nodiscard]] std::optional<refuse> grammar_refusal(const arrival& a, const grammar::vocabulary* vocabulary);

/// `a` with its compiled grammar `g` (null: it did not compile, `error` says why), checked.
[[nodiscard]] intake_step with_compiled(arrival a, std::shared_ptr<const grammar::compiled_grammar> g,
                                        const std::string& error,
                                        const std::shared_ptr<const grammar::vocabulary>& vocabulary);

template <class Caller>
class intake {
 public:
  /// `vocabulary`: the engine's, to apply grammars with (null: it applies none).
  explicit intake(std::shared_ptr<const grammar::vocabulary> vocabulary) : vocabulary_(std::move(vocabulary)) {}

  /// Whether request `id` from request actor `from` is here already (a duplicate, dropped);
  /// `served_for_from`: the policy serves `id` for `from`.
  [[nodiscard]] bool here_already(request_id id, const Caller& from, bool served_for_from) const {
    return served_for_from || compiles_for(id, from);
  }

  /// Work `a` from request actor `from` (not here_already).
  [[nodiscard]] intake_step arrive(arrival a, const Caller& from) {
    if (a.req.grammar.kind == grammar::grammar_kind::none) return enter{std::move(a)};
    if (auto no = grammar_refusal(a, vocabulary_.get())) return *std::move(no);
    compiling_.insert_or_assign(a.req.id, from);
    return compile{std::move(a)};
  }

  /// The answer to `compile` for `a` from `from`: `g` compiled (null: not, `error` says why).
  [[nodiscard]] intake_step compiled(arrival a, const Caller& from, std::shared_ptr<const grammar::compiled_grammar> g,
                                     const std::string& error) {
    if (!stop_compiling(a.req.id, from)) return drop{a.req.id, !a.counted()};
    return with_compiled(std::move(a), std::move(g), error, vocabulary_);
  }

  /// No answer to `compile` for request `id` from `from` (`why`); `counted`: arrival::counted.
  [[nodiscard]] intake_step compile_failed(request_id id, bool counted, const Caller& from, const std::string& why) {
    if (!stop_compiling(id, from)) return drop{id, !counted};
    return refuse{id, errc::internal, "compiling the grammar failed: " + why, !counted};
  }

  /// `from` released request `id`: if it still compiles for `from`, it is never admitted.
  void release(request_id id, const Caller& from) { stop_compiling(id, from); }

  /// No grammar compiles here.
  [[nodiscard]] bool empty() const { return compiling_.empty(); }

 private:
  [[nodiscard]] bool compiles_for(request_id id, const Caller& from) const {
    const auto it = compiling_.find(id);
    return it != compiling_.end() && it->second == from;
  }
  /// Forgets `id` if it compiles for `from` (true).
  bool stop_compiling(request_id id, const Caller& from) {
    if (!compiles_for(id, from)) return false;
    compiling_.erase(id);
    return true;
  }

  std::shared_ptr<const grammar::vocabulary> vocabulary_;
  std::map<request_id, Caller> compiling_;  // requests whose grammar compiles, by their request actor
};

}  // namespace troupe::engine
