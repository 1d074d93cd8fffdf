// Test support: a blocking HTTP/1.1 GET over loopback TCP (for /metrics and
// Prometheus's HTTP API), with optional basic auth. Connection: close; the
// response is read to EOF. Single-threaded use; no TLS.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

namespace rackhub::testing {

struct HttpResponse {
  int status = 0;  // 0: no response (connect failed, timeout, garbage)
  std::string headers;
  std::string body;
};

inline std::string Base64(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()),
                                static_cast<int>(in.size()));
  out.resize(n);
  return out;
}

// `address` is IPv4 HOST:PORT; `user_password` "user:password" adds basic auth.
inline HttpResponse HttpGet(const std::string& address, const std::string& path,
                            const std::string& user_password = "",
                            std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  HttpResponse r;
  const auto colon = address.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  if (inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr) != 1) return r;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return r;
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    close(fd);
    return r;
  }
  std::string req = "GET " + path + " HTTP/1.1\r\nHost: " + address + "\r\nConnection: close\r\n";
  if (!user_password.empty()) req += "Authorization: Basic " + Base64(user_password) + "\r\n";
  req += "\r\n";
  if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return r;
  }
  std::string all;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[65536];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    all.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const auto end = all.find("\r\n\r\n");
  if (all.rfind("HTTP/1.", 0) != 0 || end == std::string::npos) return r;
  r.status = std::atoi(all.c_str() + all.find(' ') + 1);
  r.headers = all.substr(0, end);
  r.body = all.substr(end + 4);
  // civetweb answers /metrics with chunked encoding: undo it.
  if (r.headers.find("Transfer-Encoding: chunked") != std::string::npos ||
      r.headers.find("transfer-encoding: chunked") != std::string::npos) {
    std::string body;
    size_t pos = 0;
    while (pos < r.body.size()) {
      const auto eol = r.body.find("\r\n", pos);
      if (eol == std::string::npos) break;
      const size_t len = std::stoul(r.body.substr(pos, eol - pos), nullptr, 16);
      if (len == 0) break;
      body += r.body.substr(eol + 2, len);
      pos = eol + 2 + len + 2;
    }
    r.body = body;
  }
  return r;
}

}  // namespace rackhub::testing
