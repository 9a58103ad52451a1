#include "actors/edge/disk_tier.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>

#include "messages/kv_block.hpp"
#include "runtime/common/mapped_file.hpp"
#include "runtime/kv/chain_hash.hpp"

namespace troupe::tiers {
namespace fs = std::filesystem;
namespace {

constexpr const char* block_suffix = ".kvblock";
constexpr const char* temp_suffix = ".tmp";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// The block in the file at `path`, or why not.
expected<kv::kv_block> read_block(const std::string& path) {
  auto file = mapped_file::open(path);
  if (!file) return tl::unexpected(file.error());
  const std::string_view bytes = file->bytes();
  return msg::decode_kv_block(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

/// Writes `bytes` to `path` + ".tmp" and renames it to `path`.
expected<void> write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  const std::string temp = path + temp_suffix;
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::error_code ignored;
      fs::remove(temp, ignored);
      return fail(errc::io_error, "cannot write " + temp);
    }
  }
  std::error_code ec;
  fs::rename(temp, path, ec);
  if (ec) {
    fs::remove(temp, ec);
    return fail(errc::io_error, "cannot rename " + temp + ": " + ec.message());
  }
  return {};
}

/// Stamps `path` with the file system's current time: the order of uses that a restart reads
/// back. Best effort: a stamp that fails only blurs that order.
void touch(const std::string& path) { (void)::utimensat(AT_FDCWD, path.c_str(), nullptr, 0); }

/// The names of the regular files in `directory`, sorted (directory order is the file
/// system's: not a decision).
expected<std::vector<std::string>> list_files(const std::string& directory) {
  std::error_code ec;
  std::vector<std::string> names;
  for (fs::directory_iterator it(directory, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file()) names.push_back(it->path().filename().string());
  if (ec) return fail(errc::io_error, "cannot list " + directory + ": " + ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

expected<disk_tier> disk_tier::open(const disk_tier_config& config, int64_t now_ns) {
  if (config.directory.empty()) return fail(errc::invalid_argument, "the disk tier's directory is empty");
  if (config.capacity_bytes <= 0)
    return fail(errc::invalid_argument, "capacity_bytes must be > 0, got " + std::to_string(config.capacity_bytes));
  if (config.block_size <= 0)
    return fail(errc::invalid_argument, "block_size must be > 0, got " + std::to_string(config.block_size));
  if (auto ok = kv::lru_ttl::check_ttls(config.chat_ttl_ns, config.agent_ttl_ns); !ok)
    return tl::unexpected(ok.error());
  std::error_code ec;
  fs::create_directories(config.directory, ec);
  if (ec) return fail(errc::io_error, "cannot create " + config.directory + ": " + ec.message());
  auto names = list_files(config.directory);
  if (!names) return tl::unexpected(names.error());
  disk_tier tier(config);
  tier.lives_.advance_clock(now_ns);
  std::vector<std::pair<fs::file_time_type, uint64_t>> found;  // (mtime, hash): ties by hash = by name
  for (const std::string& name : *names) {
    const std::optional<uint64_t> hash = tier.load(name);
    if (!hash) continue;
    const fs::file_time_type mtime = fs::last_write_time(tier.path_of(*hash), ec);
    found.emplace_back(ec ? fs::file_time_type::min() : mtime, *hash);
  }
  std::sort(found.begin(), found.end());
  for (const auto& [mtime, hash] : found) tier.lives_.use(hash, kv::cache_class::chat, now_ns);
  return tier;
}

std::optional<uint64_t> disk_tier::load(const std::string& name) {
  const std::string path = (fs::path(config_.directory) / name).string();
  std::error_code ignored;
  if (ends_with(name, temp_suffix)) {  // a write cut short
    fs::remove(path, ignored);
    return std::nullopt;
  }
  if (!ends_with(name, block_suffix)) return std::nullopt;  // not ours
  auto block = read_block(path);
  if (block && static_cast<int32_t>(block->tokens.size()) != config_.block_size) return std::nullopt;  // another size
  if (!block || path_of(block->hash) != path) {
    fs::remove(path, ignored);
    num_corrupt_blocks_++;
    return std::nullopt;
  }
  index(*block, static_cast<int64_t>(fs::file_size(path, ignored)));
  return block->hash;
}

void disk_tier::index(const kv::kv_block& block, int64_t file_bytes) {
  TROUPE_ASSERT(file_bytes > 0);
  entry& e = index_[block.hash];
  e.parent_hash = block.parent_hash;
  e.tokens = block.tokens;
  e.file_bytes = file_bytes;
  num_bytes_ += file_bytes;
}

std::string disk_tier::path_of(uint64_t hash) const {
  char name[32];
  std::snprintf(name, sizeof name, "%016" PRIx64 "%s", hash, block_suffix);
  return (fs::path(config_.directory) / name).string();
}

expected<int64_t> disk_tier::put(const kv::kv_block& block, kv::cache_class cls, int64_t now_ns) {
  TROUPE_ASSERT_MSG(static_cast<int32_t>(block.tokens.size()) == config_.block_size, "a block of another size");
  TROUPE_ASSERT_MSG(kv::is_consistent(block), "an inconsistent block (validate it where it enters)");
  lives_.advance_clock(now_ns);
  const std::string path = path_of(block.hash);
  if (lives_.is_alive(block.hash, now_ns)) {
    lives_.use(block.hash, cls, now_ns);
    touch(path);
    return 0;
  }
  const std::vector<uint8_t> bytes = msg::encode_kv_block(block);
  const auto size = static_cast<int64_t>(bytes.size());
  if (size > config_.capacity_bytes)
    return fail(errc::overloaded, "the disk tier " + config_.directory + " cannot hold a block of " +
                                      std::to_string(size) + " bytes: its capacity is " +
                                      std::to_string(config_.capacity_bytes) + " bytes");
  (void)expire(now_ns);  // an expired copy of this block goes too
  const int64_t num_evicted = evict_for(size);
  if (auto ok = write_file(path, bytes); !ok) return tl::unexpected(ok.error());
  index(block, size);
  lives_.use(block.hash, cls, now_ns);
  return num_evicted;
}

int64_t disk_tier::evict_for(int64_t size) {
  int64_t n = 0;
  while (num_bytes_ + size > config_.capacity_bytes) {
    const std::optional<uint64_t> lru = lives_.least_recent();
    TROUPE_ASSERT_MSG(lru.has_value(), "an empty disk tier cannot hold a block it accepted");
    remove(*lru);
    n++;
  }
  num_evictions_ += n;
  return n;
}

std::optional<kv::kv_block> disk_tier::get(uint64_t hash, int64_t now_ns) {
  lives_.advance_clock(now_ns);
  if (!contains(hash)) return std::nullopt;
  if (!lives_.is_alive(hash, now_ns)) {
    remove(hash);
    num_expirations_++;
    return std::nullopt;
  }
  const std::string path = path_of(hash);
  auto block = read_block(path);
  if (!block || block->hash != hash) {
    remove(hash);
    num_corrupt_blocks_++;
    return std::nullopt;
  }
  lives_.use(hash, lives_.class_of(hash), now_ns);
  touch(path);
  return std::move(*block);
}

int64_t disk_tier::expire(int64_t now_ns) {
  lives_.advance_clock(now_ns);
  int64_t n = 0;
  for (auto hash = lives_.first_expired(now_ns); hash; hash = lives_.first_expired(now_ns)) {
    remove(*hash);
    n++;
  }
  num_expirations_ += n;
  return n;
}

void disk_tier::remove(uint64_t hash) {
  const auto it = index_.find(hash);
  TROUPE_ASSERT(it != index_.end());
  std::error_code ignored;
  fs::remove(path_of(hash), ignored);
  num_bytes_ -= it->second.file_bytes;
  index_.erase(it);
  lives_.remove(hash);
}

int32_t disk_tier::longest_prefix(const std::vector<int32_t>& tokens, int64_t now_ns) const {
  TROUPE_ASSERT_MSG(now_ns >= lives_.now_ns(), "the tier's clock went backwards");
  const auto block_bytes = sizeof(int32_t) * static_cast<size_t>(config_.block_size);
  return kv::longest_held_prefix(tokens, config_.block_size,
                                 [&](uint64_t hash, uint64_t parent, const int32_t* block_tokens) {
                                   const auto it = index_.find(hash);
                                   return it != index_.end() && lives_.is_alive(hash, now_ns) &&
                                          it->second.parent_hash == parent &&
                                          std::memcmp(it->second.tokens.data(), block_tokens, block_bytes) == 0;
                                 });
}

void disk_tier::check_invariants() const {
  lives_.check_invariants();
  TROUPE_ASSERT_MSG(lives_.size() == num_blocks(), "the index and the lifetimes disagree");
  int64_t total = 0;
  for (const auto& [hash, e] : index_) {
    TROUPE_ASSERT_MSG(lives_.contains(hash), "an indexed block has no lifetime");
    TROUPE_ASSERT(static_cast<int32_t>(e.tokens.size()) == config_.block_size);
    TROUPE_ASSERT_MSG(kv::chain_hash(e.parent_hash, e.tokens.data(), config_.block_size) == hash,
                      "an index entry is not named by its chain hash");
    std::error_code ec;
    const auto size = fs::file_size(path_of(hash), ec);
    TROUPE_ASSERT_MSG(!ec && static_cast<int64_t>(size) == e.file_bytes, "an indexed file is missing or resized");
    total += e.file_bytes;
  }
  TROUPE_ASSERT_MSG(total == num_bytes_, "the disk tier's byte count is off");
}

}  // namespace troupe::tiers
