#pragma once

/// The disk tier: cached KV blocks in a directory, one file per block, so they outlive the
/// process (issue 14). runtime/ stays pure; the files live here.
///
/// Files. Block `hash` is `<directory>/<hash as 16 lowercase hex digits>.kvblock`, a
/// messages/kv_block Cap'n Proto message carrying its XXH3 checksum. A put writes
/// `<name>.tmp` and renames it over `<name>`, so a crash leaves a whole file or a stray .tmp.
/// Reads map the file (mmap) and decode it in place.
///
/// Start. `open` creates the directory if needed and rebuilds the index from the files, in name
/// order: every .kvblock file that decodes, passes its checksum and is named by its own hash is
/// indexed; any other .kvblock file and every stray .tmp file is removed (num_corrupt_blocks
/// counts the former). Other files are left alone.
///
/// Damage. A file that stops decoding after `open` (truncated, a flipped bit) is found by its
/// checksum when it is read: `get` removes it and answers a miss, so the prefix is recomputed.
///
/// Capacity. `capacity_bytes` bounds the files' total size; a put that would pass it is refused
/// with errc::overloaded and changes nothing (the engine keeps serving: the block is only not
/// kept). Files found at open count even beyond it. Eviction (LRU, TTL) is planned.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/kv/kv_block.hpp"
#include "runtime/kv/lower_tier.hpp"

namespace troupe::tiers {

struct disk_tier_config {
  std::string directory;
  int64_t capacity_bytes = 0;
  int32_t block_size = 16;  ///< tokens per block: files of another size are not this tier's
};

class disk_tier final : public kv::lower_tier {
 public:
  /// Opens (creating) the directory and rebuilds the index. Errors: invalid_argument for an
  /// empty directory name or a size <= 0; io_error naming the path if the directory cannot be
  /// created or listed.
  [[nodiscard]] static expected<disk_tier> open(const disk_tier_config& config);

  /// Writes `block` (consistent, of block_size tokens: asserted). Already held: nothing to do.
  /// Errors: overloaded when the tier is full, io_error if the file cannot be written.
  [[nodiscard]] expected<void> put(const kv::kv_block& block) override;

  /// The block named `hash`, read back from its file; nullopt if absent, or if the file is
  /// damaged (then removed, counted in num_corrupt_blocks).
  [[nodiscard]] std::optional<kv::kv_block> get(uint64_t hash) override;

  /// How many leading full blocks of `tokens` the tier holds (stored tokens and parent hashes
  /// compared, as the pool does).
  [[nodiscard]] int32_t longest_prefix(const std::vector<int32_t>& tokens) const;

  [[nodiscard]] bool contains(uint64_t hash) const { return index_.count(hash) != 0; }
  [[nodiscard]] int64_t num_blocks() const override { return static_cast<int64_t>(index_.size()); }
  [[nodiscard]] int64_t num_bytes() const { return num_bytes_; }
  [[nodiscard]] int64_t capacity_bytes() const { return config_.capacity_bytes; }
  [[nodiscard]] int32_t block_size() const override { return config_.block_size; }
  [[nodiscard]] int64_t num_corrupt_blocks() const { return num_corrupt_blocks_; }
  /// The file that holds (or would hold) block `hash`.
  [[nodiscard]] std::string path_of(uint64_t hash) const;

  /// Aborts unless the byte count is the sum of the indexed files' sizes, every indexed file
  /// exists with its recorded size, and every entry holds block_size tokens.
  void check_invariants() const;

 private:
  struct entry {
    uint64_t parent_hash = 0;
    std::vector<int32_t> tokens;  // (block_size)
    int64_t file_bytes = 0;
  };

  explicit disk_tier(const disk_tier_config& config) : config_(config) {}

  /// Indexes the file `name` of the directory if it holds a sound block, else removes it.
  void load(const std::string& name);
  void index(const kv::kv_block& block, int64_t file_bytes);
  void drop_corrupt(uint64_t hash);

  disk_tier_config config_;
  std::map<uint64_t, entry> index_;  // chain hash -> what is on disk
  int64_t num_bytes_ = 0;
  int64_t num_corrupt_blocks_ = 0;
};

}  // namespace troupe::tiers
