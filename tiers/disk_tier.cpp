#include "tiers/disk_tier.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

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

}  // namespace

expected<disk_tier> disk_tier::open(const disk_tier_config& config) {
  if (config.directory.empty()) return fail(errc::invalid_argument, "the disk tier's directory is empty");
  if (config.capacity_bytes <= 0)
    return fail(errc::invalid_argument, "capacity_bytes must be > 0, got " + std::to_string(config.capacity_bytes));
  if (config.block_size <= 0)
    return fail(errc::invalid_argument, "block_size must be > 0, got " + std::to_string(config.block_size));
  std::error_code ec;
  fs::create_directories(config.directory, ec);
  if (ec) return fail(errc::io_error, "cannot create " + config.directory + ": " + ec.message());
  std::vector<std::string> names;
  for (fs::directory_iterator it(config.directory, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file()) names.push_back(it->path().filename().string());
  if (ec) return fail(errc::io_error, "cannot list " + config.directory + ": " + ec.message());
  std::sort(names.begin(), names.end());  // directory order is the file system's: not a decision
  disk_tier tier(config);
  for (const std::string& name : names) tier.load(name);
  return tier;
}

void disk_tier::load(const std::string& name) {
  const std::string path = (fs::path(config_.directory) / name).string();
  std::error_code ignored;
  if (ends_with(name, temp_suffix)) {  // a write cut short
    fs::remove(path, ignored);
    return;
  }
  if (!ends_with(name, block_suffix)) return;  // not ours
  auto block = read_block(path);
  if (block && static_cast<int32_t>(block->tokens.size()) != config_.block_size) return;  // another tier's size
  if (!block || path_of(block->hash) != path) {
    fs::remove(path, ignored);
    num_corrupt_blocks_++;
    return;
  }
  index(*block, static_cast<int64_t>(fs::file_size(path, ignored)));
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

expected<void> disk_tier::put(const kv::kv_block& block) {
  TROUPE_ASSERT_MSG(static_cast<int32_t>(block.tokens.size()) == config_.block_size, "a block of another size");
  TROUPE_ASSERT_MSG(kv::is_consistent(block), "an inconsistent block (validate it where it enters)");
  if (contains(block.hash)) return {};
  const std::vector<uint8_t> bytes = msg::encode_kv_block(block);
  const auto size = static_cast<int64_t>(bytes.size());
  if (num_bytes_ + size > config_.capacity_bytes)
    return fail(errc::overloaded, "the disk tier " + config_.directory + " is full: " + std::to_string(num_bytes_) +
                                      " of " + std::to_string(config_.capacity_bytes) + " bytes used, a block needs " +
                                      std::to_string(size));
  if (auto ok = write_file(path_of(block.hash), bytes); !ok) return ok;
  index(block, size);
  return {};
}

std::optional<kv::kv_block> disk_tier::get(uint64_t hash) {
  if (!contains(hash)) return std::nullopt;
  auto block = read_block(path_of(hash));
  if (!block || block->hash != hash) {
    drop_corrupt(hash);
    return std::nullopt;
  }
  return std::move(*block);
}

void disk_tier::drop_corrupt(uint64_t hash) {
  const auto it = index_.find(hash);
  TROUPE_ASSERT(it != index_.end());
  std::error_code ignored;
  fs::remove(path_of(hash), ignored);
  num_bytes_ -= it->second.file_bytes;
  index_.erase(it);
  num_corrupt_blocks_++;
}

int32_t disk_tier::longest_prefix(const std::vector<int32_t>& tokens) const {
  const auto block_bytes = sizeof(int32_t) * static_cast<size_t>(config_.block_size);
  return kv::longest_held_prefix(tokens, config_.block_size,
                                 [&](uint64_t hash, uint64_t parent, const int32_t* block_tokens) {
                                   const auto it = index_.find(hash);
                                   return it != index_.end() && it->second.parent_hash == parent &&
                                          std::memcmp(it->second.tokens.data(), block_tokens, block_bytes) == 0;
                                 });
}

void disk_tier::check_invariants() const {
  int64_t total = 0;
  for (const auto& [hash, e] : index_) {
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
