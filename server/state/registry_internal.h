// Registry internals shared by registry.cc (the API) and
// registry_reconcile.cc (applying a store's contents): one tenant's state.
// Guarded by Registry::mu_.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "rackhub/aggregation/chunk_layout.h"
#include "registry.h"
#include "registry_backend.h"
#include "token.h"

namespace rackhub::server {

struct Registry::Tenant {
  TenantInfo info;
  TokenHash token;
  aggregation::ChunkLayout layout;
  std::map<std::string, KeyInfo> keys;  // by name
  std::map<uint32_t, std::string> key_names;  // by id
  uint32_t next_key_id = 1;
  // Shared stores: the revisions of the tenant's row and of its keys' rows.
  int64_t revision = 0;
  std::map<uint32_t, int64_t> key_revisions;  // by id

  StoredTenant Row() const {
    return {info, token, next_key_id, layout.next_chunk(), revision};
  }

  Tenant(TenantInfo i, TokenHash t, aggregation::ChunkLayout l)
      : info(std::move(i)), token(t), layout(std::move(l)) {}
};

}  // namespace rackhub::server
