// rackhub::client::testing (rackhub/client/testing.h): Client::Connect with
// every lane dialed by the caller's LaneDialer, over connections that live on
// the caller's io_context (in-memory ones into an in-process hub).
//
// The production lane (lane.h) runs on the client's I/O thread; the caller's
// connection on `conn_io`'s thread. Two adapters join them:
//  - a Bridge is the caller's connection's FrameHandler on conn_io: it keeps
//    the hub's first frame for the dialer and posts everything after it to
//    the client's I/O thread;
//  - a ProxyConnection is the net::Connection the lane sees on the client's
//    I/O thread: frames from the Bridge go through the lane's AcceptHeader,
//    PayloadDestination and HandleFrame exactly as a byte-stream transport
//    delivers them; sends are copied and posted to conn_io.
// So the lane, its checks and its destinations are the production code; only
// the thread hop is this file's.
#include "rackhub/client/testing.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <utility>
#include <variant>

#include "client_impl.h"
#include "dialer.h"

namespace rackhub::client::testing {

namespace {

using Clock = std::chrono::steady_clock;
namespace asio = boost::asio;

class ProxyConnection;

// What the Bridge hands to the client's side: a frame, bytes sent, a close.
struct Frame {
  net::FrameHeader h;
  std::string body;
};
struct Sent {
  size_t bytes;
};
struct Closed {
  std::string why;
};
using Event = std::variant<Frame, Sent, Closed>;

class Bridge final : public net::FrameHandler, public std::enable_shared_from_this<Bridge> {
 public:
  // Dialing thread: waits for the hub's first frame (or a close).
  std::optional<Frame> WaitFirst(Clock::time_point deadline, const std::atomic<bool>* cancel,
                                 std::string* closed) {
    std::unique_lock lock(mu_);
    while (!first_ && closed_.empty() && Clock::now() < deadline &&
           !(cancel != nullptr && cancel->load())) {
      cv_.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(50)));
    }
    *closed = closed_;
    return first_;
  }

  // Client I/O thread: events go to `proxy` from now on (those that came
  // before are delivered first), until Detach.
  void Attach(ProxyConnection* proxy, asio::io_context* client_io);
  void Detach() {
    std::lock_guard lock(mu_);
    proxy_ = nullptr;
    client_io_ = nullptr;
  }

  // conn_io's thread.
  Verdict AcceptHeader(net::Connection&, const net::FrameHeader&) override {
    return Verdict::kAccept;
  }
  void HandleFrame(net::Connection&, const net::FrameHeader& h,
                   std::span<const std::byte> payload) override {
    Frame f{h, std::string(reinterpret_cast<const char*>(payload.data()), payload.size())};
    std::lock_guard lock(mu_);
    if (!first_) {
      first_ = std::move(f);
      cv_.notify_all();
      return;
    }
    Push(std::move(f));
  }
  void OnConnectionClosed(net::Connection&, const std::string& why) override {
    std::lock_guard lock(mu_);
    if (closed_.empty()) closed_ = why.empty() ? "closed" : why;
    cv_.notify_all();
    Push(Closed{why});
  }
  void OnBytesSent(net::Connection&, size_t bytes) override {
    std::lock_guard lock(mu_);
    if (attached_) Push(Sent{bytes});  // before: the dialer's HELLO
  }

 private:
  void Push(Event e);  // REQUIRES: mu_ held

  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Frame> first_;             // GUARDED_BY(mu_)
  std::string closed_;                     // GUARDED_BY(mu_)
  bool attached_ = false;                  // GUARDED_BY(mu_)
  std::deque<Event> early_;                // GUARDED_BY(mu_): before Attach
  ProxyConnection* proxy_ = nullptr;       // GUARDED_BY(mu_)
  asio::io_context* client_io_ = nullptr;  // GUARDED_BY(mu_)
  friend class ProxyConnection;
};

// The caller's connection and its Bridge: closing the connection on
// conn_io's thread when the link is dropped (adopted or not).
struct Link {
  Link(asio::io_context& io, std::shared_ptr<Bridge> b) : conn_io(io), bridge(std::move(b)) {}
  ~Link() {
    bridge->Detach();
    if (!conn) return;
    if (conn_io.get_executor().running_in_this_thread()) {
      conn->Close("client lane destroyed");
      return;
    }
    // The connection calls the Bridge (kept alive here) until it is closed.
    auto closed = std::make_shared<std::promise<void>>();
    std::future<void> done = closed->get_future();
    asio::post(conn_io, [c = conn, b = bridge, closed] {
      c->Close("client lane destroyed");
      closed->set_value();
    });
    done.wait_for(std::chrono::seconds(10));
  }
  asio::io_context& conn_io;
  std::shared_ptr<Bridge> bridge;
  std::shared_ptr<net::Connection> conn;
};

class ProxyConnection final : public net::Connection {
 public:
  ProxyConnection(std::shared_ptr<Link> link, asio::io_context* client_io,
                  net::FrameHandler* handler, net::ConnectionIdentity id)
      : link_(std::move(link)), client_io_(client_io), handler_(handler), id_(std::move(id)) {}
  ~ProxyConnection() override { link_->bridge->Detach(); }

  const net::ConnectionIdentity& id() const override { return id_; }
  bool open() const override { return open_; }
  void Start() override { link_->bridge->Attach(this, client_io_); }
  void SendShared(const net::FrameHeader& header, std::span<const std::byte> payload,
                  std::shared_ptr<const void> owner) override {
    // Copied now: the owner (and the caller's buffer) is released at once.
    SendOwned(header, std::string(reinterpret_cast<const char*>(payload.data()), payload.size()));
    owner.reset();
  }
  void SendOwned(const net::FrameHeader& header, std::string payload) override {
    if (!open_) return;
    asio::post(link_->conn_io, [link = link_, h = header, p = std::move(payload)]() mutable {
      if (link->conn->open()) link->conn->SendOwned(h, std::move(p));
    });
  }
  void SendError(net::WireError code, const std::string& text, uint64_t request_id,
                 bool fatal) override {
    if (!open_) return;
    asio::post(link_->conn_io, [link = link_, code, text, request_id, fatal] {
      link->conn->SendError(code, text, request_id, fatal);
    });
  }
  void Close(const std::string& why) override {
    if (!open_) return;
    open_ = false;
    asio::post(link_->conn_io, [link = link_, why] { link->conn->Close(why); });
    handler_->OnConnectionClosed(*this, why);
  }

  // Client I/O thread, posted by the Bridge.
  void Deliver(Event e) {
    if (!open_) return;
    if (auto* s = std::get_if<Sent>(&e)) {
      handler_->OnBytesSent(*this, s->bytes);
    } else if (auto* c = std::get_if<Closed>(&e)) {
      open_ = false;
      handler_->OnConnectionClosed(*this, c->why);
    } else if (!rejected_) {
      Frame& f = std::get<Frame>(e);
      // As a byte-stream transport delivers: header first, then the payload
      // in the handler's destination if it names one.
      const auto verdict = handler_->AcceptHeader(*this, f.h);
      if (verdict == Verdict::kReject) {
        rejected_ = true;
        return;
      }
      if (verdict == Verdict::kDiscard || !open_) return;
      const auto body = std::as_bytes(std::span(f.body.data(), f.body.size()));
      std::span<std::byte> dest;
      if (!body.empty()) dest = handler_->PayloadDestination(*this, f.h);
      if (dest.size() == body.size() && !body.empty()) {
        std::memcpy(dest.data(), body.data(), body.size());
        handler_->HandleFrame(*this, f.h, dest);
      } else {
        handler_->HandleFrame(*this, f.h, body);
      }
    }
  }

 private:
  using Verdict = net::FrameHandler::Verdict;

  std::shared_ptr<Link> link_;
  asio::io_context* client_io_;
  net::FrameHandler* handler_;
  net::ConnectionIdentity id_;
  bool open_ = true;
  bool rejected_ = false;
};

void Bridge::Attach(ProxyConnection* proxy, asio::io_context* client_io) {
  std::lock_guard lock(mu_);
  proxy_ = proxy;
  client_io_ = client_io;
  attached_ = true;
  std::deque<Event> early = std::exchange(early_, {});
  for (Event& e : early) Push(std::move(e));
}

void Bridge::Push(Event e) {
  if (!attached_) {
    early_.push_back(std::move(e));
    return;
  }
  if (client_io_ == nullptr) return;
  asio::post(*client_io_, [self = shared_from_this(), e = std::move(e)]() mutable {
    ProxyConnection* proxy;
    {
      std::lock_guard lock(self->mu_);
      proxy = self->proxy_;
    }
    if (proxy != nullptr) proxy->Deliver(std::move(e));
  });
}

}  // namespace

class ScopedLaneDialer::Connector final : public internal::Dialer {
 public:
  Connector(asio::io_context& io, LaneDialer dial) : io_(io), dial_(std::move(dial)) {}

  const char* transport() const override { return "memory"; }

  Result<internal::DialedLane> Dial(uint32_t lane, const std::string& hello,
                                    Clock::time_point deadline,
                                    const std::atomic<bool>* cancel) override {
    internal::DialedLane out;
    out.lanes_share_link = true;  // a byte stream like TCP's (the in-memory transport)
    out.where = "hub (test dialer) lane " + std::to_string(lane);
    auto link = std::make_shared<Link>(io_, std::make_shared<Bridge>());
    net::FrameHeader h;
    h.opcode = net::Opcode::kHello;
    h.payload_bytes = static_cast<uint32_t>(hello.size());
    link->conn = dial_(h, hello, io_, link->bridge.get());
    if (!link->conn) return Unavailable(out.where + ": the dialer made no connection");
    std::string closed;
    std::optional<Frame> first = link->bridge->WaitFirst(deadline, cancel, &closed);
    if (!first) {
      return Unavailable(
          out.where + ": " +
          (closed.empty() ? "timed out waiting for WELCOME" : "connection closed: " + closed));
    }
    if (const Status bad = net::CheckHeader(first->h); !bad.ok()) {
      return Unavailable(out.where + ": invalid reply to HELLO: " + bad.message());
    }
    out.reply = first->h;
    out.body = std::move(first->body);
    if (out.reply.opcode != net::Opcode::kWelcome) return out;
    out.adopt = [link, where = out.where](
                    asio::io_context& client_io,
                    net::FrameHandler* handler) -> std::shared_ptr<net::Connection> {
      net::ConnectionIdentity id;
      id.peer = where;
      return std::make_shared<ProxyConnection>(link, &client_io, handler, std::move(id));
    };
    return out;
  }

  std::shared_ptr<internal::Dialer> previous;

 private:
  asio::io_context& io_;
  LaneDialer dial_;
};

ScopedLaneDialer::ScopedLaneDialer(asio::io_context& io, LaneDialer dial) {
  auto connector = std::make_shared<Connector>(io, std::move(dial));
  connector->previous = internal::ThreadTestDialer();
  internal::ThreadTestDialer() = connector;
  connector_ = std::move(connector);
}

ScopedLaneDialer::~ScopedLaneDialer() {
  internal::ThreadTestDialer() = std::move(connector_->previous);
}

std::unique_ptr<Client> ConnectThrough(const Options& options, asio::io_context& io,
                                       LaneDialer dial, Error* error) {
  ScopedLaneDialer scope(io, std::move(dial));
  return Client::Connect(options, error);
}

}  // namespace rackhub::client::testing
