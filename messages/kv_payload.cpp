#include "messages/kv_payload.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstring>
#include <string>

#include "messages/kv_payload.capnp.h"

namespace troupe::msg {

std::vector<uint8_t> encode_kv_payload(int64_t request_id, const engine::kv_data& kv) {
  TROUPE_ASSERT(kv.consistent());
  ::capnp::MallocMessageBuilder message;
  auto root = message.initRoot<capnp_kv::KvPayload>();
  root.setRequestId(request_id);
  root.setNumLayers(kv.num_layers);
  root.setKvDim(kv.kv_dim);
  root.setNumTokens(kv.num_tokens);
  root.setDtype(static_cast<uint8_t>(kv.dtype));
  root.setKeys(::capnp::Data::Reader(kv.keys.data(), kv.keys.size()));
  root.setValues(::capnp::Data::Reader(kv.values.data(), kv.values.size()));
  const kj::Array<::capnp::word> words = ::capnp::messageToFlatArray(message);
  const kj::ArrayPtr<const kj::byte> bytes = words.asBytes();
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

expected<decoded_kv_payload> decode_kv_payload(const std::vector<uint8_t>& bytes) {
  if (bytes.size() % sizeof(::capnp::word) != 0 || bytes.empty())
    return fail(errc::invalid_argument, "KV payload of " + std::to_string(bytes.size()) +
                                            " bytes is not a Cap'n Proto message (not a whole number of words)");
  // The reader needs word alignment; a copy costs less than the transfer that brought the bytes.
  kj::Array<::capnp::word> words = kj::heapArray<::capnp::word>(bytes.size() / sizeof(::capnp::word));
  std::memcpy(words.begin(), bytes.data(), bytes.size());
  decoded_kv_payload out;
  // The one place exceptions are caught: Cap'n Proto reports malformed messages by throwing.
  try {
    ::capnp::ReaderOptions options;
    options.traversalLimitInWords = 2 * words.size() + 1024;  // every byte is read once; margin for headers
    ::capnp::FlatArrayMessageReader reader(words, options);
    auto root = reader.getRoot<capnp_kv::KvPayload>();
    out.request_id = root.getRequestId();
    engine::kv_data& kv = out.kv;
    kv.num_layers = root.getNumLayers();
    kv.kv_dim = root.getKvDim();
    kv.num_tokens = root.getNumTokens();
    kv.dtype = static_cast<kv::kv_dtype>(root.getDtype());
    const ::capnp::Data::Reader keys = root.getKeys();  // each getter counts against the traversal limit
    const ::capnp::Data::Reader values = root.getValues();
    if (!kv::holds_kv(kv.num_layers, kv.num_tokens, kv.kv_dim, kv.dtype, keys.size(), values.size()))
      return fail(errc::invalid_argument,
                  "KV payload of request " + std::to_string(out.request_id) + ": " + std::to_string(kv.num_layers) +
                      " layers x " + std::to_string(kv.num_tokens) + " tokens x " + std::to_string(kv.kv_dim) +
                      " dims of type " + std::to_string(root.getDtype()) + " do not match " +
                      std::to_string(keys.size()) + " key and " + std::to_string(values.size()) + " value bytes");
    kv.keys.assign(keys.begin(), keys.end());
    kv.values.assign(values.begin(), values.end());
  } catch (const kj::Exception& e) {
    return fail(errc::invalid_argument, std::string("malformed KV payload: ") + e.getDescription().cStr());
  }
  return out;
}

}  // namespace troupe::msg
