// The registry tests' shared part (registry_tenant_test.cc: tokens, tenants,
// the hub secret; registry_key_test.cc: keys, quotas, optimizers): a
// fixture with a Registry of 2 lanes and 1 KiB chunks, and status checks.
// Test-only; one thread unless a test says otherwise.
#pragma once

#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "key_memory.h"
#include "rackhub/common/log_safe.h"
#include "registry.h"
#include "token.h"

namespace rackhub::server::registry_testing {

using aggregation::ElementType;
using aggregation::OptimizerConfig;
using aggregation::OptimizerType;

// Hub memory of a key of the fixture's default tenant (4 workers, 256-element
// chunks, sgd, fp32, one rack).
inline uint64_t SgdMemory(uint64_t elements) {
  return KeyMemoryBytes(elements, 256, 4, OptimizerType::kSgd, ElementType::kFp32, {});
}

inline bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// Checks the code of a Status and that its message starts with `prefix`.
#define EXPECT_STATUS(expr, want_code, prefix)                               \
  do {                                                                       \
    const Status st_ = (expr);                                               \
    EXPECT_EQ(st_.code(), want_code) << st_.message();                       \
    EXPECT_TRUE(StartsWith(st_.message(), prefix)) << st_.message();         \
  } while (0)
#define EXPECT_OK(expr) EXPECT_STATUS(expr, StatusCode::kOk, "")


class RegistryTest : public ::testing::Test {
 protected:
  static TenantSpec Spec(const std::string& name, uint32_t workers = 4, uint32_t chunk = 0) {
    TenantSpec s;
    s.name = name;
    s.workers_per_rack = workers;
    s.chunk_bytes = chunk;
    return s;
  }

  static KeySpec Key(const std::string& tenant, const std::string& name, uint64_t elements,
                     InitMode init = InitMode::kZeros) {
    KeySpec k;
    k.tenant = tenant;
    k.name = name;
    k.elements = elements;
    k.init = init;
    return k;
  }

  // Creates a tenant with 1 KiB chunks (256 elements each); returns its token.
  std::string MakeTenant(const std::string& name, Quotas quotas = {}) {
    TenantSpec s = Spec(name, 4, 1024);
    s.quotas = quotas;
    TenantInfo info;
    std::string token;
    EXPECT_OK(r_.CreateTenant(s, &info, &token));
    return token;
  }

  KeyInfo MustCreateKey(const KeySpec& spec) {
    KeyInfo k;
    EXPECT_OK(r_.CreateKey(spec, &k));
    return k;
  }

  TenantInfo MustGetTenant(const std::string& name) {
    TenantInfo info;
    EXPECT_OK(r_.GetTenant(name, &info));
    return info;
  }

  // Counters and key names of a tenant, to check that a failed call changed nothing.
  std::string Usage(const std::string& tenant) {
    const TenantInfo t = MustGetTenant(tenant);
    std::vector<KeyInfo> keys;
    EXPECT_OK(r_.ListKeys(tenant, &keys));
    std::string names;
    for (const auto& k : keys) names += k.name + ",";
    return std::to_string(t.key_count) + "/" + std::to_string(t.parameter_bytes) + "/" +
           std::to_string(t.chunk_count) + "/" + names;
  }

  Registry r_{/*lanes=*/2, TenantDefaults{}};
  TenantInfo info_;    // scratch outputs
  std::string token_;
  KeyInfo key_;
};

}  // namespace rackhub::server::registry_testing
