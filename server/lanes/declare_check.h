// The checks a worker's DECLARE payload passes before it reaches the
// registry (WorkerProtocol::OnDeclare): the KeyDeclaration message, its
// dtype and optimizer, turned into the KeySpec Registry::DeclareKey takes
// (which checks the name, size and quotas). Pure; any thread.
#pragma once

#include <span>
#include <string>

#include "rackhub/net/frame.h"
#include "registry.h"

namespace rackhub::server {

struct DeclareCheck {
  bool ok = false;
  // When !ok: fatal (MALFORMED: not a KeyDeclaration; the connection closes)
  // or not (INVALID_ARGUMENT naming the field), and the text.
  bool fatal = false;
  net::WireError code = net::WireError::kMalformed;
  std::string text;
  KeySpec spec;  // when ok
};

// `tenant`: the name of the tenant the connection belongs to.
DeclareCheck CheckDeclare(std::span<const std::byte> payload, const std::string& tenant);

}  // namespace rackhub::server
