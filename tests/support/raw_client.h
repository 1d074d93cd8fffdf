// Test support: a blocking raw-frame TCP client of the rackhub data plane,
// for tests that send exactly the bytes they mean (malformed ones included).
// Single-threaded use from a test body.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>

#include "data_link.h"
#include "rackhub/net/frame.h"

namespace rackhub::testing {

using net::FrameHeader;
using net::Opcode;
using net::WireError;

// A blocking socket client speaking raw frames. Receives time out after 5 s.
class RawClient final : public DataLink {
 public:
  explicit RawClient(const std::string& address) {
    const auto colon = address.rfind(':');
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
    inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0) << strerror(errno);
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  // Takes over a connected socket (e.g. one the test accepted).
  struct Adopt {
    int fd;
  };
  explicit RawClient(Adopt a) : fd_(a.fd) {}
  ~RawClient() {
    if (fd_ >= 0) close(fd_);
  }

  bool SupportsRawBytes() const override { return true; }
  void SendRaw(const std::string& bytes) override {
    ASSERT_EQ(send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  void Send(FrameHeader h, const std::string& payload = "") override {
    h.payload_bytes = static_cast<uint32_t>(payload.size());
    std::array<std::byte, net::kHeaderBytes> buf;
    net::EncodeHeader(h, buf);
    SendRaw(std::string(reinterpret_cast<const char*>(buf.data()), buf.size()) + payload);
  }
  // Next frame, or nullopt on EOF / timeout.
  std::optional<Frame> Receive(std::chrono::milliseconds timeout = kReceiveTimeout) override {
    std::string hdr;
    if (!ReadExact(net::kHeaderBytes, &hdr, timeout)) return std::nullopt;
    Frame f;
    f.h = net::DecodeHeader(std::span<const std::byte, net::kHeaderBytes>(
        reinterpret_cast<const std::byte*>(hdr.data()), net::kHeaderBytes));
    if (!ReadExact(f.h.payload_bytes, &f.payload, timeout)) return std::nullopt;
    return f;
  }
  // True when the server closed the connection (EOF) within `timeout`.
  bool ClosedByPeer(std::chrono::milliseconds timeout = kReceiveTimeout) override {
    std::string ignored;
    while (ReadExact(1, &ignored, timeout)) {
    }
    return eof_;
  }

 private:
  bool ReadExact(size_t n, std::string* out, std::chrono::milliseconds timeout) {
    out->assign(n, '\0');
    size_t got = 0;
    while (got < n) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
      const ssize_t r = recv(fd_, out->data() + got, n - got, 0);
      if (r <= 0) {
        eof_ = true;
        return false;
      }
      got += static_cast<size_t>(r);
    }
    return true;
  }
  int fd_ = -1;
  bool eof_ = false;
};

}  // namespace rackhub::testing
