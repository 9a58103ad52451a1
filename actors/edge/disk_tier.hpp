#pragma once

/// The disk tier: cached KV blocks in a directory, one file per block, so they outlive the
/// process (issue 14). runtime/ stays pure; the files live here.
///
/// Files. Block `hash` is `<directory>/<hash as 16 lowercase hex digits>.kvblock`, a
/// messages/kv_block Cap'n Proto message carrying its XXH3 checksum. A put writes
/// `<name>.tmp` and renames it over `<name>`, so a crash leaves a whole file or a stray .tmp.
/// Reads map the file (mmap) and decode it in place.
///
/// Eviction, as the host tier's store (runtime/kv/tier_store.hpp; the bookkeeping is
/// kv::lru_ttl, shared with it). Time is the caller's `now_ns` (never read here; never
/// backwards). A put and a successful get are uses: the block becomes the most recent and lives
/// ttl(class) from then — a put with the class it is given, a get keeping the block's own — so
/// a block is alive while now < last use + ttl (7 days chat, 3 agent by default). An expired
/// block is never returned: a get of it, a put or `expire` removes its file
/// (num_expirations). `capacity_bytes` bounds the files' total size: a put that would pass it
/// removes expired blocks, then least recently used ones (num_evictions) until the new block
/// fits; it is refused with errc::overloaded, changing nothing, only when the block is bigger
/// than the whole capacity (the engine keeps serving: the block is only not kept).
///
/// Start. `open` creates the directory if needed and rebuilds the index from the files: every
/// .kvblock file that decodes, passes its checksum and is named by its own hash is indexed;
/// any other .kvblock file and every stray .tmp file is removed (num_corrupt_blocks counts the
/// former). Other files are left alone. The recency order survives a restart through the
/// files' modification times: a write stamps the file and a get touches it (the file system's
/// clock, as for any write), and `open` orders the blocks it finds by modification time,
/// oldest first, ties by name. Their classes are not stored: each found block starts a chat
/// lifetime at `open`'s `now_ns`. Files found at open count even beyond the capacity; the next
/// put evicts down to it.
///
/// Damage. A file that stops decoding after `open` (truncated, a flipped bit) is found by its
/// checksum when it is read: `get` removes it and answers a miss, so the prefix is recomputed.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/kv/cache_class.hpp"
#include "runtime/kv/kv_block.hpp"
#include "runtime/kv/lower_tier.hpp"
#include "runtime/kv/lru_ttl.hpp"

namespace troupe::tiers {

struct disk_tier_config {
  std::string directory;
  int64_t capacity_bytes = 0;
  int32_t block_size = 16;                    ///< tokens per block: files of another size are not this tier's
  int64_t chat_ttl_ns = 7 * kv::day_ns;   ///< the seed's chat lifetime, as kv::tier_config's
  int64_t agent_ttl_ns = 3 * kv::day_ns;  ///< the seed's agent lifetime
};

class disk_tier final : public kv::lower_tier {
 public:
  /// Opens (creating) the directory at `now_ns` and rebuilds the index (see the header).
  /// Errors: invalid_argument for an empty directory name, a size or TTL <= 0; io_error naming
  /// the path if the directory cannot be created or listed.
  [[nodiscard]] static expected<disk_tier> open(const disk_tier_config& config, int64_t now_ns);

  /// Writes `block` (consistent, of block_size tokens: asserted) as used at `now_ns` with class
  /// `cls`, first evicting what it must; a block already held alive is only used again.
  /// Returns how many blocks were evicted to make room (expired ones not counted). Errors:
  /// overloaded, changing nothing, when the block is bigger than the capacity; io_error if the
  /// file cannot be written (blocks evicted for it stay evicted).
  [[nodiscard]] expected<int64_t> put(const kv::kv_block& block, kv::cache_class cls, int64_t now_ns) override;

  /// The block named `hash`, read back from its file and used at `now_ns` with its own class;
  /// nullopt if absent, expired (then removed) or damaged (then removed, num_corrupt_blocks).
  [[nodiscard]] std::optional<kv::kv_block> get(uint64_t hash, int64_t now_ns) override;

  /// Removes every block expired at `now_ns`; returns how many.
  int64_t expire(int64_t now_ns) override;

  /// How many leading full blocks of `tokens` the tier holds alive at `now_ns` (stored tokens
  /// and parent hashes compared, as the pool does). Not a use.
  [[nodiscard]] int32_t longest_prefix(const std::vector<int32_t>& tokens, int64_t now_ns) const;

  [[nodiscard]] bool contains(uint64_t hash) const { return index_.count(hash) != 0; }
  [[nodiscard]] int64_t num_blocks() const override { return static_cast<int64_t>(index_.size()); }
  [[nodiscard]] int64_t num_bytes() const { return num_bytes_; }
  [[nodiscard]] int64_t capacity_bytes() const { return config_.capacity_bytes; }
  [[nodiscard]] int32_t block_size() const override { return config_.block_size; }
  [[nodiscard]] int64_t num_corrupt_blocks() const { return num_corrupt_blocks_; }
  [[nodiscard]] int64_t num_evictions() const { return num_evictions_; }
  [[nodiscard]] int64_t num_expirations() const override { return num_expirations_; }
  [[nodiscard]] kv::cache_events take_events() override { return lives_.take_events(); }
  [[nodiscard]] std::vector<uint64_t> hashes() const override { return lives_.hashes(); }
  /// Held blocks' hashes, least recently used first (the next to evict first).
  [[nodiscard]] std::vector<uint64_t> lru_order() const { return lives_.lru_order(); }
  /// The file that holds (or would hold) block `hash`.
  [[nodiscard]] std::string path_of(uint64_t hash) const;

  /// Aborts unless the index and the lifetimes (recency and expiry orders, kv::lru_ttl's
  /// invariants) hold the same blocks, the byte count is the sum of the indexed files' sizes,
  /// every indexed file exists with its recorded size, and every entry holds block_size tokens.
  void check_invariants() const;

 private:
  struct entry {
    uint64_t parent_hash = 0;
    std::vector<int32_t> tokens;  // (block_size)
    int64_t file_bytes = 0;
  };

  explicit disk_tier(const disk_tier_config& config)
      : config_(config), lives_(config.chat_ttl_ns, config.agent_ttl_ns) {}

  /// Indexes the file `name` of the directory if it holds a sound block, else removes it;
  /// returns the hash of a block it indexed.
  std::optional<uint64_t> load(const std::string& name);
  void index(const kv::kv_block& block, int64_t file_bytes);
  /// Removes block `hash`'s file and forgets it.
  void remove(uint64_t hash);
  /// Removes least recently used blocks until `size` more bytes fit; returns how many.
  int64_t evict_for(int64_t size);

  disk_tier_config config_;
  std::map<uint64_t, entry> index_;  // chain hash -> what is on disk
  kv::lru_ttl lives_;                // their last uses: recency and expiry orders
  int64_t num_bytes_ = 0;
  int64_t num_corrupt_blocks_ = 0;
  int64_t num_evictions_ = 0;
  int64_t num_expirations_ = 0;
};

}  // namespace troupe::tiers
