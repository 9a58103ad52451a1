# The bytes a prefill engine ships to a decode engine: one request's prompt KV, in a layout that
# does not depend on either engine's block size (see engine::kv_data). Floats are IEEE-754
# binary32, little-endian, row-major.
@0x845159fe67260488;

$import "/capnp/c++.capnp".namespace("troupe::capnp_kv");

struct KvPayload {
  requestId @0 :Int64;
  numLayers @1 :Int32;
  kvDim @2 :Int32;
  numTokens @3 :Int32;
  keys @4 :Data;    # numLayers x numTokens x kvDim floats
  values @5 :Data;  # the same shape
}
