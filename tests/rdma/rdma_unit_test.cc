// net/rdma pieces that need no verbs device: the private-data descriptor,
// transport names and the locked-memory check.
#include <gtest/gtest.h>

#include "process.h"

#include "rackhub/net/rdma/channel.h"
#include "rackhub/net/rdma/device.h"

namespace rackhub::net::rdma {
namespace {

TEST(RdmaDescriptorTest, RoundTripsAndRejectsGarbage) {
  const RingDescriptor d{0x7f00'1234'5000ull, 0xabcd, 4096, 3};
  std::array<std::byte, kPrivateDataBytes> bytes{};
  EncodeDescriptor(d, &bytes);
  const Result<RingDescriptor> back = DecodeDescriptor(bytes.data(), bytes.size());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->addr, d.addr);
  EXPECT_EQ(back->rkey, d.rkey);
  EXPECT_EQ(back->slots, d.slots);
  EXPECT_EQ(back->lane, d.lane);
  // Padding after the descriptor is allowed (rdma_accept(3) may pad).
  std::array<std::byte, 56> padded{};
  std::copy(bytes.begin(), bytes.end(), padded.begin());
  EXPECT_TRUE(DecodeDescriptor(padded.data(), padded.size()).ok());
  EXPECT_FALSE(DecodeDescriptor(bytes.data(), bytes.size() - 1).ok());
  EXPECT_FALSE(DecodeDescriptor(nullptr, 0).ok());
  bytes[0] = std::byte{0};
  const Result<RingDescriptor> garbage = DecodeDescriptor(bytes.data(), bytes.size());
  EXPECT_FALSE(garbage.ok());
  EXPECT_EQ(garbage.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(garbage.status().message().find("descriptor"), std::string::npos);
}

TEST(RdmaTransportTest, Names) {
  EXPECT_EQ(ParseTransport("tcp"), Transport::kTcp);
  EXPECT_EQ(ParseTransport("rdma"), Transport::kRdma);
  EXPECT_EQ(ParseTransport("auto"), Transport::kAuto);
  EXPECT_FALSE(ParseTransport("roce").has_value());
}

TEST(RdmaMemlockTest, NamesTheLimitAndTheFix) {
  MemlockStatus s;
  s.limit = 8u << 20;
  EXPECT_TRUE(CheckMemlock(8u << 20, s, "x").ok());
  const Status over = CheckMemlock(9u << 20, s, "transport rdma");
  EXPECT_EQ(over.code(), StatusCode::kResourceExhausted) << over.ToString();
  const std::string& e = over.message();
  EXPECT_EQ(e.rfind("transport rdma registers ", 0), 0u) << e;
  EXPECT_NE(e.find("RLIMIT_MEMLOCK"), std::string::npos) << e;
  EXPECT_NE(e.find("LimitMEMLOCK=infinity"), std::string::npos) << e;
  EXPECT_NE(e.find("8192 KiB"), std::string::npos) << e;
  s.cap_ipc_lock = true;
  EXPECT_TRUE(CheckMemlock(1ull << 40, s, "x").ok());
  s.cap_ipc_lock = false;
  s.limit = UINT64_MAX;
  EXPECT_TRUE(CheckMemlock(1ull << 40, s, "x").ok());
}

TEST(RdmaChannelTest, RegisteredBytesCoversBothRings) {
  ChannelOptions o;
  o.ring_bytes = 1u << 20;
  EXPECT_EQ(Channel::RegisteredBytes(o), 2u << 20);
}

// data.transport = rdma must fail start-up with a clear message when the
// device is missing (no device at all, or not the one named).
TEST(RdmaStartUpTest, MissingDeviceFailsClearly) {
  using rackhub::testing::BinPath;
  using rackhub::testing::RunCommand;
  std::vector<std::string> argv = {BinPath("rackhubd"), "--transport", "rdma", "--admin-listen",
                                   "127.0.0.1:0", "--data-listen", "127.0.0.1:0", "--in-memory",
                                   "--metrics-listen", "127.0.0.1:0"};
  std::string expect = "no RDMA verbs device";
  if (DevicePresent()) {
    argv.insert(argv.end(), {"--rdma-device", "nonexistent0"});
    expect = "no active RDMA device named 'nonexistent0'";
  }
  const auto r = RunCommand(argv, "", std::chrono::seconds(20));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
}

}  // namespace
}  // namespace rackhub::net::rdma
