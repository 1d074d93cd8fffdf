// Registry internals shared by registry.cc (tenants), registry_keys.cc (keys)
// and registry_reconcile.cc (applying a store's contents): one tenant's state
// (guarded by Registry::mu_) and the API's message helpers.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "rackhub/aggregation/chunk_layout.h"
#include "rackhub/aggregation/optimizer_config.h"
#include "rackhub/common/log_safe.h"
#include "rackhub/common/status.h"
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
  // Keys deleted since this process loaded the tenant, by id: name and
  // chunk range. Their ids and chunks are never given again (AdoptKey
  // refuses them: a peer's KEY_BIND kept from before must not bring one
  // back).
  struct Deleted {
    std::string name;
    uint64_t first_chunk = 0, chunk_count = 0;
  };
  std::map<uint32_t, Deleted> deleted;
  void NoteDeleted(const KeyInfo& k) {
    deleted[k.id] = {k.name, k.placement.first_chunk, k.placement.chunk_count};
  }
  // Shared stores: the revisions of the tenant's row and of its keys' rows.
  int64_t revision = 0;
  std::map<uint32_t, int64_t> key_revisions;  // by id

  StoredTenant Row() const {
    return {info, token, next_key_id, layout.next_chunk(), revision};
  }

  Tenant(TenantInfo i, TokenHash t, aggregation::ChunkLayout l)
      : info(std::move(i)), token(t), layout(std::move(l)) {}
};

// Names in messages come from clients: escaped and truncated (log_safe.h).
inline std::string Quoted(const std::string& s) { return QuoteForLog(s); }

inline Status CheckOptimizer(const char* field, aggregation::OptimizerConfig* opt) {
  // "<field>.<optimizer field>: ...", not WithContext's "<field>: ...".
  if (Status s = aggregation::NormalizeOptimizer(opt); !s.ok()) {
    return InvalidArgument(std::string(field) + "." + s.message());
  }
  return Status::Ok();
}

inline Status TenantNotFound(const std::string& name) {
  return NotFound("tenant: " + Quoted(name) + " does not exist");
}

}  // namespace rackhub::server
