#pragma once

/// The load balancer's bookkeeping without an actor system (actors/load_balancer_actor.cpp is a
/// dispatcher over it): what it believes about each engine, where each live request was placed,
/// and which engines are lost.
///
/// Load. `num_requests` is exact: +1 when a request is placed on a decode (or mixed) engine, -1
/// when that request ends (`request_ended`). Token counts are an estimate: an engine's latest
/// load report plus the work placed on it that the report does not include yet. Each placement
/// on an engine is its n-th received work item (a submit, prefill or hand-off); a report that
/// has received m items covers the first m, so unseen work is dropped from the estimate as
/// reports catch up (`refresh`). A reordered (older) report is ignored.
///
/// Placement: the candidates of placement.hpp, chosen among by the configured router
/// (router.hpp; request numbers count placements from 0): a disaggregated request charges its prompt
/// minus one token to the prefill engine's queue and the whole prompt to the decode engine's KV;
/// a whole request charges both to one engine.
///
/// Prefixes (a router that uses_prefixes, router.hpp): a prefix_directory over the engines, in
/// blocks of the smallest engine block size (`prefix_block_size`), each engine's set bounded by
/// its KV capacity in those blocks. Before choosing, each engine's cached prefix of the prompt
/// is looked up; after, the prompt's chain is recorded on the engine that computes it (the
/// prefill engine of a disaggregated request, else the decode engine) as that engine's work
/// item. An engine whose block size is the directory's reports its pool's cached hashes
/// (`wants_cache_events`); a live engine's report applies them, checked where they enter (no
/// more than its capacity in blocks each way, none removed by a snapshot), and then covers the
/// placed prompts it has received. A report that leaves the directory out of sync asks the
/// caller for a snapshot (report_outcome::resync). A lost engine's set is dropped.
///
/// Cache tiers (a node's host-memory tier; `cache_tier_spec`): each of the directory's block
/// size reports its hashes and its disk tier's (`on_tier_report`, checked like an engine's
/// cache events; a fetch from the host tier reads through to its disk tier). Any engine
/// can fetch from any tier, so a tier's prefix counts for every engine: an engine's cached
/// prefix is the longer of its pool's and the longest any tier holds (ties: the lowest tier).
/// When that tier's is longer than the computing engine's pool's and than its own node's tier's
/// (which it asks anyway), the placement names it (`placement::cache_tier`): the engine fetches
/// from there. A lost tier (`cache_tier_lost`) holds nothing and reports no more.
///
/// Liveness (with a heartbeat timeout): every report and every pong is news from an engine;
/// `heartbeat` returns the engines silent for longer than the timeout (balance::liveness). A
/// lost engine (by heartbeat or DOWN: `mark_lost`) gets no new work; `placed_on` tells which
/// live requests must hear of it. A lost engine whose process was restarted is taken into
/// service again (`rejoined`) with what the balancer knew of the old one forgotten.
///
/// Requests are named by opaque keys the caller chooses. Pure: no CAF, no clock (`now_ns`).

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/balance/liveness.hpp"
#include "runtime/balance/placement.hpp"
#include "runtime/balance/prefix_directory.hpp"
#include "runtime/balance/router.hpp"

namespace troupe::balance {

/// One engine as configured.
struct engine_spec {
  engine_kind kind = engine_kind::mixed;
  int32_t max_num_seqs = 256;
  int64_t kv_capacity_tokens = 16384;
  int32_t block_size = 16;  ///< its KV pool's block size, tokens
  std::string name = "engine";  ///< in error messages, e.g. "engine 'e0' on node 'n0'"
  int32_t cache_tier = -1;  ///< its node's cache tier (an index of the cache tiers), -1: none
};

/// One cache tier as configured (a node's host-memory tier).
struct cache_tier_spec {
  int64_t capacity_blocks = 0;  ///< of its own block size
  int32_t block_size = 16;
  int64_t lower_capacity_blocks = 0;  ///< its disk tier's, at most (0: none)
};

/// An engine's load report (msg::load_report without its transport fields).
struct load_report {
  int64_t num_received = 0;  ///< work items received so far
  int64_t num_requests = 0;
  int64_t num_kv_tokens = 0;
  int64_t num_queued_prefill_tokens = 0;
  bool draining = false;  ///< its node is shutting down: no new work for it from now on
};

/// What became of a load report.
enum class report_outcome {
  ignored,  ///< no such engine, or a count out of range
  taken,
  resync,   ///< taken, and the engine's cache events are out of sync: ask it for a snapshot
};

using request_key = uint64_t;

class balancer_policy {
 public:
  /// `tier_bounds`: placement.hpp's prompt-length tiers; `heartbeat_timeout_ns` 0 = no heartbeat;
  /// `routing.policy` must be one of router_names() (checked where it is read).
  balancer_policy(std::vector<engine_spec> engines, std::vector<int32_t> tier_bounds, int64_t heartbeat_timeout_ns,
                int64_t now_ns, const router_options& routing = {}, std::vector<cache_tier_spec> cache_tiers = {});

  /// Chooses engines for request `key` of `num_prompt_tokens` tokens and charges them; the
  /// error (unavailable) names every lost engine. `prefix_hashes`: the prompt's chain hashes in
  /// blocks of prefix_block_size() (kv::chain_hashes), exactly num_prompt_tokens / that many,
  /// and none when prefix_block_size() is 0; another count is an error (invalid_argument). A key
  /// placed before (a request whose engine was lost) is placed anew: its first placement ends.
  [[nodiscard]] expected<placement> place(request_key key, int32_t num_prompt_tokens,
                                          const std::vector<uint64_t>& prefix_hashes = {});
  /// The request `key` ended; false if it was never placed (or ended already).
  bool request_ended(request_key key);
  /// A load report from engine `engine`, with its pool's cache events (seq 0: none); ignored:
  /// no such engine, a negative count, or cache events beyond the engine's capacity. Counts as
  /// news for the heartbeat. One that says `draining` ends the engine's new work for good (even
  /// a reordered one: draining does not stop). Its cache events count only from a live engine
  /// that wants_cache_events.
  [[nodiscard]] report_outcome on_report(int32_t engine, const load_report& r, int64_t now_ns,
                                         const pool_events& cache = {});
  /// Whether engine `engine`'s reports are to carry its pool's cache events: the router uses
  /// prefixes and the engine's block size is prefix_block_size().
  [[nodiscard]] bool wants_cache_events(size_t engine) const;
  /// A report of cache tier `tier`'s hashes, or (`lower`) its disk tier's; ignored: no such
  /// tier, a lost one, one that is not to report (wants_tier_events), or counts beyond the
  /// level's capacity.
  [[nodiscard]] report_outcome on_tier_report(int32_t tier, const pool_events& cache, bool lower = false);
  /// Whether cache tier `tier` is to report its hashes: the router uses prefixes and its block
  /// size is prefix_block_size().
  [[nodiscard]] bool wants_tier_events(size_t tier) const;
  /// Cache tier `tier` is lost: it holds nothing from now on; false if it was already.
  bool cache_tier_lost(size_t tier);
  [[nodiscard]] size_t num_cache_tiers() const { return cache_tiers_.size(); }
  /// Engine `engine` answered a ping.
  void heard_from(size_t engine, int64_t now_ns);
  /// The engines silent past the heartbeat timeout and not lost before, in index order: lost
  /// from now on (each exactly once; none without a heartbeat).
  [[nodiscard]] std::vector<size_t> heartbeat(int64_t now_ns);
  /// Engine `engine` is lost (its DOWN message); false if it was already.
  bool mark_lost(size_t engine);
  /// Engine `engine` is draining (it forwarded a request): no new work for it, as after a report
  /// that says so.
  void mark_draining(size_t engine);
  /// Lost engine `engine` is back, a new incarnation heard from at `now_ns`: it gets work again,
  /// its load estimate starts afresh (no report, nothing unseen) and its cached prefixes are
  /// none. Requests still counted there (placed before the loss, not yet placed again) stay
  /// counted until they end. False (and nothing changes) if it is not lost.
  bool rejoined(size_t engine, int64_t now_ns);

  [[nodiscard]] bool placed_on(request_key key, size_t engine) const;
  [[nodiscard]] const engine_load& load(size_t engine) const { return engines_.at(engine).load; }
  [[nodiscard]] size_t num_engines() const { return engines_.size(); }
  [[nodiscard]] size_t num_placed() const { return routed_.size(); }
  /// The block size of the prompts' chain hashes place() takes; 0 = it takes none (the router
  /// does not use prefixes).
  [[nodiscard]] int32_t prefix_block_size() const { return prefix_block_size_; }
  /// The prefix directory; only when prefix_block_size() > 0.
  [[nodiscard]] const prefix_directory& prefixes() const { return *prefixes_; }
  void check_invariants() const;

 private:
  /// Work placed on an engine that its last load report does not include yet.
  struct unseen_work {
    int64_t number = 0;  // the engine's n-th received work item
    int64_t kv_tokens = 0;
    int64_t prefill_tokens = 0;
  };
  struct engine_entry {
    engine_spec spec;
    engine_load load;
    load_report report;  // the latest
    int64_t num_sent = 0;  // work items placed on it
    std::deque<unseen_work> unseen;
    int64_t unseen_kv_tokens = 0;       // Σ unseen
    int64_t unseen_prefill_tokens = 0;  // Σ unseen
  };
  struct routed_request {
    size_t decode = 0;
    std::optional<size_t> prefill;
  };

  struct cache_tier_entry {
    cache_tier_spec spec;
    bool alive = true;
  };

  static void refresh(engine_entry& e);
  /// Whether `r`'s counts stay within `capacity_blocks` each way (no removals in a snapshot).
  [[nodiscard]] static bool events_fit(int64_t capacity_blocks, const pool_events& r);
  static void charge(engine_entry& e, int64_t kv_tokens, int64_t prefill_tokens);

  std::vector<engine_entry> engines_;
  std::vector<cache_tier_entry> cache_tiers_;
  std::vector<int32_t> bounds_;
  std::vector<std::vector<bool>> tiers_;  // assign_tiers over the prefill engines
  std::map<request_key, routed_request> routed_;
  std::optional<liveness> liveness_;
  std::unique_ptr<router> router_;
  int32_t prefix_block_size_ = 0;
  std::optional<prefix_directory> prefixes_;
  uint64_t num_routed_ = 0;  // placements asked for so far: the next request's number
};

}  // namespace troupe::balance
