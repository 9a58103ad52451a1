#include "messages/kv_block.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstring>
#include <string>

#include "messages/kv_block.capnp.h"

namespace troupe::msg {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the block stores floats little-endian as in memory");

void put_floats(::capnp::Data::Builder out, const std::vector<float>& in) {
  if (!in.empty()) std::memcpy(out.begin(), in.data(), in.size() * sizeof(float));
}

/// The floats of `in`, or false if it is not a whole number of them.
bool get_floats(::capnp::Data::Reader in, std::vector<float>& out) {
  if (in.size() % sizeof(float) != 0) return false;
  out.resize(in.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), in.begin(), in.size());
  return true;
}

tl::unexpected<error> malformed(const std::string& what) {
  return fail(errc::malformed_file, "KV block: " + what);
}

/// The fields of a parsed message; Cap'n Proto reports a malformed one by throwing.
expected<kv::kv_block> read_block(capnp_kv::KvBlock::Reader root) {
  kv::kv_block b;
  b.hash = root.getHash();
  b.parent_hash = root.getParentHash();
  const auto tokens = root.getTokens();
  b.tokens.reserve(tokens.size());
  for (const int32_t t : tokens) b.tokens.push_back(t);
  b.num_layers = root.getNumLayers();
  b.kv_dim = root.getKvDim();
  if (!get_floats(root.getKeys(), b.keys) || !get_floats(root.getValues(), b.values) || !kv::is_consistent(b))
    return malformed(std::to_string(b.num_layers) + " layers x " + std::to_string(b.tokens.size()) + " tokens x " +
                     std::to_string(b.kv_dim) + " dims do not match its data or its hash");
  if (kv::checksum(b) != root.getChecksum()) return malformed("checksum mismatch");
  return b;
}

}  // namespace

std::vector<uint8_t> encode_kv_block(const kv::kv_block& block) {
  TROUPE_ASSERT(kv::is_consistent(block));
  ::capnp::MallocMessageBuilder message;
  auto root = message.initRoot<capnp_kv::KvBlock>();
  root.setHash(block.hash);
  root.setParentHash(block.parent_hash);
  auto tokens = root.initTokens(static_cast<unsigned>(block.tokens.size()));
  for (size_t i = 0; i < block.tokens.size(); i++) tokens.set(static_cast<unsigned>(i), block.tokens[i]);
  root.setNumLayers(block.num_layers);
  root.setKvDim(block.kv_dim);
  put_floats(root.initKeys(static_cast<unsigned>(block.keys.size() * sizeof(float))), block.keys);
  put_floats(root.initValues(static_cast<unsigned>(block.values.size() * sizeof(float))), block.values);
  root.setChecksum(kv::checksum(block));
  const kj::Array<::capnp::word> words = ::capnp::messageToFlatArray(message);
  const kj::ArrayPtr<const kj::byte> bytes = words.asBytes();
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

expected<kv::kv_block> decode_kv_block(const uint8_t* data, size_t size) {
  if (size == 0 || size % sizeof(::capnp::word) != 0)
    return malformed(std::to_string(size) + " bytes are not a Cap'n Proto message (not a whole number of words)");
  kj::Array<::capnp::word> copy;
  kj::ArrayPtr<const ::capnp::word> words(reinterpret_cast<const ::capnp::word*>(data), size / sizeof(::capnp::word));
  if (reinterpret_cast<uintptr_t>(data) % alignof(::capnp::word) != 0) {  // the reader needs alignment
    copy = kj::heapArray<::capnp::word>(size / sizeof(::capnp::word));
    std::memcpy(copy.begin(), data, size);
    words = copy.asPtr();
  }
  // The one place exceptions are caught: Cap'n Proto reports malformed messages by throwing.
  try {
    ::capnp::ReaderOptions options;
    options.traversalLimitInWords = 2 * words.size() + 1024;  // every byte is read once; margin for headers
    ::capnp::FlatArrayMessageReader reader(words, options);
    if (reader.getEnd() != words.end()) return malformed("trailing bytes after the message");
    return read_block(reader.getRoot<capnp_kv::KvBlock>());
  } catch (const kj::Exception& e) {
    return malformed(std::string("not a Cap'n Proto message: ") + e.getDescription().cStr());
  }
}

}  // namespace troupe::msg
