// HOST:PORT endpoints as written in configs and flags.
//
// Plain values, no I/O. Thread-safe (no shared state). Errors are
// rackhub::Status values (rackhub/common/status.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "rackhub/common/status.h"

namespace rackhub::net {

struct Endpoint {
  std::string host;  // IPv4 literal, IPv6 literal (without brackets) or a name
  uint16_t port = 0;

  // "host:port", with brackets around IPv6 literals.
  std::string ToString() const;
  // True for 127.0.0.0/8, ::1 and "localhost".
  bool IsLoopback() const;
};

// Parses "HOST:PORT" or "[V6]:PORT"; port 0 means "pick an ephemeral port".
// INVALID_ARGUMENT otherwise, with a reason that names the bad part but not
// the field (callers add it: status.WithContext("admin.listen")).
Result<Endpoint> ParseEndpoint(std::string_view text);

}  // namespace rackhub::net
