// Unit tests for the registry's tenants and data-plane tokens: names,
// defaults, quotas of tenants, escaped client text in messages, the hub
// secret file. Keys and their quotas: registry_key_test.cc.

#include "registry_test.h"

namespace rackhub::server {
namespace {

using namespace registry_testing;

// ---------------------------------------------------------------------------
// Tokens

TEST(TokenTest, GeneratedFormatAndUniqueness) {
  std::set<std::string> seen;
  for (int n = 0; n < 1000; ++n) {
    const std::string t = GenerateToken();
    ASSERT_EQ(t.size(), 4u + 64u) << t;
    ASSERT_TRUE(StartsWith(t, "rhk_")) << t;
    ASSERT_EQ(t.find_first_not_of("0123456789abcdef", 4), std::string::npos) << t;
    seen.insert(t);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

TEST(TokenTest, HashMatchesOnlyTheRightToken) {
  const std::string token = GenerateToken();
  const TokenHash h = HashToken(token);
  EXPECT_TRUE(TokenMatches(token, h));
  EXPECT_FALSE(TokenMatches(GenerateToken(), h));
  EXPECT_FALSE(TokenMatches(token.substr(0, token.size() - 1), h));
  EXPECT_FALSE(TokenMatches(token + "0", h));
  EXPECT_FALSE(TokenMatches("", h));
  std::string flipped = token;
  flipped.back() = flipped.back() == 'a' ? 'b' : 'a';
  EXPECT_FALSE(TokenMatches(flipped, h));
}

TEST(TokenTest, HashesAreSalted) {
  const std::string token = GenerateToken();
  const TokenHash a = HashToken(token), b = HashToken(token);
  EXPECT_NE(a.salt, b.salt);
  EXPECT_NE(a.hash, b.hash);
  EXPECT_TRUE(TokenMatches(token, a));
  EXPECT_TRUE(TokenMatches(token, b));
}

TEST(TokenTest, SecretsEqual) {
  EXPECT_TRUE(SecretsEqual("admin-secret", "admin-secret"));
  EXPECT_TRUE(SecretsEqual("", ""));
  EXPECT_FALSE(SecretsEqual("admin-secret", "admin-secreT"));
  EXPECT_FALSE(SecretsEqual("admin-secret", "admin-secret\n"));
  EXPECT_FALSE(SecretsEqual("a", ""));
  EXPECT_FALSE(SecretsEqual("short", "a-much-longer-secret"));
}

// ---------------------------------------------------------------------------
// Registry fixture


// ---------------------------------------------------------------------------
// Tenants

TEST_F(RegistryTest, CreateTenantAppliesDefaults) {
  TenantInfo& info = info_;
  const std::string& token = token_;
  ASSERT_TRUE(r_.CreateTenant(Spec("team-a"), &info, &token_).ok());
  EXPECT_TRUE(StartsWith(token, "rhk_")) << token;
  EXPECT_NE(info.handle, 0u);
  EXPECT_EQ(info.name, "team-a");
  EXPECT_EQ(info.workers_per_rack, 4u);
  const TenantDefaults d;
  EXPECT_EQ(info.chunk_bytes, 32768u);
  EXPECT_EQ(info.quotas.max_parameter_bytes, d.max_parameter_bytes);
  EXPECT_EQ(info.quotas.max_keys, d.max_keys);
  EXPECT_EQ(info.quotas.max_workers, d.max_workers);
  EXPECT_EQ(info.key_count, 0u);
  EXPECT_EQ(info.parameter_bytes, 0u);
  EXPECT_GT(info.created_unix_ms, 0);
  ASSERT_NE(info.counters, nullptr);
  EXPECT_EQ(info.default_optimizer.type, OptimizerType::kSgd);

  const TenantInfo got = MustGetTenant("team-a");
  EXPECT_EQ(got.handle, info.handle);
  EXPECT_EQ(got.counters, info.counters);  // same live counters
}

TEST_F(RegistryTest, HandlesAndTokensAreDistinct) {
  const std::string ta = MakeTenant("a"), tb = MakeTenant("b");
  EXPECT_NE(MustGetTenant("a").handle, MustGetTenant("b").handle);
  EXPECT_NE(ta, tb);
  EXPECT_EQ(r_.ListTenants().size(), 2u);
}

TEST_F(RegistryTest, ExplicitQuotasAndWorkersAboveDefaultMax) {
  TenantSpec s = Spec("big", 300);  // above the default max_workers of 256
  s.quotas.max_keys = 10;
  ASSERT_TRUE(r_.CreateTenant(s, &info_, &token_).ok());
  EXPECT_EQ(info_.quotas.max_keys, 10u);
  EXPECT_EQ(info_.quotas.max_workers, 300u);

  s = Spec("small", 10);
  s.quotas.max_workers = 5;
  EXPECT_STATUS(r_.CreateTenant(s, &info_, &token_), StatusCode::kResourceExhausted,
                "workers_per_rack");
}

TEST_F(RegistryTest, Authenticate) {
  const std::string token = MakeTenant("alpha");
  const std::string other = MakeTenant("beta");
  TenantInfo info;
  ASSERT_TRUE(r_.Authenticate("alpha", token, &info).ok());
  EXPECT_EQ(info.name, "alpha");

  Status st = r_.Authenticate("alpha", other, &info);
  EXPECT_EQ(st.code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(r_.Authenticate("alpha", "", &info).code(), StatusCode::kUnauthenticated);
  st = r_.Authenticate("gamma", token, &info);
  EXPECT_EQ(st.code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(st.message().find("gamma"), std::string::npos) << "must not echo tenant names";
}

TEST_F(RegistryTest, InvalidTenantNames) {
  for (const std::string& name :
       {std::string(), std::string("Team"), std::string(64, 'a'), std::string("-team"),
        std::string("_team"), std::string("te am"), std::string("te.am")}) {
    EXPECT_STATUS(r_.CreateTenant(Spec(name), &info_, &token_), StatusCode::kInvalidArgument,
                  "name: ");
  }
  EXPECT_TRUE(r_.CreateTenant(Spec(std::string(63, 'a')), &info_, &token_).ok());
  EXPECT_TRUE(r_.CreateTenant(Spec("0team_x-1"), &info_, &token_).ok());
  EXPECT_EQ(r_.GetTotals().tenants, 2u);
  EXPECT_TRUE(IsValidTenantName("a"));
  EXPECT_FALSE(IsValidTenantName("aB"));
  EXPECT_TRUE(IsValidKeyName("layer.0/weight:Adam-1_x"));
  EXPECT_TRUE(IsValidKeyName(std::string(128, 'k')));
  EXPECT_FALSE(IsValidKeyName(std::string(129, 'k')));
  EXPECT_FALSE(IsValidKeyName(""));
  EXPECT_FALSE(IsValidKeyName("a b"));
}

// Issue 12, hole 5: names echoed in messages are escaped and truncated.
TEST_F(RegistryTest, MessagesEscapeAndTruncateClientNames) {
  const std::string forged = "a\nb... info admin: DeleteTenant 'prod'";
  Status s = r_.CreateTenant(Spec(forged), &info_, &token_);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  EXPECT_TRUE(StartsWith(s.message(), "name: 'a\\x0ab... info admin: DeleteTenant 'prod''"))
      << s.message();
  const std::string huge(1 << 20, 'x');
  s = r_.CreateTenant(Spec(huge), &info_, &token_);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_LT(s.message().size(), 512u) << "a 1 MiB name is not echoed whole";
  EXPECT_NE(s.message().find("...(1048576 bytes)"), std::string::npos) << s.message();
  MakeTenant("t");
  s = r_.CreateKey(Key("t", "k\r\x1b[2Jey", 10), &key_);
  EXPECT_TRUE(StartsWith(s.message(), "name: 'k\\x0d\\x1b[2Jey' is not")) << s.message();
  s = r_.GetKey("t", huge, &key_);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_LT(s.message().size(), 512u);
  s = r_.GetTenant("no\x80pe", &info_);
  EXPECT_EQ(s.message(), "tenant: 'no\\x80pe' does not exist");
}

TEST(HubSecretTest, ReadHubSecretNeedsOneWordOfSixteenCharacters) {
  char dir_template[] = "/tmp/rackhub-secret-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string path = std::string(dir_template) + "/hub.secret";
  const auto write = [&](const std::string& text) {
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  };
  write("  0123456789abcdef\n\n");
  Result<std::string> r = ReadHubSecret(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, "0123456789abcdef");
  write("0123456789abcde\n");
  EXPECT_EQ(ReadHubSecret(path).status().message(),
            "topology.secret_file: '" + path +
                "' holds 15 characters; a hub secret needs at least 16 (e.g. openssl rand -hex "
                "32 > FILE)");
  write("\n");
  EXPECT_EQ(ReadHubSecret(path).status().code(), StatusCode::kFailedPrecondition);
  write("0123456789abcdef 0123456789abcdef\n");
  EXPECT_NE(ReadHubSecret(path).status().message().find("one word on one line"),
            std::string::npos);
  EXPECT_NE(ReadHubSecret(path + ".missing").status().message().find("cannot read"),
            std::string::npos);
  std::remove(path.c_str());
  rmdir(dir_template);
}

TEST_F(RegistryTest, InvalidTenantFields) {
  EXPECT_STATUS(r_.CreateTenant(Spec("t", 0), &info_, &token_), StatusCode::kInvalidArgument,
                "workers_per_rack");
  for (uint32_t chunk : {1000u, 512u, 1024u + 32u, (64u << 20) + 64u}) {
    EXPECT_STATUS(r_.CreateTenant(Spec("t", 4, chunk), &info_, &token_),
                  StatusCode::kInvalidArgument, "chunk_bytes");
  }
  TenantSpec s = Spec("t");
  s.default_optimizer.learning_rate = 0;
  EXPECT_STATUS(r_.CreateTenant(s, &info_, &token_), StatusCode::kInvalidArgument,
                "default_optimizer.learning_rate");
  s = Spec("t");
  s.default_optimizer.type = OptimizerType::kMomentum;
  s.default_optimizer.momentum = 1.5;
  EXPECT_STATUS(r_.CreateTenant(s, &info_, &token_), StatusCode::kInvalidArgument,
                "default_optimizer.momentum");
  EXPECT_EQ(r_.GetTotals().tenants, 0u);
  EXPECT_EQ(r_.GetTenant("t", &info_).code(), StatusCode::kNotFound);

  // A valid optimizer is stored normalized.
  s.default_optimizer = {};
  s.default_optimizer.type = OptimizerType::kAdam;
  ASSERT_TRUE(r_.CreateTenant(s, &info_, &token_).ok());
  EXPECT_DOUBLE_EQ(info_.default_optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(info_.default_optimizer.beta2, 0.999);
}

TEST_F(RegistryTest, DuplicateTenant) {
  const std::string first = MakeTenant("dup");
  EXPECT_STATUS(r_.CreateTenant(Spec("dup"), &info_, &token_), StatusCode::kAlreadyExists,
                "name: ");
  EXPECT_TRUE(r_.Authenticate("dup", first, &info_).ok());  // original token still valid
}

TEST_F(RegistryTest, MaxTenantsQuota) {
  TenantDefaults d;
  d.max_tenants = 2;
  Registry r(2, d);
  ASSERT_TRUE(r.CreateTenant(Spec("a"), &info_, &token_).ok());
  ASSERT_TRUE(r.CreateTenant(Spec("b"), &info_, &token_).ok());
  EXPECT_STATUS(r.CreateTenant(Spec("c"), &info_, &token_), StatusCode::kResourceExhausted, "");
  EXPECT_EQ(r.GetTotals().tenants, 2u);
  ASSERT_TRUE(r.DeleteTenant("a").ok());
  EXPECT_TRUE(r.CreateTenant(Spec("c"), &info_, &token_).ok());
}

TEST_F(RegistryTest, DeleteTenant) {
  const std::string token = MakeTenant("gone");
  MustCreateKey(Key("gone", "w", 10));
  ASSERT_TRUE(r_.DeleteTenant("gone").ok());
  EXPECT_STATUS(r_.GetTenant("gone", &info_), StatusCode::kNotFound, "tenant: ");
  EXPECT_EQ(r_.Authenticate("gone", token, &info_).code(), StatusCode::kUnauthenticated);
  std::vector<KeyInfo> keys;
  EXPECT_EQ(r_.ListKeys("gone", &keys).code(), StatusCode::kNotFound);
  EXPECT_EQ(r_.DeleteTenant("gone").code(), StatusCode::kNotFound);
  EXPECT_EQ(r_.GetTotals().keys, 0u);
}

}  // namespace
}  // namespace rackhub::server
