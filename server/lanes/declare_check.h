// The checks a worker's DECLARE payload passes before it reaches the
// registry (WorkerProtocol::OnDeclare): the KeyDeclaration message, its
// dtype and optimizer, turned into the KeySpec Registry::DeclareKey takes
// (which checks the name, size and quotas); and the way back, a key's
// declaration (what a KEY_BIND carries to a hub that does not have the key,
// RackExchange::TryBind). Pure; any thread.
#pragma once

#include <span>
#include <string>

#include "rackhub/net/frame.h"
#include "registry.h"

namespace rackhub::data::v1 {
class KeyDeclaration;
}

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

// The declaration that makes `key` (its shape, dtype, init and its first
// optimizer, explicitly; a dense key's top-k ratio). No participant set:
// keys spanning racks have none.
void KeyDeclarationOf(const KeyInfo& key, data::v1::KeyDeclaration* out);

}  // namespace rackhub::server
