// Unit tests for the durable registry (server/state/registry_store.cc and
// Registry::Open): every entity survives a reopen identical, refused requests
// and failed writes leave the database as it was, and a database that is
// corrupt, unreadable or from a newer schema is refused with a message naming
// the file (never replaced by an empty one).

#include "registry_store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "registry.h"

namespace rackhub::server {
namespace {

using aggregation::OptimizerConfig;
using aggregation::OptimizerType;
namespace fs = std::filesystem;

bool Contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

#define ASSERT_OK(expr)                     \
  do {                                      \
    const Status st_ = (expr);              \
    ASSERT_TRUE(st_.ok()) << st_.message(); \
  } while (0)

std::string ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

// Runs SQL on the file through a separate connection (what an operator's
// sqlite3 shell would do).
void RawExec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  EXPECT_EQ(rc, SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

// Every row of every table (and the header pragmas), as text: compares
// database contents row by row.
std::string DumpRows(const std::string& path) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  std::string out;
  for (const char* sql :
       {"PRAGMA user_version", "SELECT * FROM meta ORDER BY name",
        "SELECT * FROM tenants ORDER BY handle", "SELECT * FROM keys ORDER BY tenant_handle, id"}) {
    sqlite3_stmt* st = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, sql, -1, &st, nullptr), SQLITE_OK) << sql;
    out += std::string(sql) + "\n";
    while (sqlite3_step(st) == SQLITE_ROW) {
      for (int i = 0; i < sqlite3_column_count(st); ++i) {
        const auto* p = static_cast<const char*>(sqlite3_column_blob(st, i));
        out += "|" + std::string(p ? p : "", static_cast<size_t>(sqlite3_column_bytes(st, i)));
      }
      out += "\n";
    }
    sqlite3_finalize(st);
  }
  sqlite3_close(db);
  return out;
}

class RegistryStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "rackhub-store-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/state";
    db_path_ = dir_ + "/registry.db";
  }
  void TearDown() override {
    registry_.reset();
    std::error_code ec;
    fs::permissions(root_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(root_, ec);
  }

  // Opens (or reopens) the durable registry over dir_.
  void Open() {
    registry_.reset();
    Result<std::unique_ptr<RegistryStore>> store = RegistryStore::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status().message();
    Result<std::unique_ptr<Registry>> r =
        Registry::Open(/*lanes=*/3, TenantDefaults{}, *std::move(store));
    ASSERT_TRUE(r.ok()) << r.status().message();
    registry_ = *std::move(r);
  }

  // Expects RegistryStore::Open(dir_) to refuse with FAILED_PRECONDITION
  // naming the file and mentioning `needle`.
  void ExpectRefused(const std::string& needle) {
    Result<std::unique_ptr<RegistryStore>> store = RegistryStore::Open(dir_);
    ASSERT_FALSE(store.ok());
    EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition) << store.status().message();
    EXPECT_EQ(store.status().message().rfind("state.dir: " + db_path_ + ": ", 0), 0u)
        << store.status().message();
    EXPECT_TRUE(Contains(store.status().message(), needle)) << store.status().message();
  }

  std::string CreateTenant(const std::string& name, uint32_t chunk_bytes = 1024,
                           Quotas quotas = {}) {
    TenantSpec s;
    s.name = name;
    s.workers_per_rack = 2;
    s.chunk_bytes = chunk_bytes;
    s.quotas = quotas;
    s.default_optimizer.type = OptimizerType::kAdam;
    s.default_optimizer.learning_rate = 0.001;
    TenantInfo info;
    std::string token;
    const Status st = registry_->CreateTenant(s, &info, &token);
    EXPECT_TRUE(st.ok()) << st.message();
    return token;
  }

  KeyInfo CreateKey(const std::string& tenant, const std::string& name, uint64_t elements,
                    InitMode init = InitMode::kZeros, const OptimizerConfig* opt = nullptr) {
    KeySpec k;
    k.tenant = tenant;
    k.name = name;
    k.elements = elements;
    k.init = init;
    k.dtype = WireDType::kBf16;
    if (opt) {
      k.use_tenant_optimizer = false;
      k.optimizer = *opt;
    }
    KeyInfo out;
    const Status st = registry_->CreateKey(k, &out);
    EXPECT_TRUE(st.ok()) << st.message();
    return out;
  }

  std::string root_, dir_, db_path_;
  std::unique_ptr<Registry> registry_;
};

void ExpectSameTenant(const TenantInfo& a, const TenantInfo& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.handle, b.handle);
  EXPECT_EQ(a.workers_per_rack, b.workers_per_rack);
  EXPECT_EQ(a.chunk_bytes, b.chunk_bytes);
  EXPECT_EQ(a.default_optimizer, b.default_optimizer);
  EXPECT_EQ(a.quotas.max_parameter_bytes, b.quotas.max_parameter_bytes);
  EXPECT_EQ(a.quotas.max_keys, b.quotas.max_keys);
  EXPECT_EQ(a.quotas.max_workers, b.quotas.max_workers);
  EXPECT_EQ(a.key_count, b.key_count);
  EXPECT_EQ(a.parameter_bytes, b.parameter_bytes);
  EXPECT_EQ(a.memory_bytes, b.memory_bytes) << "hub memory is recomputed on load";
  EXPECT_EQ(a.memory_bytes == 0, a.key_count == 0);
  EXPECT_EQ(a.chunk_count, b.chunk_count);
  EXPECT_EQ(a.created_unix_ms, b.created_unix_ms);
}

void ExpectSameKey(const KeyInfo& a, const KeyInfo& b) {
  EXPECT_EQ(a.tenant, b.tenant);
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.elements, b.elements);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.optimizer, b.optimizer);
  EXPECT_EQ(a.schedule.base, b.schedule.base);
  EXPECT_EQ(a.schedule.latest, b.schedule.latest);
  EXPECT_EQ(a.schedule.from_update, b.schedule.from_update);
  EXPECT_EQ(a.init, b.init);
  EXPECT_EQ(a.placement.first_chunk, b.placement.first_chunk);
  EXPECT_EQ(a.placement.chunk_count, b.placement.chunk_count);
  EXPECT_EQ(a.chunk_elements, b.chunk_elements);
  EXPECT_EQ(a.memory_bytes, b.memory_bytes);
  EXPECT_GT(a.memory_bytes, 4 * a.parameter_bytes()) << "x2, accumulator, 1 parked, state";
}

TEST_F(RegistryStoreTest, EveryEntityRoundTripsAcrossReopen) {
  Open();
  EXPECT_EQ(fs::status(dir_).permissions() & fs::perms::all, fs::perms::owner_all);
  const std::string token_a = CreateTenant("alpha", 1024, Quotas{1 << 20, 10, 8});
  const std::string token_b = CreateTenant("beta", 2048);
  CreateKey("alpha", "w0", 1000);
  OptimizerConfig momentum;
  momentum.type = OptimizerType::kMomentum;
  momentum.learning_rate = 0.1;
  momentum.momentum = 0.9;
  CreateKey("alpha", "w1", 300, InitMode::kFromClient, &momentum);
  CreateKey("alpha", "gone", 50);
  CreateKey("beta", "b0", 4096);
  TenantInfo info;
  ASSERT_OK(registry_->UpdateQuotas("alpha", Quotas{2 << 20, 0, 0}, &info));
  // A schedule change from update 7 on: base and latest differ.
  OptimizerConfig faster = momentum;
  faster.learning_rate = 0.05;
  KeyInfo key;
  ASSERT_OK(registry_->SetOptimizer("alpha", "w1", faster, /*keep_type=*/true, &key, 7));
  ASSERT_EQ(key.schedule.from_update, 7u);
  ASSERT_OK(registry_->DeleteKey("alpha", "gone"));
  CreateTenant("doomed");
  ASSERT_OK(registry_->DeleteTenant("doomed"));
  registry_->MarkKeyReady(1, 2);  // not stored

  const std::vector<TenantInfo> tenants_before = registry_->ListTenants();
  std::vector<KeyInfo> alpha_before, beta_before;
  ASSERT_OK(registry_->ListKeys("alpha", &alpha_before));
  ASSERT_OK(registry_->ListKeys("beta", &beta_before));
  ASSERT_EQ(tenants_before.size(), 2u);
  ASSERT_EQ(alpha_before.size(), 2u);

  Open();  // as after a restart
  const std::vector<TenantInfo> tenants_after = registry_->ListTenants();
  ASSERT_EQ(tenants_after.size(), tenants_before.size());
  for (size_t i = 0; i < tenants_after.size(); ++i) {
    ExpectSameTenant(tenants_after[i], tenants_before[i]);
  }
  std::vector<KeyInfo> alpha_after, beta_after;
  ASSERT_OK(registry_->ListKeys("alpha", &alpha_after));
  ASSERT_OK(registry_->ListKeys("beta", &beta_after));
  ASSERT_EQ(alpha_after.size(), alpha_before.size());
  for (size_t i = 0; i < alpha_after.size(); ++i) ExpectSameKey(alpha_after[i], alpha_before[i]);
  ASSERT_EQ(beta_after.size(), 1u);
  ExpectSameKey(beta_after[0], beta_before[0]);
  EXPECT_EQ(alpha_after[1].schedule.from_update, 7u);
  EXPECT_NE(alpha_after[1].schedule.base, alpha_after[1].schedule.latest);
  EXPECT_EQ(alpha_after[1].schedule.base.learning_rate, 0.1);
  EXPECT_EQ(alpha_after[1].optimizer.learning_rate, 0.05);
  // Readiness is not stored: FROM_CLIENT keys wait for a checkpoint.
  EXPECT_TRUE(alpha_after[0].ready);
  EXPECT_FALSE(alpha_after[1].ready);
  EXPECT_EQ(registry_->GetTenant("doomed", &info).code(), StatusCode::kNotFound);
  KeyInfo gone;
  EXPECT_EQ(registry_->GetKey("alpha", "gone", &gone).code(), StatusCode::kNotFound);

  // The old tokens authenticate; a wrong one does not.
  EXPECT_TRUE(registry_->Authenticate("alpha", token_a, &info).ok());
  EXPECT_EQ(info.handle, 1u);
  EXPECT_TRUE(registry_->Authenticate("beta", token_b, &info).ok());
  EXPECT_FALSE(registry_->Authenticate("alpha", token_b, &info).ok());
  // Lookups by handle and id work as before.
  KeyInfo by_id;
  ASSERT_OK(registry_->GetKeyById(1, alpha_before[1].id, &by_id));
  EXPECT_EQ(by_id.name, "w1");

  // Handles and key ids are never reused; chunk indices continue after the
  // deleted key's.
  CreateTenant("gamma");
  ASSERT_OK(registry_->GetTenant("gamma", &info));
  EXPECT_EQ(info.handle, 4u);  // alpha 1, beta 2, doomed 3 (deleted)
  const KeyInfo next = CreateKey("alpha", "w2", 10);
  EXPECT_EQ(next.id, 4u);  // w0 1, w1 2, gone 3 (deleted)
  EXPECT_EQ(next.placement.first_chunk, tenants_before[0].chunk_count);
  // ... and that survives another restart too.
  Open();
  ASSERT_OK(registry_->GetKey("alpha", "w2", &key));
  ExpectSameKey(key, next);
  CreateTenant("delta");
  ASSERT_OK(registry_->GetTenant("delta", &info));
  EXPECT_EQ(info.handle, 5u);
}

TEST_F(RegistryStoreTest, RefusedRequestsLeaveTheDatabaseRowIdentical) {
  Open();
  CreateTenant("alpha", 1024, Quotas{64 << 10, 2, 4});  // hub memory: room for w0 and 8 more
  CreateKey("alpha", "w0", 512);
  const std::string before = DumpRows(db_path_);
  TenantInfo info;
  KeyInfo key;
  std::string token;
  TenantSpec dup;
  dup.name = "alpha";
  dup.workers_per_rack = 1;
  EXPECT_EQ(registry_->CreateTenant(dup, &info, &token).code(), StatusCode::kAlreadyExists);
  dup.name = "Bad Name";
  EXPECT_EQ(registry_->CreateTenant(dup, &info, &token).code(), StatusCode::kInvalidArgument);
  KeySpec big;
  big.tenant = "alpha";
  big.name = "big";
  big.elements = 1 << 20;  // beyond max_parameter_bytes
  EXPECT_EQ(registry_->CreateKey(big, &key).code(), StatusCode::kResourceExhausted);
  big.name = "w0";
  big.elements = 4;
  EXPECT_EQ(registry_->CreateKey(big, &key).code(), StatusCode::kAlreadyExists);
  bool created = true;
  EXPECT_EQ(registry_->DeclareKey(big, &key, &created).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->UpdateQuotas("alpha", Quotas{16, 0, 0}, &info).code(),
            StatusCode::kFailedPrecondition);
  OptimizerConfig adagrad;
  adagrad.type = OptimizerType::kAdaGrad;
  EXPECT_EQ(registry_->SetOptimizer("alpha", "w0", adagrad, false, &key).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->DeleteKey("alpha", "nope").code(), StatusCode::kNotFound);
  EXPECT_EQ(registry_->DeleteTenant("nope").code(), StatusCode::kNotFound);
  // DECLARE of an existing key with the same shape creates nothing.
  big.elements = 512;
  big.dtype = WireDType::kBf16;
  EXPECT_TRUE(registry_->DeclareKey(big, &key, &created).ok());
  EXPECT_FALSE(created);
  EXPECT_EQ(DumpRows(db_path_), before);
  // A DECLARE that creates is stored.
  big.name = "declared";
  big.elements = 8;
  EXPECT_TRUE(registry_->DeclareKey(big, &key, &created).ok());
  EXPECT_TRUE(created);
  EXPECT_NE(DumpRows(db_path_), before);
  Open();
  EXPECT_TRUE(registry_->GetKey("alpha", "declared", &key).ok());
}

TEST_F(RegistryStoreTest, AFailedWriteFailsTheCallAndChangesNothing) {
  Open();
  CreateTenant("alpha");
  registry_.reset();
  // Another connection holds the write lock; our writes give up after 50 ms.
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(db_path_.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  Result<std::unique_ptr<RegistryStore>> store =
      RegistryStore::Open(dir_, std::chrono::milliseconds(50));
  ASSERT_TRUE(store.ok()) << store.status().message();
  Result<std::unique_ptr<Registry>> r = Registry::Open(3, TenantDefaults{}, *std::move(store));
  ASSERT_TRUE(r.ok()) << r.status().message();
  registry_ = *std::move(r);
  const std::string before = DumpRows(db_path_);

  TenantSpec s;
  s.name = "beta";
  s.workers_per_rack = 1;
  TenantInfo info;
  std::string token = "unchanged";
  const Status st = registry_->CreateTenant(s, &info, &token);
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_EQ(st.message().rfind("state.dir: " + db_path_ + ": create tenant 'beta': ", 0), 0u)
      << st.message();
  EXPECT_TRUE(Contains(st.message(), "locked")) << st.message();
  EXPECT_EQ(token, "unchanged");
  KeySpec k;
  k.tenant = "alpha";
  k.name = "w";
  k.elements = 10;
  KeyInfo key;
  EXPECT_EQ(registry_->CreateKey(k, &key).code(), StatusCode::kInternal);
  EXPECT_EQ(registry_->DeleteTenant("alpha").code(), StatusCode::kInternal);
  EXPECT_EQ(registry_->UpdateQuotas("alpha", Quotas{0, 7, 0}, &info).code(), StatusCode::kInternal);
  // Nothing changed in memory...
  EXPECT_EQ(registry_->ListTenants().size(), 1u);
  ASSERT_TRUE(registry_->GetTenant("alpha", &info).ok());
  EXPECT_EQ(info.key_count, 0u);
  EXPECT_EQ(info.chunk_count, 0u);
  EXPECT_NE(info.quotas.max_keys, 7u);
  // ... nor on disk.
  sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(other);
  EXPECT_EQ(DumpRows(db_path_), before);
  // Once the lock is gone the same calls work, with the ids a success would
  // have had.
  ASSERT_OK(registry_->CreateKey(k, &key));
  EXPECT_EQ(key.id, 1u);
  ASSERT_OK(registry_->CreateTenant(s, &info, &token));
  EXPECT_EQ(info.handle, 2u);
}

TEST_F(RegistryStoreTest, GarbageFileIsRefusedAndKept) {
  fs::create_directories(dir_);
  const std::string garbage(8192, 'x');
  WriteBytes(db_path_, garbage);
  ExpectRefused("file is not a database");
  EXPECT_EQ(ReadBytes(db_path_), garbage);  // never replaced
}

// systemd's StateDirectory= with DynamicUser= makes the state directory a
// symlink (/var/lib/rackhub -> private/rackhub): it opens and persists. A
// registry.db that is itself a symlink is still refused.
TEST_F(RegistryStoreTest, StateDirectoryBehindASymlinkOpensAndASymlinkedDatabaseDoesNot) {
  const std::string real = root_ + "/private/rackhub";
  fs::create_directories(real);
  fs::create_directory_symlink(real, dir_);
  {
    Result<std::unique_ptr<RegistryStore>> store = RegistryStore::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status().message();
  }
  EXPECT_TRUE(fs::exists(real + "/registry.db"));
  {
    Result<std::unique_ptr<RegistryStore>> again = RegistryStore::Open(dir_);
    ASSERT_TRUE(again.ok()) << again.status().message();
  }
  fs::remove(dir_);
  fs::create_directories(dir_);
  fs::create_symlink(real + "/registry.db", db_path_);
  Result<std::unique_ptr<RegistryStore>> planted = RegistryStore::Open(dir_);
  EXPECT_FALSE(planted.ok()) << "a registry.db symlink must not be followed";
}

TEST_F(RegistryStoreTest, FlippedByteInATablePageFailsTheIntegrityCheck) {
  Open();
  CreateTenant("flipflopflipflop");
  registry_.reset();  // closes: the WAL is checkpointed into the file
  std::string bytes = ReadBytes(db_path_);
  const size_t at = bytes.find("flipflopflipflop");
  ASSERT_NE(at, std::string::npos);
  ASSERT_GE(at, 4096u);   // not the header page
  bytes[at + 3] ^= 0x01;  // a silent bit flip: the row and its index disagree
  WriteBytes(db_path_, bytes);
  ExpectRefused("integrity check failed");
  EXPECT_EQ(ReadBytes(db_path_), bytes);
}

TEST_F(RegistryStoreTest, UnreadableFileIsRefused) {
  // Tests run as root, which ignores permission bits: a directory where the
  // database file should be is unreadable as a database for everyone (open
  // fails with EISDIR, the same check that reports EACCES for other users).
  fs::create_directories(db_path_);
  ExpectRefused("Is a directory");
  EXPECT_TRUE(fs::is_directory(db_path_));
  fs::remove(db_path_);
  if (geteuid() != 0) {
    Open();
    registry_.reset();
    chmod(db_path_.c_str(), 0);
    ExpectRefused("Permission denied");
  }
}

TEST_F(RegistryStoreTest, NewerSchemaVersionIsRefused) {
  Open();
  CreateTenant("alpha");
  registry_.reset();
  RawExec(db_path_, "PRAGMA user_version = 7");
  ExpectRefused("schema version 7 is newer than this rackhubd understands (6)");
  // Still there, untouched.
  RawExec(db_path_, "PRAGMA user_version = 6");
  Open();
  EXPECT_EQ(registry_->ListTenants().size(), 1u);
}

TEST_F(RegistryStoreTest, OlderSchemaVersionIsUpgraded) {
  // Version 0: a SQLite file without the rackhub schema (what sqlite3 leaves
  // after creating and dropping a table). Open runs the migrations to v1.
  fs::create_directories(dir_);
  RawExec(db_path_, "CREATE TABLE t (x); DROP TABLE t;");
  ASSERT_GT(ReadBytes(db_path_).size(), 0u);
  Open();
  CreateTenant("alpha");
  registry_.reset();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(db_path_.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(st, 0), RegistryStore::kSchemaVersion);
  sqlite3_finalize(st);
  sqlite3_close(db);
  Open();
  EXPECT_EQ(registry_->ListTenants().size(), 1u);
}

// Version 1 (before Quotas::weight): the migration to v2 adds the column and
// gives every existing tenant weight 1; everything else reads back as it was.
TEST_F(RegistryStoreTest, Version1DatabaseGainsTheWeightColumn) {
  Open();
  CreateTenant("alpha");
  CreateTenant("beta");
  registry_.reset();
  // What a v1 rackhubd left: no weight column, user_version 1.
  RawExec(db_path_,
          "ALTER TABLE keys DROP COLUMN participants; "
          "ALTER TABLE tenants DROP COLUMN elastic; ALTER TABLE tenants DROP COLUMN min_workers; "
          "ALTER TABLE tenants DROP COLUMN consistency; ALTER TABLE tenants DROP COLUMN staleness; "
          "ALTER TABLE keys DROP COLUMN topk_ratio; "
          "ALTER TABLE tenants DROP COLUMN weight; ALTER TABLE keys DROP COLUMN rows; "
          "ALTER TABLE keys DROP COLUMN dim; ALTER TABLE keys DROP COLUMN init_scale; "
          "ALTER TABLE keys DROP COLUMN init_seed; PRAGMA user_version = 1;");
  Open();
  auto tenants = registry_->ListTenants();
  ASSERT_EQ(tenants.size(), 2u);
  for (const auto& t : tenants) {
    EXPECT_EQ(t.quotas.weight, 1u) << t.name;
    EXPECT_EQ(t.counters->weight.load(), 1u) << t.name;
  }
  // The upgraded file takes new weights and keeps them.
  TenantInfo info;
  ASSERT_TRUE(registry_->UpdateQuotas("beta", Quotas{0, 0, 0, 7}, &info).ok());
  EXPECT_EQ(info.quotas.weight, 7u);
  registry_.reset();
  Open();
  TenantInfo beta;
  ASSERT_TRUE(registry_->GetTenant("beta", &beta).ok());
  EXPECT_EQ(beta.quotas.weight, 7u);
  EXPECT_EQ(beta.counters->weight.load(), 7u);
}

// Version 2 (before row-sparse tables): the migration to v3 adds the table
// columns; existing keys read back as dense keys. A table key created then
// survives a reopen with its shape, init, layout and memory.
TEST_F(RegistryStoreTest, Version2DatabaseGainsTableColumns) {
  Open();
  CreateTenant("alpha");
  const KeyInfo dense = CreateKey("alpha", "w", 1000);
  registry_.reset();
  RawExec(db_path_,
          "ALTER TABLE keys DROP COLUMN participants; "
          "ALTER TABLE tenants DROP COLUMN elastic; ALTER TABLE tenants DROP COLUMN min_workers; "
          "ALTER TABLE tenants DROP COLUMN consistency; ALTER TABLE tenants DROP COLUMN staleness; "
          "ALTER TABLE keys DROP COLUMN topk_ratio; "
          "ALTER TABLE keys DROP COLUMN rows; ALTER TABLE keys DROP COLUMN dim; "
          "ALTER TABLE keys DROP COLUMN init_scale; ALTER TABLE keys DROP COLUMN init_seed; "
          "PRAGMA user_version = 2;");
  Open();
  KeyInfo got;
  ASSERT_TRUE(registry_->GetKey("alpha", "w", &got).ok());
  EXPECT_FALSE(got.table());
  EXPECT_EQ(got.elements, dense.elements);
  EXPECT_EQ(got.placement.chunk_count, dense.placement.chunk_count);

  KeySpec t;
  t.tenant = "alpha";
  t.name = "emb";
  t.rows = 1000;
  t.dim = 8;
  t.init = InitMode::kRandom;
  t.init_scale = 0.25f;
  t.init_seed = 77;
  KeyInfo table;
  ASSERT_TRUE(registry_->CreateKey(t, &table).ok());
  EXPECT_EQ(table.elements, 8000u);
  EXPECT_EQ(table.placement.chunk_count, 3u);  // 334 rows per lane
  EXPECT_EQ(table.chunk_elements, 334u * 8);
  EXPECT_TRUE(table.ready);
  registry_.reset();
  Open();
  ASSERT_TRUE(registry_->GetKey("alpha", "emb", &got).ok());
  EXPECT_EQ(got.rows, 1000u);
  EXPECT_EQ(got.dim, 8u);
  EXPECT_EQ(got.init, InitMode::kRandom);
  EXPECT_EQ(got.init_scale, 0.25f);
  EXPECT_EQ(got.init_seed, 77u);
  EXPECT_EQ(got.placement.first_chunk, table.placement.first_chunk);
  EXPECT_EQ(got.placement.chunk_count, 3u);
  EXPECT_EQ(got.memory_bytes, table.memory_bytes);
  EXPECT_TRUE(got.ready);
  const auto chunks = registry_->ChunksOf(got);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[2].first_element, 668u * 8);
  EXPECT_EQ(chunks[2].elements, 332u * 8);
  // A key after the table continues the index space.
  const KeyInfo next = CreateKey("alpha", "b", 10);
  EXPECT_EQ(next.placement.first_chunk, table.placement.first_chunk + 3);
}

// Table shapes and inits that cannot work are refused and change nothing.
TEST_F(RegistryStoreTest, BadTablesAreRefused) {
  Open();
  CreateTenant("alpha");
  const std::string before = DumpRows(db_path_);
  const auto refuse = [&](KeySpec spec, const std::string& words) {
    spec.tenant = "alpha";
    spec.name = "emb";
    KeyInfo out;
    const Status s = registry_->CreateKey(spec, &out);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << words;
    EXPECT_TRUE(Contains(s.message(), words)) << s.message();
  };
  KeySpec k;
  k.rows = 10;
  refuse(k, "rows, dim: a row-sparse table needs rows >= 1 and dim in [1, 65536], got 10 x 0");
  k.dim = 70000;
  refuse(k, "got 10 x 70000");
  k.dim = 4;
  k.elements = 41;
  refuse(k, "elements: 41 is not rows x dim = 40");
  k.elements = 0;
  k.init = InitMode::kFromClient;
  refuse(k, "FROM_CLIENT is not available for row-sparse tables");
  k.init = InitMode::kRandom;
  refuse(k, "init_scale: RANDOM needs a finite scale > 0");
  k.rows = 1ull << 33;
  refuse(k, "exceeds 17179869184 elements");
  KeySpec dense;
  dense.elements = 5;
  dense.init = InitMode::kRandom;
  refuse(dense, "RANDOM is for row-sparse tables");
  EXPECT_EQ(DumpRows(db_path_), before);
}

// A weight out of [1, 1000] is refused and changes nothing, on disk too.
TEST_F(RegistryStoreTest, WeightIsValidatedAndStored) {
  Open();
  TenantSpec spec;
  spec.name = "heavy";
  spec.workers_per_rack = 1;
  spec.quotas.weight = 1001;
  TenantInfo info;
  std::string token;
  Status s = registry_->CreateTenant(spec, &info, &token);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("quotas.weight: 1001 must be in [1, 1000]"), std::string::npos)
      << s.message();
  spec.quotas.weight = 5;
  ASSERT_TRUE(registry_->CreateTenant(spec, &info, &token).ok());
  EXPECT_EQ(info.quotas.weight, 5u);
  const std::string before = DumpRows(db_path_);
  s = registry_->UpdateQuotas("heavy", Quotas{0, 0, 0, 5000}, &info);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DumpRows(db_path_), before);
  registry_.reset();
  Open();
  ASSERT_TRUE(registry_->GetTenant("heavy", &info).ok());
  EXPECT_EQ(info.quotas.weight, 5u);
}

// Version 3 (before consistency modes and top-k): the migration to v4 makes
// existing tenants sync and existing keys dense; a bounded tenant and a
// top-k key created then survive a reopen.
TEST_F(RegistryStoreTest, Version3DatabaseGainsConsistencyAndTopK) {
  Open();
  CreateTenant("alpha");
  CreateKey("alpha", "w", 1000);
  registry_.reset();
  RawExec(db_path_,
          "ALTER TABLE keys DROP COLUMN participants; "
          "ALTER TABLE tenants DROP COLUMN elastic; ALTER TABLE tenants DROP COLUMN min_workers; "
          "ALTER TABLE tenants DROP COLUMN consistency; ALTER TABLE tenants DROP COLUMN staleness; "
          "ALTER TABLE keys DROP COLUMN topk_ratio; "
          "PRAGMA user_version = 3;");
  Open();
  TenantInfo alpha;
  ASSERT_TRUE(registry_->GetTenant("alpha", &alpha).ok());
  EXPECT_EQ(alpha.consistency, Consistency::kSync);
  EXPECT_EQ(alpha.staleness, 0u);
  KeyInfo w;
  ASSERT_TRUE(registry_->GetKey("alpha", "w", &w).ok());
  EXPECT_EQ(w.topk_ratio, 0.0f);

  TenantSpec b;
  b.name = "beta";
  b.workers_per_rack = 2;
  b.consistency = Consistency::kBounded;
  b.staleness = 3;
  TenantInfo info;
  std::string token;
  ASSERT_TRUE(registry_->CreateTenant(b, &info, &token).ok());
  KeySpec k;
  k.tenant = "beta";
  k.name = "g";
  k.elements = 5000;
  k.topk_ratio = 0.01f;
  KeyInfo g;
  ASSERT_TRUE(registry_->CreateKey(k, &g).ok());
  // Refused: a staleness without bounded, a ratio out of range, top-k on a
  // table, a table in a bounded tenant.
  TenantSpec bad = b;
  bad.name = "gamma";
  bad.consistency = Consistency::kAsync;
  EXPECT_NE(registry_->CreateTenant(bad, &info, &token).message().find(
                "only a bounded tenant has a staleness bound"),
            std::string::npos);
  k.name = "h";
  k.topk_ratio = 1.5f;
  EXPECT_NE(registry_->CreateKey(k, &g).message().find("topk_ratio: must be in (0, 1]"),
            std::string::npos);
  k.topk_ratio = 0;
  k.elements = 0;
  k.rows = 10;
  k.dim = 4;
  EXPECT_NE(registry_->CreateKey(k, &g).message().find("row-sparse tables need a sync tenant"),
            std::string::npos);
  registry_.reset();
  Open();
  TenantInfo beta;
  ASSERT_TRUE(registry_->GetTenant("beta", &beta).ok());
  EXPECT_EQ(beta.consistency, Consistency::kBounded);
  EXPECT_EQ(beta.staleness, 3u);
  ASSERT_TRUE(registry_->GetKey("beta", "g", &g).ok());
  EXPECT_EQ(g.topk_ratio, 0.01f);
}

// A top-k ratio is kept as given (a double, k = ceil(ratio * n) of it)
// across a restart; a declaration whose ratio came through a float (an older
// client) finds the key, another ratio is refused.
TEST_F(RegistryStoreTest, TopKRatioKeptExactly) {
  Open();
  TenantSpec t;
  t.name = "exact";
  t.workers_per_rack = 2;
  TenantInfo info;
  std::string token;
  ASSERT_TRUE(registry_->CreateTenant(t, &info, &token).ok());
  KeySpec k;
  k.tenant = "exact";
  k.name = "w";
  k.elements = 2560;
  k.topk_ratio = 0.05;
  KeyInfo g;
  ASSERT_TRUE(registry_->CreateKey(k, &g).ok());
  EXPECT_EQ(g.topk_ratio, 0.05);
  registry_.reset();
  Open();
  ASSERT_TRUE(registry_->GetKey("exact", "w", &g).ok());
  EXPECT_EQ(g.topk_ratio, 0.05);  // not 0.05f (0.0500000007...)
  // Workers declare (DeclareKey); the admin's CreateKey of an existing key
  // is ALREADY_EXISTS whatever its ratio.
  bool created = true;
  k.topk_ratio = static_cast<double>(0.05f);
  const Status same = registry_->DeclareKey(k, &g, &created);
  ASSERT_TRUE(same.ok()) << "a float of the same ratio finds the key: " << same.message();
  EXPECT_FALSE(created);
  EXPECT_EQ(g.topk_ratio, 0.05);
  k.topk_ratio = 0.06;
  const Status other = registry_->DeclareKey(k, &g, &created);
  EXPECT_NE(other.message().find("already exists with top-k ratio 0.05, not top-k ratio 0.06"),
            std::string::npos)
      << other.message();
  EXPECT_EQ(registry_->CreateKey(k, &g).code(), StatusCode::kAlreadyExists);
}

// Version 4 (before elastic tenants): the migration to v5 adds the elastic
// columns; existing tenants are not elastic. An elastic tenant created then
// survives a reopen with its settings, starting paused.
TEST_F(RegistryStoreTest, Version4DatabaseGainsElasticColumns) {
  Open();
  CreateTenant("alpha");
  registry_.reset();
  RawExec(db_path_,
          "ALTER TABLE keys DROP COLUMN participants; "
          "ALTER TABLE tenants DROP COLUMN elastic; ALTER TABLE tenants DROP COLUMN min_workers; "
          "PRAGMA user_version = 4;");
  Open();
  TenantInfo alpha;
  ASSERT_TRUE(registry_->GetTenant("alpha", &alpha).ok());
  EXPECT_FALSE(alpha.elastic);
  EXPECT_EQ(alpha.min_workers, 0u);
  TenantSpec spec;
  spec.name = "job";
  spec.workers_per_rack = 4;
  spec.elastic = true;
  spec.min_workers = 2;
  spec.quotas.max_workers = 8;
  TenantInfo job;
  std::string token;
  ASSERT_TRUE(registry_->CreateTenant(spec, &job, &token).ok());
  registry_.reset();
  Open();
  ASSERT_TRUE(registry_->GetTenant("job", &job).ok());
  EXPECT_TRUE(job.elastic);
  EXPECT_EQ(job.min_workers, 2u);
  EXPECT_EQ(job.workers_per_rack, 4u);
  EXPECT_EQ(job.quotas.max_workers, 8u);
  EXPECT_EQ(job.rank_slots(), 8u);
  EXPECT_TRUE(job.counters->paused.load());
}

// Version 5 (before participant sets): the migration to v6 adds the keys'
// participants column; existing keys sum every worker. A key with a set
// created then survives a reopen with it.
TEST_F(RegistryStoreTest, Version5DatabaseGainsParticipants) {
  Open();
  CreateTenant("alpha");
  CreateKey("alpha", "w", 1000);
  registry_.reset();
  RawExec(db_path_, "ALTER TABLE keys DROP COLUMN participants; PRAGMA user_version = 5;");
  Open();
  KeyInfo got;
  ASSERT_TRUE(registry_->GetKey("alpha", "w", &got).ok());
  EXPECT_TRUE(got.participants.empty());
  KeySpec spec;
  spec.tenant = "alpha";
  spec.name = "set";
  spec.elements = 10;
  spec.participants = {1};
  KeyInfo made;
  const Status s = registry_->CreateKey(spec, &made);
  ASSERT_TRUE(s.ok()) << s.message();
  registry_.reset();
  Open();
  ASSERT_TRUE(registry_->GetKey("alpha", "set", &got).ok());
  EXPECT_EQ(got.participants, (std::vector<uint32_t>{1}));
}

TEST_F(RegistryStoreTest, ForeignDatabaseIsRefused) {
  fs::create_directories(dir_);
  RawExec(db_path_, "CREATE TABLE photos (id INTEGER)");
  ExpectRefused("not a rackhub registry");
  RawExec(db_path_, "PRAGMA user_version = 1");
  ExpectRefused("not a rackhub registry");
}

TEST_F(RegistryStoreTest, StateDirectoryIsCreatedOrNamedWhenUnusable) {
  dir_ = root_ + "/a/b/state";
  db_path_ = dir_ + "/registry.db";
  Open();
  EXPECT_TRUE(fs::exists(db_path_));
  EXPECT_EQ(fs::status(dir_).permissions() & fs::perms::all, fs::perms::owner_all);
  registry_.reset();
  // A file where the directory should be.
  WriteBytes(root_ + "/file", "x");
  Result<std::unique_ptr<RegistryStore>> store = RegistryStore::Open(root_ + "/file");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.status().message(), "state.dir: " + root_ + "/file is not a directory");
  // A directory that cannot be created (its parent is a file).
  store = RegistryStore::Open(root_ + "/file/state");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(
      Contains(store.status().message(), "state.dir: cannot create " + root_ + "/file/state"))
      << store.status().message();
}

TEST_F(RegistryStoreTest, InMemoryRegistryStoresNothing) {
  Registry r(2, TenantDefaults{});
  TenantSpec s;
  s.name = "alpha";
  s.workers_per_rack = 1;
  TenantInfo info;
  std::string token;
  ASSERT_OK(r.CreateTenant(s, &info, &token));
  EXPECT_FALSE(fs::exists(dir_));
}

}  // namespace
}  // namespace rackhub::server
