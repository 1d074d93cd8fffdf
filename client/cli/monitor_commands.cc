// rackhubctl top and stalls: live figures of a hub and the updates waiting
// for workers, from the admin StatsService (GetStats, ListStalls).
//
// top samples GetStats every --interval and shows what changed in between:
// rates (iterations/s, GB/s), quantiles of the update latency histogram's
// increase, the rank the others waited for most, each lane's busy share (CPU
// time of its thread / wall time). --once samples twice, prints once and
// exits; --json prints that one view as JSON.
#include <poll.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "command_tree.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"

namespace rackhub::cli {
namespace {

using StatsStub = admin::StatsService::Stub;

// ---- Sampling --------------------------------------------------------------

struct Sample {
  admin::GetStatsResponse stats;
  std::chrono::steady_clock::time_point at;
};

Result<Sample> TakeSample(const Invocation& inv, const std::string& tenant) {
  admin::GetStatsRequest request;
  request.set_tenant(tenant);
  Result<admin::GetStatsResponse> stats = Call(inv, &StatsStub::GetStats, request);
  if (!stats.ok()) return stats.status();
  return Sample{*std::move(stats), std::chrono::steady_clock::now()};
}

// Per-bucket counts of `now` minus `before` (counters restart with the
// daemon: then `now` alone).
std::vector<uint64_t> Increase(const admin::LatencyHistogram& now,
                               const admin::LatencyHistogram* before) {
  std::vector<uint64_t> out(now.counts().begin(), now.counts().end());
  if (!before || before->counts_size() != now.counts_size() || before->count() > now.count()) {
    return out;
  }
  for (int i = 0; i < now.counts_size(); ++i) out[i] -= std::min(out[i], before->counts(i));
  return out;
}

// The q-quantile of bucket counts as the upper bound of the bucket holding
// it; NaN without observations.
double Quantile(const std::vector<uint64_t>& counts, const admin::LatencyHistogram& shape,
                double q) {
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
  if (total == 0 || shape.upper_bounds_seconds_size() == 0) return std::nan("");
  uint64_t seen = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    seen += counts[i];
    if (static_cast<double>(seen) >= q * static_cast<double>(total)) {
      const int b = std::min<int>(static_cast<int>(i), shape.upper_bounds_seconds_size() - 1);
      return shape.upper_bounds_seconds(b);
    }
  }
  return shape.upper_bounds_seconds(shape.upper_bounds_seconds_size() - 1);
}

struct TenantView {
  std::string name;
  uint32_t workers = 0;
  double iterations_per_s = 0, gb_in_per_s = 0, gb_out_per_s = 0;
  double p50 = std::nan(""), p99 = std::nan("");  // seconds, over the interval
  int64_t slowest_rack = -1, slowest_rank = -1;   // -1: none in the interval
  double slowest_p99 = std::nan("");
  uint64_t errors = 0;  // during the interval
  // Elastic tenants: "3 (gen 5)", "PAUSED 1 (gen 6)"; "-" otherwise.
  std::string membership = "-";
  bool elastic = false, paused = false;
  uint32_t members = 0;
  uint64_t membership_generation = 0;
};

struct LaneView {
  uint32_t lane = 0;
  int32_t cpu = -1;
  double busy_percent = 0;
};

struct View {
  double seconds = 0;
  std::vector<TenantView> tenants;
  std::vector<LaneView> lanes;
};

View Compare(const Sample& before, const Sample& now) {
  View v;
  v.seconds = std::chrono::duration<double>(now.at - before.at).count();
  const double dt = std::max(v.seconds, 1e-6);
  std::map<std::string, const admin::TenantStats*> old;
  for (const auto& t : before.stats.tenants()) old[t.name()] = &t;
  for (const auto& t : now.stats.tenants()) {
    const admin::TenantStats* b = old.count(t.name()) ? old[t.name()] : nullptr;
    auto delta = [&](uint64_t n, uint64_t o) { return b && o <= n ? n - o : n; };
    TenantView tv;
    tv.name = t.name();
    tv.workers = t.workers_connected();
    if (t.elastic()) {
      tv.elastic = true;
      tv.paused = t.paused();
      tv.members = t.members();
      tv.membership_generation = t.membership_generation();
      tv.membership = std::string(t.paused() ? "PAUSED " : "") + std::to_string(t.members()) +
                      " (gen " + std::to_string(t.membership_generation()) + ")";
    }
    tv.iterations_per_s =
        delta(t.iterations_completed(), b ? b->iterations_completed() : 0) / dt;
    tv.gb_in_per_s = delta(t.bytes_in(), b ? b->bytes_in() : 0) / dt / 1e9;
    tv.gb_out_per_s = delta(t.bytes_out(), b ? b->bytes_out() : 0) / dt / 1e9;
    tv.errors = delta(t.errors(), b ? b->errors() : 0);
    const auto lat = Increase(t.update_latency(), b ? &b->update_latency() : nullptr);
    tv.p50 = Quantile(lat, t.update_latency(), 0.5);
    tv.p99 = Quantile(lat, t.update_latency(), 0.99);
    for (const auto& r : t.ranks()) {
      const admin::LatencyHistogram* o = nullptr;
      if (b) {
        for (const auto& br : b->ranks()) {
          if (br.rack() == r.rack() && br.rank() == r.rank()) o = &br.lateness();
        }
      }
      const double p99 = Quantile(Increase(r.lateness(), o), r.lateness(), 0.99);
      if (!std::isnan(p99) && (std::isnan(tv.slowest_p99) || p99 > tv.slowest_p99)) {
        tv.slowest_p99 = p99;
        tv.slowest_rack = r.rack();
        tv.slowest_rank = r.rank();
      }
    }
    v.tenants.push_back(std::move(tv));
  }
  std::map<uint32_t, double> busy_before;
  for (const auto& l : before.stats.daemon().lane_stats()) busy_before[l.lane()] = l.busy_seconds();
  for (const auto& l : now.stats.daemon().lane_stats()) {
    const double used = l.busy_seconds() - busy_before[l.lane()];
    v.lanes.push_back({l.lane(), l.cpu(), std::clamp(used / dt * 100.0, 0.0, 100.0)});
  }
  return v;
}

// ---- Output ----------------------------------------------------------------

std::string Ms(double seconds) {
  if (std::isnan(seconds)) return "-";
  std::ostringstream s;
  s.precision(seconds < 0.01 ? 2 : 3);
  s << seconds * 1e3;
  return "<=" + s.str() + " ms";
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

void PrintView(std::ostream& out, const View& v, const std::string& admin) {
  out << "rackhub top: " << admin << ", last " << Fixed(v.seconds, 1) << " s (q quits)\n\n";
  Table tenants({{"TENANT"}, {"WORKERS", true}, {"MEMBERS", true}, {"IT/S", true}, {"GB/S IN", true},
                 {"GB/S OUT", true}, {"P50 UPDATE", true}, {"P99 UPDATE", true},
                 {"SLOWEST RANK"}, {"ERRORS", true}});
  for (const auto& t : v.tenants) {
    std::string slowest = "-";
    if (t.slowest_rank >= 0) {
      slowest = (t.slowest_rack > 0 ? "rack " + std::to_string(t.slowest_rack) + " " : "") +
                "rank " + std::to_string(t.slowest_rank) + " (p99 " + Ms(t.slowest_p99) + ")";
    }
    tenants.AddRow({t.name, std::to_string(t.workers), t.membership, Fixed(t.iterations_per_s, 1),
                    Fixed(t.gb_in_per_s, 3), Fixed(t.gb_out_per_s, 3), Ms(t.p50), Ms(t.p99),
                    slowest, std::to_string(t.errors)});
  }
  tenants.Print(out, "", "no tenants");
  out << "\n";
  Table lanes({{"LANE", true}, {"CPU", true}, {"BUSY %", true}});
  for (const auto& l : v.lanes) {
    lanes.AddRow({std::to_string(l.lane), l.cpu < 0 ? "-" : std::to_string(l.cpu),
                  Fixed(l.busy_percent, 1)});
  }
  lanes.Print(out);
}

// JSON string literal (names are validated by the hub; escaped anyway).
std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// null for NaN (no observations in the interval).
std::string JsonNumber(double v) { return std::isnan(v) ? "null" : FormatNumber(v); }

void PrintViewJson(std::ostream& out, const View& v) {
  out << "{\"interval_seconds\": " << FormatNumber(v.seconds) << ", \"tenants\": [";
  for (size_t i = 0; i < v.tenants.size(); ++i) {
    const TenantView& t = v.tenants[i];
    out << (i ? ", " : "") << "{\"name\": " << JsonString(t.name)
        << ", \"workers_connected\": " << t.workers;
    if (t.elastic) {
      out << ", \"elastic\": {\"members\": " << t.members
          << ", \"membership_generation\": " << t.membership_generation
          << ", \"paused\": " << (t.paused ? "true" : "false") << "}";
    }
    out
        << ", \"iterations_per_second\": " << JsonNumber(t.iterations_per_s)
        << ", \"gb_in_per_second\": " << JsonNumber(t.gb_in_per_s)
        << ", \"gb_out_per_second\": " << JsonNumber(t.gb_out_per_s)
        << ", \"update_latency_p50_seconds\": " << JsonNumber(t.p50)
        << ", \"update_latency_p99_seconds\": " << JsonNumber(t.p99) << ", \"slowest_rank\": ";
    if (t.slowest_rank < 0) {
      out << "null";
    } else {
      out << "{\"rack\": " << t.slowest_rack << ", \"rank\": " << t.slowest_rank
          << ", \"lateness_p99_seconds\": " << JsonNumber(t.slowest_p99) << "}";
    }
    out << ", \"errors\": " << t.errors << "}";
  }
  out << "], \"lanes\": [";
  for (size_t i = 0; i < v.lanes.size(); ++i) {
    out << (i ? ", " : "") << "{\"lane\": " << v.lanes[i].lane << ", \"cpu\": " << v.lanes[i].cpu
        << ", \"busy_percent\": " << JsonNumber(v.lanes[i].busy_percent) << "}";
  }
  out << "]}\n";
}

// ---- The live view -----------------------------------------------------------

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

// Puts the terminal on stdin in non-canonical, no-echo mode while alive.
class RawTerminal {
 public:
  RawTerminal() {
    if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &saved_) != 0) return;
    termios raw = saved_;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    active_ = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
  }
  ~RawTerminal() {
    if (active_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  // Waits up to `d` for a key press; true when it was q or Q.
  bool QuitPressed(std::chrono::milliseconds d) const {
    pollfd p{STDIN_FILENO, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(d.count())) <= 0) return false;
    char c = 0;
    if (read(STDIN_FILENO, &c, 1) != 1) return false;
    return c == 'q' || c == 'Q';
  }
  bool active() const { return active_; }

 private:
  termios saved_{};
  bool active_ = false;
};

Status RunTop(const Invocation& inv, const std::string& tenant, double interval, bool once) {
  const auto step = std::chrono::milliseconds(static_cast<int64_t>(interval * 1000));
  Result<Sample> first = TakeSample(inv, tenant);
  if (!first.ok()) return first.status();
  Sample before = *std::move(first);
  if (once) {
    std::this_thread::sleep_for(step);
    const Result<Sample> after = TakeSample(inv, tenant);
    if (!after.ok()) return after.status();
    const View v = Compare(before, *after);
    if (inv.connection.options().json) {
      PrintViewJson(inv.out, v);
    } else {
      PrintView(inv.out, v, inv.connection.options().admin);
    }
    return Status::Ok();
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  const RawTerminal terminal;
  const bool tty = isatty(STDOUT_FILENO) != 0;
  while (!g_stop) {
    // Wait one interval, a tenth at a time, watching for q.
    for (int i = 0; i < 10 && !g_stop; ++i) {
      if (terminal.active() ? terminal.QuitPressed(step / 10)
                            : (std::this_thread::sleep_for(step / 10), false)) {
        g_stop = 1;
      }
    }
    if (g_stop) break;
    Result<Sample> sampled = TakeSample(inv, tenant);
    if (!sampled.ok()) return sampled.status();  // ~RawTerminal restores the terminal
    Sample now = *std::move(sampled);
    const View v = Compare(before, now);
    if (tty && !inv.connection.options().json) inv.out << "\x1b[H\x1b[2J";  // home, clear
    if (inv.connection.options().json) {
      PrintViewJson(inv.out, v);
    } else {
      PrintView(inv.out, v, inv.connection.options().admin);
      if (!tty) inv.out << "\n";
    }
    inv.out.flush();
    before = std::move(now);
  }
  return Status::Ok();
}

// ---- stalls ------------------------------------------------------------------

std::string Ranks(const google::protobuf::RepeatedField<uint32_t>& ranks,
                  const google::protobuf::RepeatedField<uint32_t>* marked = nullptr) {
  if (ranks.empty()) return "-";
  std::string out;
  for (uint32_t r : ranks) {
    const bool mark =
        marked && std::find(marked->begin(), marked->end(), r) != marked->end();
    out += (out.empty() ? "" : ",") + std::to_string(r) + (mark ? "*" : "");
  }
  return out;
}

void PrintStalls(std::ostream& out, const admin::ListStallsResponse& r, uint32_t min_wait_ms) {
  for (uint32_t lane : r.unanswered_lanes()) {
    out << "warning: lane " << lane
        << " did not answer within 1 s (hung or shutting down); its stalls are not listed\n";
  }
  if (r.stalls().empty()) {
    out << "no update has waited " << min_wait_ms << " ms or longer\n";
    return;
  }
  Table table({{"TENANT"}, {"KEY"}, {"CHUNK", true}, {"UPDATE", true}, {"LANE", true},
               {"RACK", true}, {"WAITING", true}, {"PUSHED"}, {"MISSING"}});
  bool any_disconnected = false;
  for (const auto& s : r.stalls()) {
    any_disconnected |= !s.disconnected_ranks().empty();
    // The cross-rack stage lists racks, not ranks.
    const std::string racks = s.cross_rack() ? "racks " : "";
    table.AddRow({s.tenant(), s.key(), std::to_string(s.chunk()), std::to_string(s.update()),
                  std::to_string(s.lane()), s.cross_rack() ? "all" : std::to_string(s.rack()),
                  Fixed(s.waiting_ms() / 1000.0, 1) + " s", racks + Ranks(s.pushed_ranks()),
                  racks + Ranks(s.missing_ranks(), &s.disconnected_ranks())});
  }
  table.Print(out);
  if (r.total() > static_cast<uint32_t>(r.stalls_size())) {
    out << "(" << r.stalls_size() << " of " << r.total() << " shown, longest waits first)\n";
  }
  if (any_disconnected) out << "* not connected to that lane (gone or not started)\n";
}

}  // namespace

void AddMonitorCommands(CLI::App* app, Handlers* handlers) {
  struct TopArgs {
    std::string tenant;
    std::string interval = "1";
    bool once = false;
  };
  const auto top = DefineCommand<TopArgs>(
      app, "top", "live view: per-tenant rates and latencies, per-lane busy share",
      "Refreshes every --interval: per tenant iterations/s, GB/s in and out, p50/p99 of the\n"
      "update latency (first contribution to reply) and the rank the others waited for most\n"
      "(p99 of its lateness), errors; per lane the share of time its thread was busy. Figures\n"
      "cover the last interval. q (or Ctrl-C) quits. --once samples two intervals apart,\n"
      "prints once and exits; with --json as one JSON object.");
  AddTenantFilter(top.app, &top.args->tenant);
  AddSecondsOption(top.app, "--interval", &top.args->interval, "seconds between refreshes [1]");
  top.app->add_flag("--once", top.args->once, "print one view and exit (for scripts)");
  Handle(handlers, top, [](const Invocation& inv, const TopArgs& a) {
    const Result<double> interval = ParseSeconds("interval", a.interval);
    if (!interval.ok()) return interval.status();
    if (*interval < 0.1 || *interval > 3600) {
      return InvalidArgument("--interval: must be between 0.1 and 3600 seconds, got " + a.interval);
    }
    return RunTop(inv, a.tenant, *interval, a.once);
  });

  struct StallsArgs {
    std::string tenant;
    std::string min_wait = "1";
    uint32_t max = 0;
  };
  const auto stalls = DefineCommand<StallsArgs>(
      app, "stalls", "updates waiting for workers: which ranks pushed, which are missing",
      "Lists every chunk update that has waited at least --min-wait since its first\n"
      "contribution, longest first, with the ranks that have pushed and those still\n"
      "missing (* = not connected to that lane). A rank missing from many rows is the one\n"
      "holding the job back.");
  AddTenantFilter(stalls.app, &stalls.args->tenant);
  AddSecondsOption(stalls.app, "--min-wait", &stalls.args->min_wait,
                   "list updates waiting at least this long [1]");
  stalls.app->add_option("--max", stalls.args->max, "at most this many rows [1000]")
      ->type_name("N")
      ->check(U32Validator());
  Handle(handlers, stalls, [](const Invocation& inv, const StallsArgs& a) {
    const Result<double> min_wait = ParseSeconds("min-wait", a.min_wait);
    if (!min_wait.ok()) return min_wait.status();
    admin::ListStallsRequest request;
    request.set_tenant(a.tenant);
    const auto ms = static_cast<uint32_t>(std::clamp(*min_wait * 1000.0, 1.0, 4e9));
    request.set_min_wait_ms(ms);
    request.set_max_stalls(a.max);
    return CallAndShow(inv, &StatsStub::ListStalls, request,
                       [ms](std::ostream& out, const admin::ListStallsResponse& response) {
                         PrintStalls(out, response, ms);
                       });
  });
}

}  // namespace rackhub::cli
