// Unit tests for the client's wire conversions (client/api/wire.h): what a
// KEY_INFO / WELCOME key entry from a hub must satisfy to be accepted.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "wire.h"

namespace rackhub::client::internal {
namespace {

data::v1::KeyEntry Entry(uint64_t elements, uint64_t chunks) {
  data::v1::KeyEntry e;
  e.set_id(1);
  e.set_name("w");
  e.set_elements(elements);
  e.set_dtype(admin::v1::FP32);
  e.set_chunk_count(chunks);
  return e;
}

TEST(WireTest, KeyEntryChunksMustCoverTheElements) {
  EXPECT_TRUE(ToKeyInfo(Entry(10000, 2), 8192).ok());
  EXPECT_TRUE(ToKeyInfo(Entry(8192, 1), 8192).ok());
  EXPECT_FALSE(ToKeyInfo(Entry(8193, 1), 8192).ok());
  EXPECT_FALSE(ToKeyInfo(Entry(10000, 3), 8192).ok());
  EXPECT_FALSE(ToKeyInfo(Entry(0, 0), 8192).ok());
  EXPECT_FALSE(ToKeyInfo(Entry(10, 1), 0).ok());
}

// elements near 2^64: the chunk count must not wrap (2^64-1 elements in 0
// chunks was accepted; found by fuzz/control/control_fuzz).
TEST(WireTest, HugeElementCountsDoNotWrapTheChunkCount) {
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  EXPECT_FALSE(ToKeyInfo(Entry(max, 0), 8192).ok());
  EXPECT_FALSE(ToKeyInfo(Entry(max - 5, 0), 2).ok());
  EXPECT_TRUE(ToKeyInfo(Entry(max, max / 8192 + 1), 8192).ok());
  EXPECT_TRUE(ToKeyInfo(Entry(max, max), 1).ok());
}

}  // namespace
}  // namespace rackhub::client::internal
