#pragma once

/// The engine's policy without an actor system: one replica's live requests over an
/// engine_core, driven by calls that each return the list of effects the engine actor performs
/// (actors/engine_actor.cpp is a dispatcher over this policy: STYLE.md, "An actor is a dispatcher
/// over a pure host").
///
/// What it decides:
/// - admission: at most `max_waiting` queued requests, beyond that `reject{overloaded}`; a
///   request the core refuses is rejected with the core's error;
/// - planning: at most `max_steps_in_flight` plans at the executor (`send_plan`, tagged with the
///   executor generation; a reply of an older generation is ignored);
/// - tokens: one `send_token` per sampled token, or, for a request with `batch_tokens`, one
///   `send_batch` when it ends with every token's age (sampled-to-sent time);
/// - hand-off (prefill engine): a finished prefill becomes one `hand_off` carrying the request,
///   its KV and the decode engine (and a UCX tag when the KV travels over UCX);
/// - load reports: `report_load` at most once per interval and only after a change; a change
///   inside the interval arms one timer (`arm_report_timer`), an idle engine arms none; when
///   report_to asks for cache events, each also carries the pool's cached chain hashes (a
///   numbered change or a snapshot, report_load) for the balancer's prefix directory;
/// - host tier (config.host_tier): a request whose prompt the pool holds less of than the hit
///   rule allows waits outside the core while the tier is asked for the blocks that follow
///   (`fetch_blocks`); its answer (`tier_answered`) queues the request with the blocks, which
///   enter the pool when its admission is tried (engine_core::stage_promotion). The engine
///   keeps stepping the others meanwhile. Blocks a step read out of the pool for the
///   tier go to it as `demote_blocks`;
/// - executor failure: the core is rebuilt, `restart_executor` asks for a new executor, and
///   every unfinished n = 1 request resumes on the new core by recompute from its prompt plus
///   the tokens it has sent (engine_core::resumable_requests: its stream continues with the
///   undisturbed run's tokens); a request with n > 1, a prefill-only run, or one that has
///   already survived `executor_failure_resumes_max` failures is rejected with `internal`;
/// - drain (the node shuts down): `drain` marks the load reports `draining` (the balancer sends
///   no new work) while live requests run on; `forward_all`, when the grace period ends, drops
///   every request still here with a `forward` to its request actor, which places it again
///   elsewhere, and forwards any later work at once. A one-sample request that has KV computed
///   leaves with it (engine_core::export_request: its `forward` goes out when the step that reads
///   the KV out completes, or without the KV if the executor fails first); the others are
///   recomputed from their prompt plus the tokens their client has.
///
/// Identity: a request is named by its id; effects for it go to its request actor, which the
/// actor learns from `watch_caller` (the caller of the admitting call is that request's actor)
/// and forgets when that actor is DOWN. A rejection before admission goes to the caller
/// (`reject::to_caller`). Decode engines are `peer_id`s the actor chooses.
///
/// Pure: no CAF, no clock (every call takes `now_ns`), no threads.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "runtime/engine/engine_core.hpp"
#include "runtime/engine/engine_report.hpp"

namespace troupe::engine {

/// Executor failures a request survives by resuming; the next one fails it (a request that
/// crashes the executor must not crash it forever).
inline constexpr int32_t executor_failure_resumes_max = 2;

/// A decode engine, as numbered by the caller of engine_policy.
using peer_id = uint32_t;

/// Send `plan` to the executor, with the compiled grammars its chunks name; its result comes
/// back with `generation`.
struct send_plan {
  exec_plan plan;
  int64_t generation = 0;
  grammar::grammar_table grammars;
};

/// Send one token to the request actor of `event.request`.
struct send_token {
  sample_event event;
  int64_t scheduled_at_ns = 0;  ///< the engine's clock when the request was first planned
};

/// Every token of a `batch_tokens` request, sent when it ends (msg::sampled_batch).
struct token_batch {
  request_id request = 0;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<sampling::token_logprob>> top_logprobs;
  std::vector<int64_t> age_ns;  ///< how long before sending each token was sampled
  finish_reason finish = finish_reason::none;
  int32_t num_cached_tokens = 0;
  int32_t num_preemptions = 0;
  int32_t num_recomputed_tokens = 0;
  int64_t scheduled_age_ns = 0;  ///< how long before sending the request was first planned
  /// An embedding request's end (request::pooling): its vector, and no tokens.
  std::vector<float> embedding;
};

struct send_batch {
  token_batch batch;
};

/// Tell a request it is refused or failed: to the caller (before admission) or to its actor.
struct reject {
  request_id id = 0;
  errc code = errc::internal;
  std::string message;
  bool to_caller = false;
};

/// The caller of this call is the request actor of `id` (watch it; send its effects there).
struct watch_caller {
  request_id id = 0;
};

/// Prefill done: tell the request actor (`prefilled`), then ship the request and its KV to
/// `decode` (over UCX when `ucx_tag` != 0, to `kv_address:kv_port`).
struct hand_off {
  prefilled_request prefilled;
  peer_id decode = 0;
  std::string kv_address;
  uint16_t kv_port = 0;
  uint64_t ucx_tag = 0;
};

/// A load report for the balancer (msg::load_report). With cache events (report_to), it also
/// tells the pool's cached chain hashes: report `cache_seq` (1, 2, ... counted over the policy's
/// life) is a snapshot (`cached_added` holds every hash the pool holds) or the change since
/// report cache_seq - 1. A snapshot goes out first, after report_to asks again (a balancer that
/// lost track), after an executor failure (a new, empty pool) and when the pool's event log
/// overflowed.
struct report_load {
  int32_t engine_index = 0;
  int64_t num_received = 0;
  int64_t num_requests = 0;
  int64_t num_kv_tokens = 0;
  int64_t num_queued_prefill_tokens = 0;
  bool draining = false;
  uint64_t cache_seq = 0;  ///< 0: no cache events in this report
  bool cache_snapshot = false;
  std::vector<uint64_t> cached_added{};    ///< ascending
  std::vector<uint64_t> cached_removed{};  ///< ascending; empty in a snapshot
};

/// The engine drained: request `id` is dropped here and must be placed again (msg::forwarded
/// to its request actor; `to_caller`: the caller of this call is that actor), with the KV of its
/// first kv->num_tokens positions when it has one (its next engine then computes none of them).
struct forward {
  request_id id = 0;
  bool to_caller = false;
  std::optional<kv_data> kv;
};

/// Call `report_timer` after `delay_ns`.
struct arm_report_timer {
  int64_t delay_ns = 0;
};

/// The executor failed: replace it (its KV is gone; the policy is empty again).
struct restart_executor {};

/// Host tier: ask it for the blocks of `tokens` from block `first_block` on (at most
/// `num_blocks_max`, msg::tier_fetch, with `budget_ns`), and call `tier_answered(id, ...)` with
/// what comes back — nothing if it does not answer in time: msg::fetch_wait_ns(budget_ns), or
/// without a budget engine_config::tier_fetch_timeout_ns (default_tier_fetch_timeout_ns if 0).
struct fetch_blocks {
  request_id id = 0;
  std::vector<int32_t> tokens;
  int32_t first_block = 0;
  int32_t num_blocks_max = 0;
  int32_t cache_tier = -1;  ///< which tier (request::cache_tier): -1 = the engine's own node's
  int64_t budget_ns = 0;    ///< fetch_plan::budget_ns
};

/// Host tier: store these blocks (msg::tier_put each), without waiting for its answers.
struct demote_blocks {
  std::vector<demoted_block> blocks;
};

using effect = std::variant<send_plan, send_token, send_batch, reject, watch_caller, hand_off, report_load,
                            arm_report_timer, restart_executor, fetch_blocks, demote_blocks, forward>;
using effects = std::vector<effect>;

bool operator==(const send_plan& a, const send_plan& b);
bool operator==(const send_token& a, const send_token& b);
bool operator==(const token_batch& a, const token_batch& b);
bool operator==(const send_batch& a, const send_batch& b);
bool operator==(const reject& a, const reject& b);
bool operator==(const watch_caller& a, const watch_caller& b);
bool operator==(const hand_off& a, const hand_off& b);
bool operator==(const report_load& a, const report_load& b);
bool operator==(const forward& a, const forward& b);
bool operator==(const arm_report_timer& a, const arm_report_timer& b);
bool operator==(const restart_executor& a, const restart_executor& b);
bool operator==(const fetch_blocks& a, const fetch_blocks& b);
bool operator==(const demote_blocks& a, const demote_blocks& b);

struct engine_policy_options {
  model::model_config model;
  /// The vocabulary's end-of-generation ids (tokenizer::end_ids()); llama2.c's BOS and EOS.
  std::vector<int32_t> end_ids{1, 2};
  engine_config config;
  int32_t max_waiting = 1024;  ///< queued requests at most; beyond: reject{overloaded}
  /// Run the core's per-step invariant check (engine_core::check_step) after every Nth
  /// completed step; 0 = never.
  int32_t check_invariants_every = 0;
  bool kv_over_ucx = false;    ///< hand-offs get UCX tags ucx_tag_base, ucx_tag_base + 1, ...
  uint64_t ucx_tag_base = 0;
};

/// An MoE executor's expert placement (exec_result::moe_lb, num_expert_moves), over the
/// engine's life: executor restarts do not reset it.
struct expert_placement_stats {
  int64_t num_windows = 0;        ///< windows of steps measured
  double moe_lb_last_window = 0;  ///< the latest window's moe_lb; 0 before the first
  int64_t num_moves = 0;          ///< placements switched to
};


class engine_policy {
 public:
  /// Fails if the core cannot be created from the options.
  [[nodiscard]] static expected<std::unique_ptr<engine_policy>> create(engine_policy_options options, int64_t now_ns);

  /// A request to run whole (msg::submit).
  [[nodiscard]] effects submit(request r, int64_t now_ns);
  /// A request to prefill and hand off to `decode` (empty: refused, invalid_argument).
  [[nodiscard]] effects submit_prefill(request r, std::optional<peer_id> decode, std::string kv_address,
                                       uint16_t kv_port, int64_t now_ns);
  /// Work arrived that is not submitted by this call (a hand-off whose KV may still be on the
  /// way, work naming no request actor): counted as received all the same.
  void note_received() { num_received_++; }
  /// A hand-off's KV of `bytes` arrived intact `ns` after it was sent (engine_report's
  /// num_handoffs_timed, handoff_ns, handoff_bytes); a negative time (clocks that disagree) is
  /// not counted.
  void note_handoff_time(int64_t bytes, int64_t ns) {
    if (ns < 0) return;
    num_handoffs_timed_++;
    handoff_ns_ += ns;
    handoff_bytes_ += bytes;
  }
  /// A handed-off request with its decoded KV payload (`payload_id`: the id inside the payload).
  [[nodiscard]] effects import(request r, request_id payload_id, kv_data kv, int64_t now_ns);
  /// A handed-off request whose KV did not arrive intact (counted received already): computed
  /// here from its prompt, as a submitted one is.
  [[nodiscard]] effects recompute_handoff(request r, int64_t now_ns);
  /// The executor's answer to a plan of `generation` (an older generation's is ignored).
  [[nodiscard]] effects on_step_result(int64_t generation, exec_result result, int64_t now_ns);
  /// The request actor ends the request early; it may have ended already.
  [[nodiscard]] effects release(request_id id, int64_t now_ns);
  /// The request actor of `id` is gone: its request is dropped if it is live.
  [[nodiscard]] effects peer_down(request_id id, int64_t now_ns);
  /// The executor of `generation` failed (`why`); an older generation's failure is ignored.
  [[nodiscard]] effects executor_failed(int64_t generation, const std::string& why, int64_t now_ns);
  /// Start reporting load as engine `engine_index`, at most once per `interval_ns` (reports now);
  /// `cache_events`: with the pool's cache events, starting from a snapshot (report_load).
  [[nodiscard]] effects report_to(int32_t engine_index, int64_t interval_ns, int64_t now_ns,
                                  bool cache_events = false);
  /// The timer armed by arm_report_timer fired.
  [[nodiscard]] effects report_timer(int64_t now_ns);
  /// The host tier answered `fetch_blocks` for `id` with `blocks` (none: a miss, an error or no
  /// answer in time). If the request still waits (not released meanwhile), it is queued and
  /// the blocks are promoted into the pool after its own prefix when its admission is tried
  /// (engine_core::stage_promotion), so its prefill skips what the pool then holds (the hit rule
  /// applies); else the answer is dropped.
  /// `from_lower` (per block, or empty) marks the blocks the tier read from the tier below.
  [[nodiscard]] effects tier_answered(request_id id, std::vector<kv::kv_block> blocks, int64_t now_ns,
                                      std::vector<uint8_t> from_lower = {});

  /// Drain, first half: the node is shutting down. Load reports say `draining` from now on (one
  /// goes out at once) so the balancer sends no new work; live requests run on.
  [[nodiscard]] effects drain(int64_t now_ns);
  /// Drain, second half (the grace period ended): every request still here is dropped with a
  /// `forward` to its request actor, which places it again, and so is any work that arrives
  /// from now on. Implies drain().
  [[nodiscard]] effects forward_all(int64_t now_ns);
  /// Draining, and nothing is left here.
  [[nodiscard]] bool drained() const {
    return draining_ && requests_.empty() && tier_waits_.empty() && exporting_.empty();
  }
  [[nodiscard]] bool draining() const { return draining_; }
  /// Requests forwarded so far, and of them those that took their KV along (and its tokens).
  [[nodiscard]] int64_t num_forwarded() const { return num_forwarded_; }
  [[nodiscard]] int64_t num_forwarded_with_kv() const { return num_forwarded_with_kv_; }
  /// Hand-offs recomputed because their KV did not arrive intact (recompute_handoff).
  [[nodiscard]] int64_t num_handoffs_recomputed() const { return num_handoffs_recomputed_; }
  [[nodiscard]] int64_t num_forwarded_kv_tokens() const { return num_forwarded_kv_tokens_; }

  [[nodiscard]] int64_t generation() const { return generation_; }
  [[nodiscard]] bool is_live(request_id id) const { return requests_.count(id) != 0; }
  [[nodiscard]] size_t num_live() const { return requests_.size(); }
  [[nodiscard]] const engine_core& core() const { return *core_; }
  /// What the engine reports when asked (`stats_atom`): the core's counters and the policy's;
  /// the tiers' expirations are 0 here (the engine actor asks its host tier for them).
  [[nodiscard]] engine_report report(int64_t now_ns) const;

 private:
  struct live_request {
    int64_t scheduled_at_ns = 0;  // the engine's clock when first planned; 0 = not yet
    bool batch = false;           // request::batch_tokens: collect into `tokens`
    int32_t num_resumes = 0;      // executor failures survived
    token_batch tokens;           // age_ns holds each token's sample time until sent
  };
  struct handoff_target {
    peer_id decode = 0;
    std::string kv_address;
    uint16_t kv_port = 0;
  };
  struct reporting {
    int32_t engine_index = 0;
    int64_t interval_ns = 0;
    int64_t last_ns = 0;
    bool due = false;  // a timer is armed
    bool cache_events = false;
    bool snapshot_due = false;  // the next report's cache events are a snapshot
  };

  engine_policy(engine_policy_options options, std::unique_ptr<engine_core> core, int64_t now_ns);

  /// A request waiting for the host tier's answer (handoff: a prefill-only one).
  struct tier_wait {
    request req;
    std::optional<handoff_target> handoff;
    int32_t first_block = 0;  ///< the pool held this many leading blocks when the fetch went out
  };

  template <class Add>
  bool admit(const request& r, bool samples, Add&& add, effects& out, int64_t now_ns, bool watched = false);
  /// Host tier: true if `r` was answered here — refused, or sent to wait for the tier.
  bool fetch_first(request& r, std::optional<handoff_target>& handoff, effects& out);
  /// Queues a request whose tier answer came (its caller is watched already), the answer's
  /// blocks staged in the core for its admission.
  void admit_waited(tier_wait w, effects& out, int64_t now_ns, staged_promotion answer);
  [[nodiscard]] int64_t num_queued() const { return core_->num_waiting() + static_cast<int64_t>(tier_waits_.size()); }
  void kick(effects& out, int64_t now_ns);
  /// Adds a result's expert-placement figures to experts_.
  void count_expert_placement(const exec_result& result);
  void note_change(effects& out, int64_t now_ns);
  void send_report(effects& out, int64_t now_ns);
  /// The pool's cache events since the last report into `r` (report_load).
  void add_cache_events(report_load& r);
  void on_sample(sample_event&& e, effects& out, int64_t now_ns);
  void hand_off_prefilled(effects& out);
  /// Sends each finished embedding request its vector (a token_batch without tokens).
  void send_embedded(effects& out, int64_t now_ns);
  void drop(request_id id, effects& out, int64_t now_ns);
  /// After forward_all: new work `id` is forwarded to its caller at once (true).
  bool forwarded_at_once(request_id id, effects& out);
  /// Queues `r` to be computed here from its prompt (a submit, or a hand-off without its KV).
  effects compute_whole(request r, int64_t now_ns);
  /// Forwards the requests whose KV the core read out.
  void forward_exported(effects& out);

  engine_policy_options options_;
  std::unique_ptr<engine_core> core_;
  int64_t generation_ = 0;
  std::map<request_id, live_request> requests_;
  std::map<request_id, handoff_target> handoffs_;
  std::map<request_id, tier_wait> tier_waits_;  // waiting for the host tier's answer
  uint64_t next_ucx_tag_ = 0;
  std::optional<reporting> reporting_;
  int64_t num_received_ = 0;  // submits, prefills and hand-offs
  uint64_t num_cache_reports_ = 0;  // reports with cache events sent: the last one's cache_seq
  int64_t num_executor_failures_ = 0;
  int64_t num_resumed_requests_ = 0;
  expert_placement_stats experts_;
  bool draining_ = false;    // drain(): no new work wanted
  bool forwarding_ = false;  // forward_all(): nothing stays
  int64_t num_forwarded_ = 0;
  int64_t num_forwarded_with_kv_ = 0;
  int64_t num_handoffs_recomputed_ = 0;
  int64_t num_handoffs_timed_ = 0;  // note_handoff_time
  int64_t handoff_ns_ = 0;
  int64_t handoff_bytes_ = 0;
  int64_t num_forwarded_kv_tokens_ = 0;
  std::set<request_id> exporting_;  // forwarded with their KV once the core read it out
  int64_t executor_busy_ns_ = 0;
  int64_t busy_since_ns_ = 0;
  int64_t started_ns_ = 0;
};

}  // namespace troupe::engine
