// A thin layer over SQLite for the registry's store (registry_store.cc):
// Statement (a prepared statement with positional binding and typed column
// reads), Exec, Transaction (one BEGIN IMMEDIATE .. COMMIT, rolled back on
// failure), PragmaInt and Placeholders. Private to server/state/.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "rackhub/common/status.h"

namespace rackhub::server::sqlite {

// A prepared statement with positional binding (1, 2, ... in call order).
// Finalized by the destructor.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  bool prepared() const { return rc_ == SQLITE_OK && stmt_; }
  Statement& Int(int64_t v) {
    if (prepared()) Check(sqlite3_bind_int64(stmt_, ++bound_, v));
    return *this;
  }
  Statement& U64(uint64_t v) { return Int(static_cast<int64_t>(v)); }  // bits preserved
  Statement& Real(double v) {
    if (prepared()) Check(sqlite3_bind_double(stmt_, ++bound_, v));
    return *this;
  }
  Statement& Text(const std::string& v) {
    if (prepared())
      Check(sqlite3_bind_text(stmt_, ++bound_, v.data(), static_cast<int>(v.size()),
                              SQLITE_TRANSIENT));
    return *this;
  }
  Statement& Blob(const void* data, size_t size) {
    if (prepared())
      Check(sqlite3_bind_blob(stmt_, ++bound_, data, static_cast<int>(size), SQLITE_TRANSIENT));
    return *this;
  }
  // SQLITE_ROW: a row is available; SQLITE_DONE: finished; else an error.
  int Step() {
    if (!prepared() || rc_ != SQLITE_OK) return rc_ == SQLITE_OK ? SQLITE_ERROR : rc_;
    return sqlite3_step(stmt_);
  }
  // Runs to completion; OK or the error message.
  Status Run(const std::string& what) {
    const int rc = Step();
    if (rc == SQLITE_DONE || rc == SQLITE_ROW) return Status::Ok();
    return Internal(what + ": " + sqlite3_errmsg(db_));
  }

  int64_t ColInt(int i) const { return sqlite3_column_int64(stmt_, i); }
  uint64_t ColU64(int i) const { return static_cast<uint64_t>(ColInt(i)); }
  uint32_t ColU32(int i) const { return static_cast<uint32_t>(ColInt(i)); }
  double ColReal(int i) const { return sqlite3_column_double(stmt_, i); }
  std::string ColText(int i) const {
    const auto* p = sqlite3_column_text(stmt_, i);
    return p ? std::string(reinterpret_cast<const char*>(p),
                           static_cast<size_t>(sqlite3_column_bytes(stmt_, i)))
             : std::string();
  }
  // Copies a blob column into `out` if the sizes match.
  bool ColBlob(int i, void* out, size_t size) const {
    const void* p = sqlite3_column_blob(stmt_, i);
    if (!p || static_cast<size_t>(sqlite3_column_bytes(stmt_, i)) != size) return false;
    std::memcpy(out, p, size);
    return true;
  }

 private:
  void Check(int rc) {
    if (rc != SQLITE_OK && rc_ == SQLITE_OK) rc_ = rc;
  }
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_OK;
  int bound_ = 0;
};

inline Status Exec(sqlite3* db, const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) == SQLITE_OK) return Status::Ok();
  std::string msg = err ? err : sqlite3_errmsg(db);
  sqlite3_free(err);
  return Internal(msg);
}

inline std::string Placeholders(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += i ? ", ?" : "?";
  return s;
}

// Runs `body` in one write transaction (BEGIN IMMEDIATE .. COMMIT); rolls
// back on any failure.
// `prefix` goes in front of the error message.
template <typename Body>
Status Transaction(sqlite3* db, const std::string& prefix, const std::string& what, Body&& body) {
  auto fail = [&](const Status& s) {
    if (!sqlite3_get_autocommit(db)) sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    return Internal(prefix + what + ": " + s.message());
  };
  if (Status s = Exec(db, "BEGIN IMMEDIATE"); !s.ok()) return fail(s);
  if (Status s = body(); !s.ok()) return fail(s);
  if (Status s = Exec(db, "COMMIT"); !s.ok()) return fail(s);
  return Status::Ok();
}

inline Result<int64_t> PragmaInt(sqlite3* db, const std::string& pragma) {
  Statement st(db, "PRAGMA " + pragma);
  const int rc = st.Step();
  if (rc == SQLITE_ROW) return st.ColInt(0);
  return Internal(sqlite3_errmsg(db));
}

}  // namespace rackhub::server::sqlite
