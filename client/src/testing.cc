// rackhub::client::testing (rackhub/client/testing.h): Client::Connect with
// every lane a ConnectionLane made by the caller's dialer.
#include "rackhub/client/testing.h"

#include <utility>
#include <vector>

#include "client_impl.h"
#include "connection_lane.h"

namespace rackhub::client::testing {

class ScopedLaneDialer::Connector final : public internal::LaneConnector {
 public:
  Connector(boost::asio::io_context& io, LaneDialer dial) : io_(io), dial_(std::move(dial)) {}

  // The same sequence as Client::Impl::Connect over TCP: lane 0 first, then
  // the lane count from its WELCOME.
  Error ConnectLanes(Client::Impl& impl, std::chrono::steady_clock::time_point deadline) override {
    std::vector<std::unique_ptr<internal::LaneLink>> lanes;
    uint32_t lane_count = 1;
    for (uint32_t lane = 0; lane < lane_count; ++lane) {
      const std::string where = "hub (test dialer) lane " + std::to_string(lane);
      auto link = std::make_unique<internal::ConnectionLane>(&impl, lane, io_);
      Result<internal::ConnectionLane::HandshakeReply> reply =
          link->Handshake(dial_, impl.HelloPayload(lane), deadline);
      if (!reply.ok()) {
        Error e;
        e.code = ErrorCode::kConnectFailed;
        e.message = where + ": " + reply.status().message();
        return e;
      }
      std::string welcome;
      if (Error e = impl.CheckHelloReply(where, reply->header, std::move(reply->body), &welcome);
          !e.ok()) {
        return e;
      }
      if (Error e = impl.AcceptWelcome(lane, welcome, &lane_count); !e.ok()) return e;
      lanes.push_back(std::move(link));
    }
    impl.StartIo(std::move(lanes), "memory");
    return {};
  }

  internal::LaneConnector* previous = nullptr;

 private:
  boost::asio::io_context& io_;
  LaneDialer dial_;
};

ScopedLaneDialer::ScopedLaneDialer(boost::asio::io_context& io, LaneDialer dial)
    : connector_(std::make_unique<Connector>(io, std::move(dial))) {
  connector_->previous = internal::ThreadLaneConnector();
  internal::ThreadLaneConnector() = connector_.get();
}

ScopedLaneDialer::~ScopedLaneDialer() { internal::ThreadLaneConnector() = connector_->previous; }

std::unique_ptr<Client> ConnectThrough(const Options& options, boost::asio::io_context& io,
                                       LaneDialer dial, Error* error) {
  ScopedLaneDialer scope(io, std::move(dial));
  return Client::Connect(options, error);
}

}  // namespace rackhub::client::testing
