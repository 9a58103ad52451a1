# One cached KV block as the disk tier stores it, one block per file (actors/edge/disk_tier): its name
# in the block-hash chain (runtime/kv/chain_hash.hpp), its tokens, its keys and values for every
# layer, and an XXH3 checksum over all of them (kv::checksum) that finds a corrupted or
# truncated file. Rows of kvDim values as the pool that demoted the block stores them (dtype 0:
# IEEE-754 binary32 little-endian; 1: IEEE half; 2: llama.cpp's Q8_0 blocks of 32), row-major.
@0xf0a7b65e2e87d83d;

$import "/capnp/c++.capnp".namespace("troupe::capnp_kv");

struct KvBlock {
  hash @0 :UInt64;        # chain hash of tokens after parentHash
  parentHash @1 :UInt64;  # the previous block's chain hash (the root seed for a first block)
  tokens @2 :List(Int32); # block_size token ids
  numLayers @3 :Int32;
  kvDim @4 :Int32;
  keys @5 :Data;          # numLayers x len(tokens) rows
  values @6 :Data;        # the same shape
  checksum @7 :UInt64;    # kv::checksum of the other fields
  dtype @8 :UInt8;        # kv::kv_dtype; 0 (f32) in files from before it existed
}
