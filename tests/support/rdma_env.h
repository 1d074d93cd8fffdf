// Test support: is there an RDMA verbs device to test on, and which IPv4
// address reaches it? Shared by every test with RDMA instances.
// Thread-safe (reads sysfs and the interface list).
#pragma once

#include <string>

namespace rackhub::testing {

// The IPv4 address of the first RDMA device's network interface
// (/sys/class/infiniband/DEV/ports/1/gid_attrs/ndevs/), or
// $RACKHUB_TEST_RDMA_IP; "" if none.
std::string RdmaAddress();
// True with *ip set when there is a usable device; else false with *why
// (for GTEST_SKIP).
bool HaveRdma(std::string* ip, std::string* why);

}  // namespace rackhub::testing
