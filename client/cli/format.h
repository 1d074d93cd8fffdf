// rackhubctl output: aligned tables, `field: value` blocks, human-readable
// byte counts, lowercase enum names, and the --json rendering of responses.
#pragma once

#include <google/protobuf/message.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "rackhub/admin/v1/admin.pb.h"
#include "rackhub/common/status.h"

namespace rackhub::cli {

namespace admin = ::rackhub::admin::v1;

// "512 B", "32 KiB", "78.1 KiB", "1.5 GiB".
std::string HumanBytes(uint64_t bytes);
// "33554432 (32 MiB)"; counts under 1 KiB are printed alone ("512").
std::string BytesWithHuman(uint64_t bytes);
// Shortest round-trip decimal form of a double ("0.01", "1e-08", "10").
std::string FormatNumber(double value);
// "1h 2m 3s" style for a duration in milliseconds.
std::string HumanDuration(int64_t ms);
// "2024-05-01 12:00:00 UTC" for a Unix time in ms ("-" for 0).
std::string FormatUnixMs(int64_t ms);

// The lowercase names of an enum's values, spelled as the command line
// accepts them: the one table both parsing (Choice, OneOfValidator over
// Names) and printing (the *Name functions below) use. The UNSPECIFIED value
// (0) has no entry.
template <typename Enum>
using NameTable = std::vector<std::pair<std::string, Enum>>;
extern const NameTable<admin::DType> kDTypeNames;
extern const NameTable<admin::OptimizerType> kOptimizerTypeNames;
extern const NameTable<admin::GradientReduction> kReductionNames;
extern const NameTable<admin::InitMode> kInitModeNames;

// A value's name from its table: "unspecified" for 0, "unknown(N)" for a
// value the table does not know.
std::string DTypeName(admin::DType dtype);
std::string OptimizerTypeName(admin::OptimizerType type);
std::string ReductionName(admin::GradientReduction reduction);
std::string InitModeName(admin::InitMode init);
// "adam lr=0.001 beta1=0.9 ... reduction=mean" (only the non-zero fields).
std::string DescribeOptimizer(const admin::Optimizer& optimizer);

// Left-aligned `label: value` lines with the values in one column.
class FieldBlock {
 public:
  void Add(std::string label, std::string value);
  void Print(std::ostream& out, const std::string& indent = "") const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

// A table with a header row; columns are padded to their widest cell.
// Numeric columns are right-aligned.
class Table {
 public:
  struct Column {
    std::string header;
    bool right_aligned = false;
  };
  explicit Table(std::vector<Column> columns);
  void AddRow(std::vector<std::string> cells);
  bool empty() const { return rows_.empty(); }
  // Every line starts with `indent`. A table without rows prints the line
  // `none` instead ("no tenants"), if one is given.
  void Print(std::ostream& out, const std::string& indent = "", const std::string& none = "") const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// The titled part of a rendering that follows its FieldBlock, e.g. key get's
// chunk layout: a blank line, "<title>:" and `table` indented by two spaces;
// nothing if the table has no rows.
void PrintSection(std::ostream& out, const std::string& title, const Table& table);

// Human renderings of the admin API's messages.
void PrintTenant(std::ostream& out, const admin::Tenant& tenant);
void PrintTenantList(std::ostream& out, const admin::ListTenantsResponse& response);
// With `chunks` the chunk layout table follows (if the key carries chunks).
void PrintKey(std::ostream& out, const admin::Key& key, bool chunks);
void PrintKeyList(std::ostream& out, const std::string& tenant,
                  const admin::ListKeysResponse& response);
void PrintStats(std::ostream& out, const admin::GetStatsResponse& response);

// One JSON document (proto field names, every field printed) and a newline.
// INTERNAL if the message cannot be converted (nothing is printed then).
Status PrintJson(std::ostream& out, const google::protobuf::Message& message);

}  // namespace rackhub::cli
