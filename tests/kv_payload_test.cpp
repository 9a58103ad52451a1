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

/// Rows of `dtype` (kv_row_bytes each) whose bytes count up.
engine::kv_data sample_kv(int32_t layers, int32_t tokens, int32_t dim, kv::kv_dtype dtype = kv::kv_dtype::f32) {
  engine::kv_data kv;
  kv.num_layers = layers;
  kv.num_tokens = tokens;
  kv.kv_dim = dim;
  kv.dtype = dtype;
  const size_t n = static_cast<size_t>(layers) * static_cast<size_t>(tokens) *
                   static_cast<size_t>(kv::kv_row_bytes(dtype, dim));
  for (size_t i = 0; i < n; i++) {
    kv.keys.push_back(static_cast<uint8_t>(i * 7));
    kv.values.push_back(static_cast<uint8_t>(255 - i));
  }
  return kv;
}

TEST(KvPayload, RoundTripsBitForBitAndItsBytesFollowTheType) {
  // 5 layers x 37 tokens of rows of 32: 23,680 bytes of keys as f32, 11,840 as f16, 6,290 as q8_0.
  for (const auto& [dtype, bytes] : {std::pair{kv::kv_dtype::f32, 23680}, std::pair{kv::kv_dtype::f16, 11840},
                                     std::pair{kv::kv_dtype::q8_0, 6290}}) {
    const engine::kv_data kv = sample_kv(5, 37, 32, dtype);
    ASSERT_EQ(kv.keys.size(), static_cast<size_t>(bytes));
    const std::vector<uint8_t> payload = encode_kv_payload(42, kv);
    EXPECT_LT(payload.size(), static_cast<size_t>(2 * bytes + 128));
    auto back = decode_kv_payload(payload);
    ASSERT_TRUE(back.has_value()) << back.error().message;
    EXPECT_EQ(back->request_id, 42);
    EXPECT_EQ(back->kv.num_layers, 5);
    EXPECT_EQ(back->kv.num_tokens, 37);
    EXPECT_EQ(back->kv.kv_dim, 32);
    EXPECT_EQ(back->kv.dtype, dtype);
    EXPECT_EQ(back->kv.keys, kv.keys);
    EXPECT_EQ(back->kv.values, kv.values);
  }
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
std::vector<uint8_t> handmade(int32_t layers, int32_t tokens, int32_t dim, size_t key_bytes, size_t value_bytes,
                              uint8_t dtype = 0) {
  ::capnp::MallocMessageBuilder message;
  auto root = message.initRoot<capnp_kv::KvPayload>();
  root.setRequestId(3);
  root.setDtype(dtype);
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
            "KV payload of request 3: 2 layers x 4 tokens x 4 dims of type 0 do not match 96 key and 96 value bytes");
  EXPECT_TRUE(decode_kv_payload(handmade(2, 3, 32, 6 * 34, 6 * 34, 2)).has_value());  // q8_0
  EXPECT_FALSE(decode_kv_payload(handmade(2, 3, 4, 96, 96, 3)).has_value());          // no such type
  EXPECT_FALSE(decode_kv_payload(handmade(2, 3, 16, 6 * 17, 6 * 17, 2)).has_value());  // q8_0 rows of half a block
  EXPECT_FALSE(decode_kv_payload(handmade(2, 3, 4, 96, 92)).has_value());
  EXPECT_FALSE(decode_kv_payload(handmade(-2, -3, 4, 96, 96)).has_value());
  EXPECT_FALSE(decode_kv_payload(handmade(65536, 65536, 65536, 0, 0)).has_value());
  EXPECT_FALSE(decode_kv_payload(handmade(2147483647, 2147483647, 2147483647, 0, 0)).has_value());  // no overflow
}

}  // namespace
}  // namespace troupe::msg
