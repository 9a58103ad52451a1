// The prefill -> decode KV payload (Cap'n Proto): exact round trips, and every kind of bad
// bytes a peer could send turns into a clear error, never an exception or a crash.
#include "messages/kv_payload.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include <cstring>

#include "messages/kv_payload.capnp.h"

namespace troupe::msg {
namespace {

engine::kv_data sample_kv(int32_t layers, int32_t tokens, int32_t dim) {
  engine::kv_data kv;
  kv.num_layers = layers;
  kv.num_tokens = tokens;
  kv.kv_dim = dim;
  const size_t n = static_cast<size_t>(layers) * tokens * dim;
  for (size_t i = 0; i < n; i++) {
    kv.keys.push_back(static_cast<float>(i) * 0.25f - 3.0f);
    kv.values.push_back(1.0f / static_cast<float>(i + 1));
  }
  return kv;
}

TEST(KvPayload, RoundTripsBitForBit) {
  const engine::kv_data kv = sample_kv(5, 37, 32);
  const std::vector<uint8_t> bytes = encode_kv_payload(42, kv);
  auto back = decode_kv_payload(bytes);
  ASSERT_TRUE(back.has_value()) << back.error().message;
  EXPECT_EQ(back->request_id, 42);
  EXPECT_EQ(back->kv.num_layers, 5);
  EXPECT_EQ(back->kv.num_tokens, 37);
  EXPECT_EQ(back->kv.kv_dim, 32);
  ASSERT_EQ(back->kv.keys.size(), kv.keys.size());
  EXPECT_EQ(std::memcmp(back->kv.keys.data(), kv.keys.data(), kv.keys.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(back->kv.values.data(), kv.values.data(), kv.values.size() * sizeof(float)), 0);
}

TEST(KvPayload, EmptyKvRoundTrips) {
  auto back = decode_kv_payload(encode_kv_payload(7, sample_kv(5, 0, 32)));
  ASSERT_TRUE(back.has_value()) << back.error().message;
  EXPECT_EQ(back->kv.num_tokens, 0);
  EXPECT_TRUE(back->kv.keys.empty());
}

TEST(KvPayload, BadBytesAreClearErrors) {
  auto empty = decode_kv_payload({});
  ASSERT_FALSE(empty.has_value());
  EXPECT_EQ(empty.error().code, errc::invalid_argument);
  EXPECT_NE(empty.error().message.find("not a Cap'n Proto message"), std::string::npos);

  std::vector<uint8_t> bytes = encode_kv_payload(1, sample_kv(2, 3, 4));
  std::vector<uint8_t> odd = bytes;
  odd.pop_back();
  EXPECT_FALSE(decode_kv_payload(odd).has_value());

  std::vector<uint8_t> truncated(bytes.begin(), bytes.begin() + 16);
  auto t = decode_kv_payload(truncated);
  ASSERT_FALSE(t.has_value());
  EXPECT_NE(t.error().message.find("malformed KV payload"), std::string::npos) << t.error().message;

  std::vector<uint8_t> garbage(64, 0xff);
  EXPECT_FALSE(decode_kv_payload(garbage).has_value());
}

/// A payload built by hand, as a buggy or hostile peer could.
std::vector<uint8_t> handmade(int32_t layers, int32_t tokens, int32_t dim, size_t key_bytes, size_t value_bytes) {
  ::capnp::MallocMessageBuilder message;
  auto root = message.initRoot<capnp_kv::KvPayload>();
  root.setRequestId(3);
  root.setNumLayers(layers);
  root.setNumTokens(tokens);
  root.setKvDim(dim);
  root.initKeys(static_cast<unsigned>(key_bytes));
  root.initValues(static_cast<unsigned>(value_bytes));
  const kj::Array<::capnp::word> words = ::capnp::messageToFlatArray(message);
  return std::vector<uint8_t>(words.asBytes().begin(), words.asBytes().end());
}

TEST(KvPayload, DimensionsThatDoNotMatchTheBytesAreRefused) {
  ASSERT_TRUE(decode_kv_payload(handmade(2, 3, 4, 96, 96)).has_value());
  auto wrong = decode_kv_payload(handmade(2, 4, 4, 96, 96));
  ASSERT_FALSE(wrong.has_value());
  EXPECT_EQ(wrong.error().message,
            "KV payload of request 3: 2 layers x 4 tokens x 4 dims do not match 96 key and 96 value bytes");
  EXPECT_FALSE(decode_kv_payload(handmade(2, 3, 4, 96, 92)).has_value());
  EXPECT_FALSE(decode_kv_payload(handmade(-2, -3, 4, 96, 96)).has_value());
  EXPECT_FALSE(decode_kv_payload(handmade(65536, 65536, 65536, 0, 0)).has_value());
  EXPECT_FALSE(decode_kv_payload(handmade(2147483647, 2147483647, 2147483647, 0, 0)).has_value());  // no overflow
}

}  // namespace
}  // namespace troupe::msg
