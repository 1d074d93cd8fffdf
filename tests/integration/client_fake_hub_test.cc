// librackhub against a fake hub that misbehaves (garbage, early EOF, wrong
// sizes, silence): every pending ticket fails, nothing hangs.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rackhub/client/client.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/asio.h"
#include "rackhub/net/frame.h"

namespace rackhub {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using client::Client;
using client::Error;
using client::ErrorCode;
using client::Options;

// A scripted fake hub (one lane) for what the real one never does: garbage,
// silence, a dropped connection. Answers HELLO with a WELCOME announcing key
// 1 ("k", 6 fp32 elements, chunks of 4), reads one frame, then misbehaves.
class FakeHub {
 public:
  enum class Mode { kGarbage, kSilent, kEof, kWrongSize };
  explicit FakeHub(Mode mode) : acceptor_(io_, {asio::ip::make_address("127.0.0.1"), 0}) {
    port_ = acceptor_.local_endpoint().port();
    thread_ = std::thread([this, mode] { Serve(mode); });
  }
  ~FakeHub() {
    stop_ = true;
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    thread_.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  using tcp = asio::ip::tcp;
  static net::FrameHeader ReadFrame(tcp::socket& s, std::string* payload) {
    std::array<std::byte, net::kHeaderBytes> hb;
    asio::read(s, asio::buffer(hb));
    const auto h = net::DecodeHeader(hb);
    payload->resize(h.payload_bytes);
    asio::read(s, asio::buffer(*payload));
    return h;
  }
  static void WriteFrame(tcp::socket& s, net::FrameHeader h, const std::string& payload) {
    std::array<std::byte, net::kHeaderBytes> hb;
    h.payload_bytes = static_cast<uint32_t>(payload.size());
    net::EncodeHeader(h, hb);
    asio::write(s, std::array<asio::const_buffer, 2>{asio::buffer(hb), asio::buffer(payload)});
  }
  void Serve(Mode mode) {
    try {
      tcp::socket s(io_);
      acceptor_.accept(s);
      std::string payload;
      ReadFrame(s, &payload);  // HELLO
      data::v1::Welcome w;
      w.set_tenant_handle(7);
      w.set_chunk_elements(4);
      w.set_lanes(1);
      w.set_workers(1);
      auto* k = w.add_keys();
      k->set_id(1);
      k->set_name("k");
      k->set_elements(6);
      k->set_dtype(admin::v1::FP32);
      k->set_chunk_count(2);
      auto* k2 = w.add_keys();  // a second key: two tickets pending at once
      k2->set_id(2);
      k2->set_name("k2");
      k2->set_elements(6);
      k2->set_dtype(admin::v1::FP32);
      k2->set_chunk_count(2);
      net::FrameHeader h;
      h.opcode = net::Opcode::kWelcome;
      WriteFrame(s, h, w.SerializeAsString());
      const auto push = ReadFrame(s, &payload);
      if (mode == Mode::kGarbage) {
        const std::string junk(64, 'x');
        asio::write(s, asio::buffer(junk));
      } else if (mode == Mode::kEof) {
        s.close();
      } else if (mode == Mode::kWrongSize) {
        net::FrameHeader r = push;
        r.opcode = net::Opcode::kParams;
        WriteFrame(s, r, std::string(12, '\0'));  // chunk 0 holds 4 floats, not 3
      }
      while (!stop_) std::this_thread::sleep_for(10ms);
    } catch (const std::exception&) {
    }
  }
  asio::io_context io_;
  tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(ClientFakeHubTest, MisbehavingHubFailsTicketsWithoutHanging) {
  const struct {
    FakeHub::Mode mode;
    ErrorCode want;
  } cases[] = {{FakeHub::Mode::kGarbage, ErrorCode::kConnectionLost},
               {FakeHub::Mode::kEof, ErrorCode::kConnectionLost},
               {FakeHub::Mode::kWrongSize, ErrorCode::kConnectionLost},
               {FakeHub::Mode::kSilent, ErrorCode::kTimeout}};
  for (const auto& c : cases) {
    FakeHub hub(c.mode);
    client::Options o;
    o.hub = hub.address();
    o.tenant = "t";
    o.op_timeout = 300ms;
    o.shm = client::Shm::kOff;  // the fake hub answers one TCP connection, not a probe
    client::Error e;
    auto cl = Client::Connect(o, &e);
    ASSERT_NE(cl, nullptr) << e.message;
    ASSERT_EQ(cl->FindKey("k"), 1u);
    std::vector<float> g(6, 1.0f), out(6, -1.0f);
    const auto start = std::chrono::steady_clock::now();
    e = cl->Wait(cl->PushPull(1, g, out));
    EXPECT_EQ(e.code, c.want) << e.message;
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
    if (c.want == ErrorCode::kConnectionLost) {
      EXPECT_NE(e.message.find("lane 0"), std::string::npos) << e.message;
      // Later calls fail at once.
      EXPECT_EQ(cl->Wait(cl->Pull(1, out)).code, ErrorCode::kConnectionLost);
    }
  }
}

// The client keeps one deadline timer for all tickets (operation_io.cc): a
// ticket started while another is pending must time out at its own
// deadline, not at the earlier one, and a ticket started after the queue
// ran empty must still time out.
TEST(ClientFakeHubTest, EachTicketTimesOutAtItsOwnDeadline) {
  FakeHub hub(FakeHub::Mode::kSilent);
  client::Options o;
  o.hub = hub.address();
  o.tenant = "t";
  o.op_timeout = 400ms;
  o.shm = client::Shm::kOff;
  client::Error e;
  auto cl = Client::Connect(o, &e);
  ASSERT_NE(cl, nullptr) << e.message;
  ASSERT_EQ(cl->FindKey("k2"), 2u);
  std::vector<float> g(6, 1.0f), out1(6, -1.0f), out2(6, -1.0f);
  using Clock = std::chrono::steady_clock;
  const auto a_start = Clock::now();
  const client::Ticket a = cl->PushPull(1, g, out1);
  // The second ticket starts while the first is pending, 150 ms (or more)
  // later; only the order matters, the checks below are lower bounds.
  EXPECT_EQ(cl->WaitFor(a, 150ms).code, ErrorCode::kTimeout);
  const auto b_start = Clock::now();
  const client::Ticket b = cl->PushPull(2, g, out2);
  e = cl->Wait(a);
  EXPECT_EQ(e.code, ErrorCode::kTimeout) << e.message;
  EXPECT_NE(e.message.find("timed out after 400 ms"), std::string::npos) << e.message;
  EXPECT_GE(Clock::now() - a_start, 400ms);
  e = cl->Wait(b);
  const auto b_end = Clock::now();
  EXPECT_EQ(e.code, ErrorCode::kTimeout) << e.message;
  EXPECT_GE(b_end - b_start, 400ms);
  EXPECT_LT(b_end - b_start, 10s);
  // Every deadline passed: a new ticket re-arms the timer.
  const auto c_start = Clock::now();
  e = cl->Wait(cl->Pull(1, out1));
  EXPECT_EQ(e.code, ErrorCode::kTimeout) << e.message;
  EXPECT_GE(Clock::now() - c_start, 400ms);
  EXPECT_LT(Clock::now() - c_start, 10s);
}

}  // namespace
}  // namespace rackhub
