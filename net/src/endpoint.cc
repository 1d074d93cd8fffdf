#include "rackhub/net/endpoint.h"

#include <arpa/inet.h>

#include <charconv>

#include <fmt/format.h>

namespace rackhub::net {

std::string Endpoint::ToString() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

bool Endpoint::IsLoopback() const {
  if (host == "localhost" || host == "::1") return true;
  in_addr a4{};
  if (inet_pton(AF_INET, host.c_str(), &a4) == 1) {
    return (ntohl(a4.s_addr) >> 24) == 127;
  }
  return false;
}

Result<Endpoint> ParseEndpoint(std::string_view text) {
  Endpoint ep;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return InvalidArgument(fmt::format("expected [IPV6]:PORT, got '{}'", text));
    }
    ep.host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
    in6_addr a6{};
    if (inet_pton(AF_INET6, ep.host.c_str(), &a6) != 1) {
      return InvalidArgument(fmt::format("'{}' is not an IPv6 address", ep.host));
    }
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos || colon == 0) {
      return InvalidArgument(fmt::format("expected HOST:PORT, got '{}'", text));
    }
    ep.host = std::string(text.substr(0, colon));
    if (ep.host.find(':') != std::string::npos) {
      return InvalidArgument(
          fmt::format("IPv6 addresses need brackets: [ADDR]:PORT, got '{}'", text));
    }
    port_text = text.substr(colon + 1);
  }
  for (char c : ep.host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == ':' || c == '_';
    if (!ok) {
      return InvalidArgument(fmt::format("host '{}' contains an invalid character", ep.host));
    }
  }
  unsigned port = 0;
  const auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || ptr != port_text.data() + port_text.size() ||
      port > 65535) {
    return InvalidArgument(fmt::format("port '{}' is not a number in 0..65535", port_text));
  }
  ep.port = static_cast<uint16_t>(port);
  return ep;
}

}  // namespace rackhub::net
