#include "messages/kv_block.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstring>
#include <string>

#include "messages/kv_block.capnp.h"

namespace troupe::msg {
namespace {

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
  b.dtype = static_cast<kv::kv_dtype>(root.getDtype());
  const ::capnp::Data::Reader keys = root.getKeys(), values = root.getValues();
  b.keys.assign(keys.begin(), keys.end());
  b.values.assign(values.begin(), values.end());
  if (!kv::is_consistent(b))
    return malformed(std::to_string(b.num_layers) + " layers x " + std::to_string(b.tokens.size()) + " tokens x " +
                     std::to_string(b.kv_dim) + " dims of type " + std::to_string(root.getDtype()) +
                     " do not match its data or its hash");
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
  root.setDtype(static_cast<uint8_t>(block.dtype));
  root.setKeys(::capnp::Data::Reader(block.keys.data(), block.keys.size()));
  root.setValues(::capnp::Data::Reader(block.values.data(), block.values.size()));
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
