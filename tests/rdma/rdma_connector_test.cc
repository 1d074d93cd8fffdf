// net::MakeRdmaConnector's contract (net/rdma/connector.h) on its failure
// paths, which need no verbs device (label `unit`; with a device the
// connects still fail: the address is TEST-NET-1, RFC 5737):
//  - Connect returns at once; `done` runs later, exactly once, on the
//    thread running the io_context, with a null connection and the reason;
//  - a connector destroyed with connects in flight does not crash, never
//    calls their `done`, and leaves nothing to run on the io_context that
//    could touch it.
#include <atomic>
#include <iostream>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "rackhub/net/asio.h"
#include "rackhub/net/rdma/connector.h"

namespace rackhub {
namespace {

using namespace std::chrono_literals;

// Nobody answers there; connects fail (no device, no route) or time out.
const net::Endpoint kNowhere{"192.0.2.1", 7703};

TEST(RdmaConnectorTest, FailureCallsDoneOnceOnTheIoThread) {
  boost::asio::io_context io;
  auto connector = net::MakeRdmaConnector({}, 500ms);
  EXPECT_STREQ(connector->name(), "rdma");
  int calls = 0;
  std::shared_ptr<net::Connection> got;
  std::string error;
  std::thread::id ran_on;
  net::ConnectionIdentity id;
  id.hub = true;
  id.lane = 1;
  connector->Connect(io, kNowhere, nullptr, id,
                     [&](Result<std::shared_ptr<net::Connection>> conn) {
                       ++calls;
                       if (conn.ok()) {
                         got = *std::move(conn);
                       } else {
                         EXPECT_EQ(conn.status().code(), StatusCode::kUnavailable);
                         error = conn.status().message();
                       }
                       ran_on = std::this_thread::get_id();
                     });
  EXPECT_EQ(calls, 0) << "done ran inside Connect";
  // The helper thread posts back; run io here until it did (bounded).
  auto guard = boost::asio::make_work_guard(io);
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (calls == 0 && std::chrono::steady_clock::now() < deadline) io.run_for(50ms);
  io.run_for(200ms);  // nothing else may follow
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(got);
  EXPECT_NE(error.find("192.0.2.1:7703"), std::string::npos) << error;
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  std::cout << "connect failed as expected: " << error << "\n";
}

TEST(RdmaConnectorTest, DestroyedWithConnectsInFlightCallsNothing) {
  boost::asio::io_context io;
  auto calls = std::make_shared<std::atomic<int>>(0);
  {
    auto connector = net::MakeRdmaConnector({}, 500ms);
    for (uint32_t lane = 0; lane < 3; ++lane) {
      net::ConnectionIdentity id;
      id.lane = lane;
      connector->Connect(io, kNowhere, nullptr, id,
                         [calls](Result<std::shared_ptr<net::Connection>>) {
                           ++*calls;
                         });
    }
    // Destroyed at once, io not run yet: some helpers may have posted, some
    // are still connecting; the destructor waits for the latter.
  }
  const auto t0 = std::chrono::steady_clock::now();
  io.run_for(500ms);
  EXPECT_EQ(calls->load(), 0) << "done ran after the connector was destroyed";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

}  // namespace
}  // namespace rackhub
