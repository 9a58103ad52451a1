# The bytes a prefill engine ships to a decode engine: one request's prompt KV, in a layout that
# does not depend on either engine's block size (see engine::kv_data): rows of kvDim values as
# the sending pool stores them (dtype 0: IEEE-754 binary32 little-endian; 1: IEEE half; 2:
# llama.cpp's Q8_0 blocks of 32), row-major.
@0x845159fe67260488;

$import "/capnp/c++.capnp".namespace("troupe::capnp_kv");

struct KvPayload {
  requestId @0 :Int64;
  numLayers @1 :Int32;
  kvDim @2 :Int32;
  numTokens @3 :Int32;
  keys @4 :Data;    # numLayers x numTokens rows
  values @5 :Data;  # the same shape
  dtype @6 :UInt8;  # kv::kv_dtype; 0 (f32) in payloads from before it existed
}
