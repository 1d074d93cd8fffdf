// RegistryStore: the registry's SQLite database: opening it (the state
// directory, its lock, the schema and its migrations), loading its contents,
// and one write transaction per registry change (tenants, quotas, keys,
// optimizers). The SQLite statement layer: sqlite_statement.h.
#include "registry_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <utility>

#include "sqlite_statement.h"

namespace rackhub::server {
namespace {

using aggregation::OptimizerConfig;
using aggregation::OptimizerType;
using aggregation::Reduction;
using sqlite::Exec;
using sqlite::PragmaInt;
using sqlite::Placeholders;
using sqlite::Statement;
using sqlite::Transaction;

// --- Optimizer columns: <prefix>_type, <prefix>_learning_rate, ... ---------

constexpr const char* kOptimizerFields[] = {
    "type",    "learning_rate",       "momentum", "weight_decay", "beta1", "beta2",
    "epsilon", "initial_accumulator", "reduction"};
constexpr int kOptimizerColumns = 9;

std::string OptimizerColumnDefs(const std::string& prefix) {
  std::string s;
  for (int i = 0; i < kOptimizerColumns; ++i) {
    const bool integer = i == 0 || i == kOptimizerColumns - 1;
    s += ",\n  " + prefix + "_" + kOptimizerFields[i] + (integer ? " INTEGER" : " REAL") +
         " NOT NULL";
  }
  return s;
}

std::string OptimizerColumns(const std::string& prefix) {
  std::string s;
  for (int i = 0; i < kOptimizerColumns; ++i) s += ", " + prefix + "_" + kOptimizerFields[i];
  return s;
}

void BindOptimizer(Statement& st, const OptimizerConfig& o) {
  st.Int(static_cast<int>(o.type))
      .Real(o.learning_rate)
      .Real(o.momentum)
      .Real(o.weight_decay)
      .Real(o.beta1)
      .Real(o.beta2)
      .Real(o.epsilon)
      .Real(o.initial_accumulator)
      .Int(static_cast<int>(o.reduction));
}

OptimizerConfig ReadOptimizer(const Statement& st, int first) {
  OptimizerConfig o;
  o.type = static_cast<OptimizerType>(st.ColInt(first));
  o.learning_rate = st.ColReal(first + 1);
  o.momentum = st.ColReal(first + 2);
  o.weight_decay = st.ColReal(first + 3);
  o.beta1 = st.ColReal(first + 4);
  o.beta2 = st.ColReal(first + 5);
  o.epsilon = st.ColReal(first + 6);
  o.initial_accumulator = st.ColReal(first + 7);
  o.reduction = static_cast<Reduction>(st.ColInt(first + 8));
  return o;
}

// KeyInfo::participants as stored: "0,2,5" ("" for every worker).
std::string ParticipantsColumn(const std::vector<uint32_t>& ranks) {
  std::string text;
  for (uint32_t r : ranks) {
    if (!text.empty()) text += ',';
    text += std::to_string(r);
  }
  return text;
}

// The inverse; false for text that is not strictly ascending decimal ranks.
bool ParseParticipants(const std::string& text, std::vector<uint32_t>* ranks) {
  ranks->clear();
  size_t at = 0;
  while (at < text.size()) {
    uint32_t r = 0;
    const auto [end, ec] = std::from_chars(text.data() + at, text.data() + text.size(), r);
    if (ec != std::errc() || (!ranks->empty() && r <= ranks->back())) return false;
    ranks->push_back(r);
    at = static_cast<size_t>(end - text.data());
    if (at < text.size() && (text[at] != ',' || at + 1 == text.size())) return false;
    if (at < text.size()) ++at;
  }
  return true;
}

// --- Schema migrations ---------------------------------------------------
// kMigrations[v] upgrades a database of user_version v to v + 1; Open runs
// them in order inside one transaction. A new schema version appends one
// function here and bumps kSchemaVersion; old ones never change.

Status MigrateV0ToV1(sqlite3* db) {
  const std::string sql =
      "CREATE TABLE meta (\n"
      "  name TEXT PRIMARY KEY,\n"
      "  value INTEGER NOT NULL\n"
      ");\n"
      "INSERT INTO meta (name, value) VALUES ('next_tenant_handle', 1);\n"
      "CREATE TABLE tenants (\n"
      "  handle INTEGER PRIMARY KEY,\n"
      "  name TEXT NOT NULL UNIQUE,\n"
      "  workers_per_rack INTEGER NOT NULL,\n"
      "  chunk_bytes INTEGER NOT NULL,\n"
      "  max_parameter_bytes INTEGER NOT NULL,\n"
      "  max_keys INTEGER NOT NULL,\n"
      "  max_workers INTEGER NOT NULL,\n"
      "  token_salt BLOB NOT NULL,\n"
      "  token_sha256 BLOB NOT NULL,\n"
      "  created_unix_ms INTEGER NOT NULL,\n"
      "  next_key_id INTEGER NOT NULL,\n"
      "  next_chunk INTEGER NOT NULL" +
      OptimizerColumnDefs("default_opt") +
      "\n);\n"
      "CREATE TABLE keys (\n"
      "  tenant_handle INTEGER NOT NULL REFERENCES tenants (handle),\n"
      "  id INTEGER NOT NULL,\n"
      "  name TEXT NOT NULL,\n"
      "  elements INTEGER NOT NULL,\n"
      "  dtype INTEGER NOT NULL,\n"
      "  init_mode INTEGER NOT NULL,\n"
      "  first_chunk INTEGER NOT NULL,\n"
      "  chunk_count INTEGER NOT NULL,\n"
      "  chunk_elements INTEGER NOT NULL" +
      OptimizerColumnDefs("opt") + OptimizerColumnDefs("base_opt") +
      ",\n  opt_from_update INTEGER NOT NULL,\n"
      "  PRIMARY KEY (tenant_handle, id),\n"
      "  UNIQUE (tenant_handle, name)\n"
      ");\n";
  return Exec(db, sql);
}

// v2: Quotas::weight (the lanes' fair share); existing tenants get 1.
Status MigrateV1ToV2(sqlite3* db) {
  return Exec(db, "ALTER TABLE tenants ADD COLUMN weight INTEGER NOT NULL DEFAULT 1;");
}

// v3: row-sparse tables (rows x dim, RANDOM init's scale and seed); existing
// keys are dense (rows 0).
Status MigrateV2ToV3(sqlite3* db) {
  return Exec(db,
              "ALTER TABLE keys ADD COLUMN rows INTEGER NOT NULL DEFAULT 0;\n"
              "ALTER TABLE keys ADD COLUMN dim INTEGER NOT NULL DEFAULT 0;\n"
              "ALTER TABLE keys ADD COLUMN init_scale REAL NOT NULL DEFAULT 0;\n"
              "ALTER TABLE keys ADD COLUMN init_seed INTEGER NOT NULL DEFAULT 0;");
}

// v4: tenants' consistency mode and staleness bound (existing tenants are
// sync: 0), keys' top-k ratio (existing keys are dense: 0).
Status MigrateV3ToV4(sqlite3* db) {
  return Exec(db,
              "ALTER TABLE tenants ADD COLUMN consistency INTEGER NOT NULL DEFAULT 0;\n"
              "ALTER TABLE tenants ADD COLUMN staleness INTEGER NOT NULL DEFAULT 0;\n"
              "ALTER TABLE keys ADD COLUMN topk_ratio REAL NOT NULL DEFAULT 0;");
}

// v5: elastic tenants (docs/elastic.md); existing tenants are not (0).
Status MigrateV4ToV5(sqlite3* db) {
  return Exec(db,
              "ALTER TABLE tenants ADD COLUMN elastic INTEGER NOT NULL DEFAULT 0;\n"
              "ALTER TABLE tenants ADD COLUMN min_workers INTEGER NOT NULL DEFAULT 0;");
}

// v6: keys' participant sets, as ascending decimal ranks joined by commas
// (existing keys sum every worker: '').
Status MigrateV5ToV6(sqlite3* db) {
  return Exec(db, "ALTER TABLE keys ADD COLUMN participants TEXT NOT NULL DEFAULT '';");
}

using Migration = Status (*)(sqlite3*);
constexpr Migration kMigrations[] = {&MigrateV0ToV1, &MigrateV1ToV2, &MigrateV2ToV3,
                                     &MigrateV3ToV4, &MigrateV4ToV5, &MigrateV5ToV6};
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == RegistryStore::kSchemaVersion,
              "one migration per schema version");

}  // namespace

Result<std::unique_ptr<RegistryStore>> RegistryStore::Open(const std::string& dir,
                                                           std::chrono::milliseconds busy_timeout) {
  if (dir.empty()) return FailedPrecondition("state.dir: is empty (or set state.in_memory)");
  std::error_code ec;
  const auto st = std::filesystem::status(dir, ec);
  if (!std::filesystem::exists(st)) {
    // Parents as usual; the state directory itself private to the daemon.
    const std::filesystem::path p(dir);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return FailedPrecondition("state.dir: cannot create " + dir + ": " + std::strerror(errno) +
                                " (set --state-dir DIR, or --in-memory to keep no state)");
    }
  } else if (!std::filesystem::is_directory(st)) {
    return FailedPrecondition("state.dir: " + dir + " is not a directory");
  }
  // The database and its -wal/-shm files are created in the directory.
  if (access(dir.c_str(), R_OK | W_OK | X_OK) != 0) {
    return FailedPrecondition("state.dir: " + dir + " is not writable: " + std::strerror(errno) +
                              " (set --state-dir DIR, or --in-memory to keep no state)");
  }
  // One daemon per state directory: a second one would write the same
  // database and checkpoints. The lock goes with the process (also on kill -9).
  const std::string lock_path = (std::filesystem::path(dir) / kLockFileName).string();
  const int lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) {
    return FailedPrecondition("state.dir: cannot open " + lock_path + ": " + std::strerror(errno));
  }
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = "";
    const ssize_t n = pread(lock_fd, pid, sizeof pid - 1, 0);
    close(lock_fd);
    std::string holder = n > 0 ? std::string(pid, static_cast<size_t>(n)) : "";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    return FailedPrecondition("state.dir: " + dir + " is in use by another rackhubd" +
                              (holder.empty() ? std::string() : " (pid " + holder + ")") +
                              " (" + lock_path + " is locked)");
  }
  const std::string me = std::to_string(getpid()) + "\n";
  if (ftruncate(lock_fd, 0) != 0 || pwrite(lock_fd, me.data(), me.size(), 0) < 0) {
    // The pid is only for the message above; the lock is what counts.
  }
  // The database is opened without following symlinks (a planted
  // registry.db symlink is refused), but the directory may be one: systemd's
  // StateDirectory= with DynamicUser= makes /var/lib/rackhub a symlink to
  // private/rackhub, and SQLite's NOFOLLOW refuses a symlink anywhere in the
  // path. So the directory is resolved first.
  const std::filesystem::path real_dir = std::filesystem::canonical(dir, ec);
  if (ec) {
    close(lock_fd);
    return FailedPrecondition("state.dir: cannot resolve " + dir + ": " + ec.message());
  }
  const std::string path = (real_dir / kFileName).string();
  // An existing file must open for reading and writing; report why not here
  // (sqlite3 would only say "unable to open database file").
  if (access(path.c_str(), F_OK) == 0) {
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      close(lock_fd);
      return FailedPrecondition("state.dir: " + path +
                                ": cannot open for reading and writing: " + std::strerror(errno));
    }
    close(fd);
  }
  auto store = std::unique_ptr<RegistryStore>(new RegistryStore(path));
  store->lock_fd_ = lock_fd;
  if (Status s = store->Initialize(busy_timeout); !s.ok()) {
    return FailedPrecondition("state.dir: " + path + ": " + s.message());
  }
  return store;
}

Status RegistryStore::Initialize(std::chrono::milliseconds busy_timeout) {
  const int rc = sqlite3_open_v2(
      path_.c_str(), &db_,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX | SQLITE_OPEN_NOFOLLOW,
      nullptr);
  if (rc != SQLITE_OK) {
    return Internal(std::string("cannot open: ") +
                    (db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc)));
  }
  sqlite3_extended_result_codes(db_, 1);
  sqlite3_busy_timeout(db_, static_cast<int>(busy_timeout.count()));
  // The first read of the header: "file is not a database" shows here.
  Result<int64_t> version = PragmaInt(db_, "user_version");
  if (!version.ok()) return version.status();
  if (*version > kSchemaVersion) {
    return Internal("schema version " + std::to_string(*version) +
                    " is newer than this rackhubd understands (" + std::to_string(kSchemaVersion) +
                    "); run the newer rackhubd or restore a matching backup");
  }
  if (*version < 0) return Internal("schema version " + std::to_string(*version) + " is invalid");
  Result<int64_t> app = PragmaInt(db_, "application_id");
  if (!app.ok()) return app.status();
  if (*version > 0 && *app != kApplicationId) {
    return Internal("application_id " + std::to_string(*app) + ": not a rackhub registry");
  }
  if (*version == 0) {
    Statement st(db_, "SELECT count(*) FROM sqlite_master");
    if (st.Step() != SQLITE_ROW) return Internal(sqlite3_errmsg(db_));
    if (st.ColInt(0) != 0) {
      return Internal("holds tables but no schema version: not a rackhub registry");
    }
  } else {
    Statement st(db_, "PRAGMA integrity_check(10)");
    int step = st.Step();
    if (step != SQLITE_ROW) return Internal(std::string("integrity check: ") + sqlite3_errmsg(db_));
    std::string problems;
    for (; step == SQLITE_ROW; step = st.Step()) {
      const std::string line = st.ColText(0);
      if (line == "ok") continue;
      problems += (problems.empty() ? "" : "; ") + line;
    }
    if (step != SQLITE_DONE && step != SQLITE_ROW && problems.empty()) {
      problems = sqlite3_errmsg(db_);
    }
    if (!problems.empty()) return Internal("integrity check failed: " + problems);
  }
  // WAL with synchronous=FULL: a committed transaction is on disk before the
  // admin reply; a crash loses nothing that was acknowledged.
  {
    Statement st(db_, "PRAGMA journal_mode=WAL");
    if (st.Step() != SQLITE_ROW)
      return Internal(std::string("journal_mode: ") + sqlite3_errmsg(db_));
    if (st.ColText(0) != "wal")
      return Internal("journal_mode: WAL is not available: " + st.ColText(0));
  }
  if (Status s = Exec(db_, "PRAGMA synchronous=FULL"); !s.ok()) return s;
  if (Status s = Exec(db_, "PRAGMA foreign_keys=ON"); !s.ok()) return s;
  if (*version < kSchemaVersion) {
    const int64_t from = *version;
    return Transaction(db_, "", "schema upgrade", [&]() -> Status {
      for (int64_t v = from; v < kSchemaVersion; ++v) {
        if (Status m = kMigrations[v](db_); !m.ok()) {
          return Internal("to version " + std::to_string(v + 1) + ": " + m.message());
        }
      }
      if (Status m = Exec(db_, "PRAGMA application_id=" + std::to_string(kApplicationId));
          !m.ok()) {
        return m;
      }
      return Exec(db_, "PRAGMA user_version=" + std::to_string(kSchemaVersion));
    });
  }
  return Status::Ok();
}

RegistryStore::~RegistryStore() {
  sqlite3_close_v2(db_);
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the state directory
}

Result<RegistryStore::Contents> RegistryStore::Load() {
  const auto err = [&](const std::string& what) {
    return FailedPrecondition("state.dir: " + path_ + ": " + what + ": " + sqlite3_errmsg(db_));
  };
  Contents c;
  {
    Statement st(db_, "SELECT value FROM meta WHERE name = 'next_tenant_handle'");
    if (st.Step() != SQLITE_ROW) return err("meta.next_tenant_handle");
    c.next_handle = st.ColU32(0);
  }
  {
    Statement st(db_,
                 "SELECT handle, name, workers_per_rack, chunk_bytes, max_parameter_bytes, "
                 "max_keys, max_workers, token_salt, token_sha256, created_unix_ms, next_key_id, "
                 "next_chunk, weight, consistency, staleness, elastic, min_workers" +
                     OptimizerColumns("default_opt") + " FROM tenants ORDER BY handle");
    int rc;
    while ((rc = st.Step()) == SQLITE_ROW) {
      TenantRow t;
      t.info.handle = st.ColU32(0);
      t.info.name = st.ColText(1);
      t.info.workers_per_rack = st.ColU32(2);
      t.info.chunk_bytes = st.ColU32(3);
      t.info.quotas.max_parameter_bytes = st.ColU64(4);
      t.info.quotas.max_keys = st.ColU32(5);
      t.info.quotas.max_workers = st.ColU32(6);
      if (!st.ColBlob(7, t.token.salt.data(), t.token.salt.size()) ||
          !st.ColBlob(8, t.token.hash.data(), t.token.hash.size())) {
        return FailedPrecondition("state.dir: " + path_ + ": tenant '" + t.info.name +
                                  "': token hash has the wrong size");
      }
      t.info.created_unix_ms = st.ColInt(9);
      t.next_key_id = st.ColU32(10);
      t.next_chunk = st.ColU64(11);
      t.info.quotas.weight = st.ColU32(12);
      t.info.consistency = static_cast<Consistency>(st.ColInt(13));
      t.info.staleness = st.ColU32(14);
      t.info.elastic = st.ColInt(15) != 0;
      t.info.min_workers = st.ColU32(16);
      t.info.default_optimizer = ReadOptimizer(st, 17);
      c.tenants.push_back(std::move(t));
    }
    if (rc != SQLITE_DONE) return err("tenants");
  }
  {
    Statement st(db_,
                 "SELECT tenant_handle, id, name, elements, dtype, init_mode, first_chunk, "
                 "chunk_count, chunk_elements, opt_from_update, rows, dim, init_scale, "
                 "init_seed, topk_ratio" +
                     OptimizerColumns("opt") + OptimizerColumns("base_opt") +
                     ", participants FROM keys ORDER BY tenant_handle, id");
    int rc;
    while ((rc = st.Step()) == SQLITE_ROW) {
      KeyRow k;
      k.tenant_handle = st.ColU32(0);
      k.key.id = st.ColU32(1);
      k.key.name = st.ColText(2);
      k.key.elements = st.ColU64(3);
      k.key.dtype = static_cast<WireDType>(st.ColInt(4));
      k.key.init = static_cast<InitMode>(st.ColInt(5));
      k.key.placement.first_chunk = st.ColU64(6);
      k.key.placement.chunk_count = st.ColU64(7);
      k.key.chunk_elements = st.ColU32(8);
      k.key.schedule.from_update = st.ColU64(9);
      k.key.rows = st.ColU64(10);
      k.key.dim = st.ColU32(11);
      k.key.init_scale = static_cast<float>(st.ColReal(12));
      k.key.init_seed = st.ColU64(13);
      k.key.topk_ratio = st.ColReal(14);
      k.key.optimizer = ReadOptimizer(st, 15);
      k.key.schedule.latest = k.key.optimizer;
      k.key.schedule.base = ReadOptimizer(st, 15 + kOptimizerColumns);
      if (!ParseParticipants(st.ColText(15 + 2 * kOptimizerColumns), &k.key.participants)) {
        return FailedPrecondition("state.dir: " + path_ + ": keys: key '" + k.key.name +
                                  "' has participants '" +
                                  st.ColText(15 + 2 * kOptimizerColumns) +
                                  "', not ascending ranks joined by commas");
      }
      c.keys.push_back(std::move(k));
    }
    if (rc != SQLITE_DONE) return err("keys");
  }
  return c;
}

Status RegistryStore::InsertTenant(const TenantRow& t, uint32_t next_handle, int64_t* revision) {
  *revision = 0;
  return Transaction(
      db_, "state.dir: " + path_ + ": ", "create tenant '" + t.info.name + "'", [&]() -> Status {
        Statement st(db_,
                     "INSERT INTO tenants (handle, name, workers_per_rack, chunk_bytes, "
                     "max_parameter_bytes, max_keys, max_workers, token_salt, token_sha256, "
                     "created_unix_ms, next_key_id, next_chunk, weight, consistency, staleness, "
                     "elastic, min_workers" +
                         OptimizerColumns("default_opt") + ") VALUES (" +
                         Placeholders(17 + kOptimizerColumns) + ")");
        st.Int(t.info.handle)
            .Text(t.info.name)
            .Int(t.info.workers_per_rack)
            .Int(t.info.chunk_bytes)
            .U64(t.info.quotas.max_parameter_bytes)
            .Int(t.info.quotas.max_keys)
            .Int(t.info.quotas.max_workers)
            .Blob(t.token.salt.data(), t.token.salt.size())
            .Blob(t.token.hash.data(), t.token.hash.size())
            .Int(t.info.created_unix_ms)
            .Int(t.next_key_id)
            .U64(t.next_chunk)
            .Int(t.info.quotas.weight)
            .Int(static_cast<int>(t.info.consistency))
            .Int(t.info.staleness)
            .Int(t.info.elastic ? 1 : 0)
            .Int(t.info.min_workers);
        BindOptimizer(st, t.info.default_optimizer);
        if (Status s = st.Run("insert tenant"); !s.ok()) return s;
        Statement meta(db_, "UPDATE meta SET value = ? WHERE name = 'next_tenant_handle'");
        meta.Int(next_handle);
        return meta.Run("update meta");
      });
}

Status RegistryStore::UpdateQuotas(const TenantRow& tenant, int64_t* revision) {
  *revision = 0;
  const Quotas& q = tenant.info.quotas;
  const uint32_t handle = tenant.info.handle;
  return Transaction(db_, "state.dir: " + path_ + ": ", "update quotas", [&]() -> Status {
    Statement st(db_,
                 "UPDATE tenants SET max_parameter_bytes = ?, max_keys = ?, max_workers = ?, "
                 "weight = ? WHERE handle = ?");
    st.U64(q.max_parameter_bytes).Int(q.max_keys).Int(q.max_workers).Int(q.weight).Int(handle);
    return st.Run("update tenant");
  });
}

Status RegistryStore::DeleteTenant(const TenantRow& tenant, int64_t* revision) {
  *revision = 0;
  const uint32_t handle = tenant.info.handle;
  return Transaction(db_, "state.dir: " + path_ + ": ", "delete tenant", [&]() -> Status {
    Statement keys(db_, "DELETE FROM keys WHERE tenant_handle = ?");
    keys.Int(handle);
    if (Status s = keys.Run("delete keys"); !s.ok()) return s;
    Statement st(db_, "DELETE FROM tenants WHERE handle = ?");
    st.Int(handle);
    return st.Run("delete tenant");
  });
}

Status RegistryStore::InsertKey(const TenantRow& tenant, const KeyInfo& k, int64_t* revision) {
  *revision = 0;
  const uint32_t handle = tenant.info.handle;
  const uint32_t next_key_id = tenant.next_key_id;
  const uint64_t next_chunk = tenant.next_chunk;
  return Transaction(
      db_, "state.dir: " + path_ + ": ", "create key '" + k.name + "'", [&]() -> Status {
        Statement st(db_,
                     "INSERT INTO keys (tenant_handle, id, name, elements, dtype, init_mode, "
                     "first_chunk, chunk_count, chunk_elements, opt_from_update, rows, dim, "
                     "init_scale, init_seed, topk_ratio" +
                         OptimizerColumns("opt") + OptimizerColumns("base_opt") +
                         ", participants) VALUES (" + Placeholders(16 + 2 * kOptimizerColumns) +
                         ")");
        st.Int(handle)
            .Int(k.id)
            .Text(k.name)
            .U64(k.elements)
            .Int(static_cast<int>(k.dtype))
            .Int(static_cast<int>(k.init))
            .U64(k.placement.first_chunk)
            .U64(k.placement.chunk_count)
            .Int(k.chunk_elements)
            .U64(k.schedule.from_update)
            .U64(k.rows)
            .Int(k.dim)
            .Real(k.init_scale)
            .U64(k.init_seed)
            .Real(k.topk_ratio);
        BindOptimizer(st, k.optimizer);
        BindOptimizer(st, k.schedule.base);
        st.Text(ParticipantsColumn(k.participants));
        if (Status s = st.Run("insert key"); !s.ok()) return s;
        Statement t(db_, "UPDATE tenants SET next_key_id = ?, next_chunk = ? WHERE handle = ?");
        t.Int(next_key_id).U64(next_chunk).Int(handle);
        return t.Run("update tenant");
      });
}

Status RegistryStore::DeleteKey(const TenantRow& tenant, const KeyInfo& key, int64_t,
                                int64_t* revision) {
  *revision = 0;
  const uint32_t handle = tenant.info.handle;
  const uint32_t key_id = key.id;
  return Transaction(db_, "state.dir: " + path_ + ": ", "delete key", [&]() -> Status {
    Statement st(db_, "DELETE FROM keys WHERE tenant_handle = ? AND id = ?");
    st.Int(handle).Int(key_id);
    return st.Run("delete key");
  });
}

Status RegistryStore::UpdateOptimizer(const TenantRow& tenant, const KeyInfo& k, int64_t,
                                      int64_t* revision) {
  *revision = 0;
  const uint32_t handle = tenant.info.handle;
  return Transaction(
      db_, "state.dir: " + path_ + ": ", "set optimizer of key '" + k.name + "'", [&]() -> Status {
        std::string set;
        for (int i = 0; i < kOptimizerColumns; ++i) {
          set += std::string(i ? ", " : "") + "opt_" + kOptimizerFields[i] + " = ?, base_opt_" +
                 kOptimizerFields[i] + " = ?";
        }
        Statement st(db_, "UPDATE keys SET " + set +
                              ", opt_from_update = ? WHERE tenant_handle = ? AND id = ?");
        // Interleaved: opt_x, base_opt_x for each field.
        const OptimizerConfig& a = k.optimizer;
        const OptimizerConfig& b = k.schedule.base;
        st.Int(static_cast<int>(a.type)).Int(static_cast<int>(b.type));
        st.Real(a.learning_rate).Real(b.learning_rate);
        st.Real(a.momentum).Real(b.momentum);
        st.Real(a.weight_decay).Real(b.weight_decay);
        st.Real(a.beta1).Real(b.beta1);
        st.Real(a.beta2).Real(b.beta2);
        st.Real(a.epsilon).Real(b.epsilon);
        st.Real(a.initial_accumulator).Real(b.initial_accumulator);
        st.Int(static_cast<int>(a.reduction)).Int(static_cast<int>(b.reduction));
        st.U64(k.schedule.from_update).Int(handle).Int(k.id);
        return st.Run("update key");
      });
}

}  // namespace rackhub::server
