#include "messages/kv_payload.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstring>
#include <string>

#include "messages/kv_payload.capnp.h"

namespace troupe::msg {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the payload stores floats little-endian as in memory");

void put_floats(::capnp::Data::Builder out, const std::vector<float>& in) {
  if (!in.empty()) std::memcpy(out.begin(), in.data(), in.size() * sizeof(float));
}

std::vector<float> get_floats(::capnp::Data::Reader in) {
  std::vector<float> out(in.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), in.begin(), out.size() * sizeof(float));
  return out;
}

/// Whether `bytes` holds exactly layers x tokens x dim floats, checked by division so that three
/// int32 dimensions from a peer cannot overflow the check.
bool fits(const engine::kv_data& kv, size_t bytes) {
  if (kv.num_layers == 0 || kv.num_tokens == 0 || kv.kv_dim == 0) return bytes == 0;
  if (bytes % sizeof(float) != 0) return false;
  size_t n = bytes / sizeof(float);
  for (int32_t d : {kv.num_layers, kv.num_tokens}) {
    if (n % static_cast<size_t>(d) != 0) return false;
    n /= static_cast<size_t>(d);
  }
  return n == static_cast<size_t>(kv.kv_dim);
}

}  // namespace

std::vector<uint8_t> encode_kv_payload(int64_t request_id, const engine::kv_data& kv) {
  TROUPE_ASSERT(kv.consistent());
  ::capnp::MallocMessageBuilder message;
  auto root = message.initRoot<capnp_kv::KvPayload>();
  root.setRequestId(request_id);
  root.setNumLayers(kv.num_layers);
  root.setKvDim(kv.kv_dim);
  root.setNumTokens(kv.num_tokens);
  put_floats(root.initKeys(static_cast<unsigned>(kv.keys.size() * sizeof(float))), kv.keys);
  put_floats(root.initValues(static_cast<unsigned>(kv.values.size() * sizeof(float))), kv.values);
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
    const ::capnp::Data::Reader keys = root.getKeys();  // each getter counts against the traversal limit
    const ::capnp::Data::Reader values = root.getValues();
    if (kv.num_layers < 0 || kv.kv_dim < 0 || kv.num_tokens < 0 || !fits(kv, keys.size()) || !fits(kv, values.size()))
      return fail(errc::invalid_argument,
                  "KV payload of request " + std::to_string(out.request_id) + ": " + std::to_string(kv.num_layers) +
                      " layers x " + std::to_string(kv.num_tokens) + " tokens x " + std::to_string(kv.kv_dim) +
                      " dims do not match " + std::to_string(keys.size()) + " key and " +
                      std::to_string(values.size()) + " value bytes");
    kv.keys = get_floats(keys);
    kv.values = get_floats(values);
  } catch (const kj::Exception& e) {
    return fail(errc::invalid_argument, std::string("malformed KV payload: ") + e.getDescription().cStr());
  }
  return out;
}

}  // namespace troupe::msg
