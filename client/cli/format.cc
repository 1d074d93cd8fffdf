#include "format.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <stdexcept>
#include <string_view>

namespace rackhub::cli {
namespace {

std::string YesNo(bool value) { return value ? "yes" : "no"; }

// A quota value: 0 means "the daemon's default".
std::string QuotaValue(uint64_t value, bool bytes) {
  if (value == 0) return "0 (daemon default)";
  return bytes ? BytesWithHuman(value) : std::to_string(value);
}

// "adamw lr=0.001": the type and learning rate, for tables.
std::string ShortOptimizer(const admin::Optimizer& o) {
  std::string out = OptimizerTypeName(o.type());
  if (o.learning_rate() != 0) out += " lr=" + FormatNumber(o.learning_rate());
  return out;
}

template <typename Enum>
std::string NameOf(const NameTable<Enum>& table, Enum value) {
  for (const auto& [name, v] : table) {
    if (v == value) return name;
  }
  const int number = static_cast<int>(value);
  return number == 0 ? "unspecified" : "unknown(" + std::to_string(number) + ")";
}

}  // namespace

std::string HumanBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  uint64_t whole = bytes;
  while (whole >= 1024 && unit < 6) {
    whole /= 1024;
    ++unit;
  }
  if (unit == 0) return std::to_string(bytes) + " B";
  const uint64_t divisor = uint64_t{1} << (10 * unit);
  if (bytes % divisor == 0) return std::to_string(bytes / divisor) + " " + kUnits[unit];
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f %s", static_cast<double>(bytes) / static_cast<double>(divisor),
                kUnits[unit]);
  return buf;
}

std::string BytesWithHuman(uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes);
  return std::to_string(bytes) + " (" + HumanBytes(bytes) + ")";
}

std::string FormatNumber(double value) {
  // Shortest round-trip digits; plain decimals for ordinary magnitudes
  // ("0.0003", "10"), scientific without exponent padding otherwise ("1e-8").
  char buf[64];
  const double magnitude = std::fabs(value);
  const bool fixed = value == 0 || (magnitude >= 1e-4 && magnitude < 1e15);
  const auto [ptr, ec] =
      std::to_chars(buf, buf + sizeof buf, value,
                    fixed ? std::chars_format::fixed : std::chars_format::scientific);
  if (ec != std::errc()) return "?";
  std::string text(buf, ptr);
  if (const auto e = text.find('e'); e != std::string::npos) {
    size_t digits = e + 1;
    if (digits < text.size() && (text[digits] == '-' || text[digits] == '+')) {
      if (text[digits] == '+') text.erase(digits, 1);
      else ++digits;
    }
    while (digits + 1 < text.size() && text[digits] == '0') text.erase(digits, 1);
  }
  return text;
}

std::string HumanDuration(int64_t ms) {
  if (ms < 0) ms = 0;
  int64_t s = ms / 1000;
  const int64_t d = s / 86400;
  s %= 86400;
  const int64_t h = s / 3600;
  s %= 3600;
  const int64_t m = s / 60;
  s %= 60;
  std::string out;
  if (d > 0) out += std::to_string(d) + "d ";
  if (d > 0 || h > 0) out += std::to_string(h) + "h ";
  if (d > 0 || h > 0 || m > 0) out += std::to_string(m) + "m ";
  out += std::to_string(s) + "s";
  return out;
}

std::string FormatUnixMs(int64_t ms) {
  if (ms <= 0) return "-";
  const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  if (gmtime_r(&seconds, &tm) == nullptr) return std::to_string(ms);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

const NameTable<admin::DType> kDTypeNames = {
    {"fp32", admin::FP32}, {"fp16", admin::FP16}, {"bf16", admin::BF16}};
const NameTable<admin::OptimizerType> kOptimizerTypeNames = {
    {"sgd", admin::SGD},          {"momentum", admin::MOMENTUM}, {"nesterov", admin::NESTEROV},
    {"adam", admin::ADAM},        {"adamw", admin::ADAMW},       {"adagrad", admin::ADAGRAD},
    {"sum-only", admin::SUM_ONLY}};
const NameTable<admin::GradientReduction> kReductionNames = {
    {"mean", admin::MEAN}, {"sum", admin::SUM},         {"min", admin::MIN},
    {"max", admin::MAX},   {"product", admin::PRODUCT}};
const NameTable<admin::InitMode> kInitModeNames = {
    {"zeros", admin::ZEROS}, {"client", admin::FROM_CLIENT}, {"random", admin::RANDOM}};

std::string DTypeName(admin::DType dtype) { return NameOf(kDTypeNames, dtype); }
std::string OptimizerTypeName(admin::OptimizerType type) {
  return NameOf(kOptimizerTypeNames, type);
}
std::string ReductionName(admin::GradientReduction reduction) {
  return NameOf(kReductionNames, reduction);
}
std::string InitModeName(admin::InitMode init) { return NameOf(kInitModeNames, init); }

std::string DescribeOptimizer(const admin::Optimizer& o) {
  std::string out = OptimizerTypeName(o.type());
  const auto add = [&out](const char* name, double value) {
    if (value != 0) out += std::string(" ") + name + "=" + FormatNumber(value);
  };
  add("lr", o.learning_rate());
  add("momentum", o.momentum());
  add("weight-decay", o.weight_decay());
  add("beta1", o.beta1());
  add("beta2", o.beta2());
  add("epsilon", o.epsilon());
  add("initial-accumulator", o.initial_accumulator());
  out += " reduction=" + ReductionName(o.reduction());
  return out;
}

void FieldBlock::Add(std::string label, std::string value) {
  fields_.emplace_back(std::move(label), std::move(value));
}

void FieldBlock::Print(std::ostream& out, const std::string& indent) const {
  size_t width = 0;
  for (const auto& [label, value] : fields_) width = std::max(width, label.size() + 1);
  for (const auto& [label, value] : fields_) {
    out << indent << label << ':' << std::string(width - label.size(), ' ') << value << '\n';
  }
}

Table::Table(std::vector<Column> columns) : columns_(std::move(columns)) {}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(columns_.size());
  rows_.push_back(std::move(cells));
}

void Table::Print(std::ostream& out, const std::string& indent, const std::string& none) const {
  if (empty() && !none.empty()) {
    out << indent << none << '\n';
    return;
  }
  std::vector<size_t> widths(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) {
    widths[c] = columns_[c].header.size();
    for (const auto& row : rows_) widths[c] = std::max(widths[c], row[c].size());
  }
  const auto print_row = [&](const std::vector<std::string>& cells, bool header) {
    std::string line = indent;
    for (size_t c = 0; c < columns_.size(); ++c) {
      const std::string pad(widths[c] - cells[c].size(), ' ');
      const bool last = c + 1 == columns_.size();
      if (columns_[c].right_aligned && !header) {
        line += pad + cells[c];
      } else {
        line += cells[c];
        if (!last) line += pad;
      }
      if (!last) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << '\n';
  };
  std::vector<std::string> headers;
  for (const auto& column : columns_) headers.push_back(column.header);
  print_row(headers, true);
  for (const auto& row : rows_) print_row(row, false);
}

void PrintSection(std::ostream& out, const std::string& title, const Table& table) {
  if (table.empty()) return;
  out << "\n" << title << ":\n";
  table.Print(out, "  ");
}

void PrintTenant(std::ostream& out, const admin::Tenant& t) {
  FieldBlock block;
  block.Add("name", t.name());
  block.Add("handle", std::to_string(t.handle()));
  block.Add("workers per rack", std::to_string(t.workers_per_rack()));
  block.Add("chunk bytes", BytesWithHuman(t.chunk_bytes()));
  block.Add("default optimizer", DescribeOptimizer(t.default_optimizer()));
  block.Add("max parameter bytes", QuotaValue(t.quotas().max_parameter_bytes(), true));
  block.Add("max keys", QuotaValue(t.quotas().max_keys(), false));
  block.Add("max workers", QuotaValue(t.quotas().max_workers(), false));
  block.Add("weight", std::to_string(t.quotas().weight()));
  block.Add("consistency", t.consistency() == admin::BOUNDED
                               ? "bounded:" + std::to_string(t.staleness())
                           : t.consistency() == admin::ASYNC ? std::string("async")
                                                             : std::string("sync"));
  if (t.elastic()) {
    block.Add("elastic", "ranks 0.." + std::to_string(t.quotas().max_workers() - 1) +
                             ", start quorum " + std::to_string(t.workers_per_rack()) +
                             " (x racks, in total), min " + std::to_string(t.min_workers()));
    block.Add("membership", "generation " + std::to_string(t.membership_generation()) + ", " +
                                std::to_string(t.members()) + " member" +
                                (t.members() == 1 ? "" : "s"));
    block.Add("status", t.paused() ? "PAUSED (fewer members than " +
                                         (t.membership_generation() == 0
                                              ? "the start quorum " +
                                                    std::to_string(t.workers_per_rack()) +
                                                    " x racks"
                                              : "min " + std::to_string(t.min_workers())) +
                                         "; pushes are held until enough ranks are back)"
                                   : std::string("running"));
  }
  block.Add("keys", std::to_string(t.key_count()));
  block.Add("parameter bytes", BytesWithHuman(t.parameter_bytes()));
  // What the quota counts: parameters x2, optimizer state, accumulators, ...
  block.Add("memory bytes", BytesWithHuman(t.memory_bytes()));
  block.Add("chunks allocated", std::to_string(t.chunk_count()));
  block.Add("created", FormatUnixMs(t.created_unix_ms()));
  block.Print(out);
}

void PrintTenantList(std::ostream& out, const admin::ListTenantsResponse& response) {
  Table table({{"NAME"},
               {"HANDLE", true},
               {"WORKERS", true},
               {"CHUNK-BYTES", true},
               {"KEYS", true},
               {"MAX-KEYS", true},
               {"PARAMETER-BYTES", true},
               {"MAX-PARAMETER-BYTES", true},
               {"OPTIMIZER"}});
  for (const auto& t : response.tenants()) {
    table.AddRow({t.name(), std::to_string(t.handle()), std::to_string(t.workers_per_rack()),
                  BytesWithHuman(t.chunk_bytes()), std::to_string(t.key_count()),
                  t.quotas().max_keys() == 0 ? "default" : std::to_string(t.quotas().max_keys()),
                  BytesWithHuman(t.parameter_bytes()),
                  t.quotas().max_parameter_bytes() == 0
                      ? "default"
                      : BytesWithHuman(t.quotas().max_parameter_bytes()),
                  ShortOptimizer(t.default_optimizer())});
  }
  table.Print(out, "", "no tenants");
}

void PrintKey(std::ostream& out, const admin::Key& k, bool chunks) {
  FieldBlock block;
  block.Add("tenant", k.tenant());
  block.Add("name", k.name());
  block.Add("id", std::to_string(k.id()));
  block.Add("elements", std::to_string(k.elements()));
  if (k.rows() > 0) {
    block.Add("table", std::to_string(k.rows()) + " rows x " + std::to_string(k.dim()) + ", " +
                           std::to_string(k.rows_per_chunk()) + " rows per chunk");
  }
  block.Add("dtype", DTypeName(k.dtype()));
  if (k.topk_ratio() > 0) {
    std::ostringstream ratio;  // the ratio as declared (a hub before it: the float's)
    if (k.topk_ratio_exact() != 0) {
      char buf[40];  // the shortest decimal that reads back as the double
      const auto end = std::to_chars(buf, buf + sizeof buf, k.topk_ratio_exact()).ptr;
      ratio << "topk:" << std::string_view(buf, end - buf);
    } else {
      ratio << "topk:" << k.topk_ratio();
    }
    block.Add("compression", ratio.str());
  }
  if (k.participants_size() > 0) {  // a participant set (docs/wire-protocol.md section 5)
    std::string ranks;
    for (uint32_t r : k.participants()) {
      if (!ranks.empty()) ranks += ',';
      ranks += std::to_string(r);
    }
    block.Add("participants", ranks);
  }
  block.Add("optimizer", DescribeOptimizer(k.optimizer()) +
                             (k.rows() > 0 && k.optimizer().type() == admin::ADAGRAD
                                  ? " (row-wise on tables)"
                                  : ""));
  if (k.init() == admin::RANDOM) {
    std::ostringstream init;
    init << "random (scale " << k.init_scale() << ", seed " << k.init_seed() << ")";
    block.Add("init", init.str());
  } else {
    block.Add("init", InitModeName(k.init()));
  }
  block.Add("ready", YesNo(k.ready()));
  block.Add("parameter bytes", BytesWithHuman(k.parameter_bytes()));
  block.Add("memory bytes", BytesWithHuman(k.memory_bytes()));
  block.Add("chunk elements", std::to_string(k.chunk_elements()));
  block.Add("chunks", std::to_string(k.chunk_count()) + " (first index " +
                          std::to_string(k.first_chunk()) + ")");
  block.Print(out);
  if (!chunks) return;
  // A table's chunks are row ranges, a dense key's element ranges.
  const bool rows = k.rows() > 0 && k.dim() > 0;
  const uint64_t unit = rows ? k.dim() : 1;
  if (k.lanes_size() > 0) {
    Table lanes({{"LANE", true}, {"CHUNKS", true}, {rows ? "ROWS" : "ELEMENTS", true}});
    for (const auto& l : k.lanes()) {
      lanes.AddRow({std::to_string(l.lane()), std::to_string(l.chunks()),
                    std::to_string(l.elements() / unit)});
    }
    PrintSection(out, "chunks per lane", lanes);
  }
  const uint64_t shown_end = k.chunk_offset() + static_cast<uint64_t>(k.chunks_size());
  const bool partial = k.chunk_offset() > 0 || shown_end < k.chunk_count();
  Table table({{"CHUNK", true},
               {"LANE", true},
               {rows ? "FIRST-ROW" : "FIRST-ELEMENT", true},
               {rows ? "ROWS" : "ELEMENTS", true}});
  for (const auto& c : k.chunks()) {
    table.AddRow({std::to_string(c.index()), std::to_string(c.lane()),
                  std::to_string(c.first_element() / unit), std::to_string(c.elements() / unit)});
  }
  PrintSection(out,
               partial ? "chunk layout (chunks " + std::to_string(k.chunk_offset()) + ".." +
                             std::to_string(shown_end) + " of " + std::to_string(k.chunk_count()) +
                             ")"
                       : "chunk layout",
               table);
  if (shown_end < k.chunk_count()) {
    out << "\n(" << (k.chunk_count() - shown_end) << " more chunks: --chunk-offset " << shown_end
        << ")\n";
  }
}

void PrintKeyList(std::ostream& out, const std::string& tenant,
                  const admin::ListKeysResponse& response) {
  Table table({{"NAME"},
               {"ID", true},
               {"ELEMENTS", true},
               {"DTYPE"},
               {"INIT"},
               {"READY"},
               {"CHUNKS", true},
               {"PARAMETER-BYTES", true},
               {"OPTIMIZER"}});
  for (const auto& k : response.keys()) {
    table.AddRow({k.name(), std::to_string(k.id()), std::to_string(k.elements()),
                  DTypeName(k.dtype()), InitModeName(k.init()), YesNo(k.ready()),
                  std::to_string(k.chunk_count()), BytesWithHuman(k.parameter_bytes()),
                  ShortOptimizer(k.optimizer())});
  }
  table.Print(out, "", "no keys in tenant '" + tenant + "'");
}

void PrintStats(std::ostream& out, const admin::GetStatsResponse& response) {
  const auto& d = response.daemon();
  FieldBlock block;
  block.Add("version", d.version());
  block.Add("uptime", HumanDuration(d.uptime_ms()));
  block.Add("lanes", std::to_string(d.lanes()));
  block.Add("admin listen", d.admin_listen());
  block.Add("data listen", d.data_listen());
  block.Add("tenants", std::to_string(d.tenants()));
  block.Add("keys", std::to_string(d.keys()));
  block.Add("parameter bytes", BytesWithHuman(d.parameter_bytes()));
  block.Add("memory bytes", BytesWithHuman(d.memory_bytes()));
  block.Add("memory bytes allocated", BytesWithHuman(d.memory_bytes_allocated()));
  block.Add("workers connected", std::to_string(d.workers_connected()));
  block.Add("pushes", std::to_string(d.pushes()));
  block.Add("bytes in", BytesWithHuman(d.bytes_in()));
  block.Add("bytes out", BytesWithHuman(d.bytes_out()));
  out << "daemon:\n";
  block.Print(out, "  ");
  out << "\ntenants:\n";
  Table table({{"NAME"},
               {"KEYS", true},
               {"PARAMETER-BYTES", true},
               {"MEMORY-BYTES", true},
               {"MEMORY-ALLOCATED", true},
               {"CHUNKS", true},
               {"WORKERS", true},
               {"PUSHES", true},
               {"ITERATIONS", true},
               {"BYTES-IN", true},
               {"BYTES-OUT", true},
               {"ERRORS", true}});
  for (const auto& t : response.tenants()) {
    table.AddRow({t.name(), std::to_string(t.keys()), BytesWithHuman(t.parameter_bytes()),
                  BytesWithHuman(t.memory_bytes()), BytesWithHuman(t.memory_bytes_allocated()),
                  std::to_string(t.chunks()), std::to_string(t.workers_connected()),
                  std::to_string(t.pushes()), std::to_string(t.iterations_completed()),
                  BytesWithHuman(t.bytes_in()), BytesWithHuman(t.bytes_out()),
                  std::to_string(t.errors())});
  }
  table.Print(out, "  ", "(none)");
}

Status PrintJson(std::ostream& out, const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) return Internal("cannot render the response as JSON: " + status.ToString());
  // add_whitespace output already ends with a newline; keep exactly one.
  while (!json.empty() && json.back() == '\n') json.pop_back();
  out << json << '\n';
  return Status::Ok();
}

}  // namespace rackhub::cli
