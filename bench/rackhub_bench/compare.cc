// rackhub-bench --compare gloo: rackhub push_pull against torch.distributed
// gloo all_reduce of the same model, interleaved round by round so that both
// see the same (noisy) machine.
//
// One hub serves every round; each round creates a fresh tenant, runs the W
// rackhub workers for I iterations, deletes the tenant, then runs
// bench/gloo_allreduce.py (W ranks, same size and dtype, I iterations) with
// the configured interpreter. The reported medians are medians of the
// per-round medians; ratio_to_gloo = rackhub / gloo (< 1: rackhub is faster).
//
// Single-threaded.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "bench.h"

#ifndef RACKHUB_SOURCE_DIR
#define RACKHUB_SOURCE_DIR ""
#endif

namespace rackhub::bench {
namespace {

constexpr int kExitGlooUnavailable = 3;

// ---- A minimal reader for the flat JSON line gloo_allreduce.py prints ----

// Position just after `"key":`, or npos.
size_t ValueAt(const std::string& json, const std::string& key) {
  const std::string pattern = "\"" + key + "\":";
  const size_t p = json.find(pattern);
  return p == std::string::npos ? p : p + pattern.size();
}

bool JsonNumber(const std::string& json, const std::string& key, double* out) {
  const size_t p = ValueAt(json, key);
  if (p == std::string::npos) return false;
  try {
    *out = std::stod(json.substr(p));
  } catch (...) {
    return false;
  }
  return true;
}

// A string value with its escapes undone (\uXXXX kept as is); false when
// absent or null.
bool JsonString(const std::string& json, const std::string& key, std::string* out) {
  size_t p = ValueAt(json, key);
  if (p == std::string::npos || p >= json.size() || json[p] != '"') return false;
  out->clear();
  for (++p; p < json.size() && json[p] != '"'; ++p) {
    if (json[p] == '\\' && p + 1 < json.size() && json[p + 1] != 'u') {
      const char c = json[++p];
      *out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
    } else {
      *out += json[p];
    }
  }
  return true;
}

bool JsonNumbers(const std::string& json, const std::string& key, std::vector<double>* out) {
  const size_t p = ValueAt(json, key);
  if (p == std::string::npos || p >= json.size() || json[p] != '[') return false;
  std::istringstream in(json.substr(p + 1, json.find(']', p) - p - 1));
  std::string num;
  while (std::getline(in, num, ',')) {
    if (!num.empty()) out->push_back(std::stod(num));
  }
  return true;
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

std::string LastLine(const std::string& text) {
  const size_t end = text.find_last_not_of("\n");
  if (end == std::string::npos) return "";
  const size_t begin = text.rfind('\n', end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1, end + 1 - (begin + 1));
}

std::string Tail(const std::string& text, size_t n) {
  return text.size() <= n ? text : "..." + text.substr(text.size() - n);
}

// ---- Running the gloo script ----

struct GlooRun {
  bool ok = false;
  int exit_code = -1;
  std::string error;  // when !ok
  std::string json;   // its output line
};

GlooRun RunGloo(const BenchArgs& a, const std::string& script, const std::string& dir,
                const std::vector<std::string>& extra) {
  GlooRun run;
  const std::string out = dir + "/gloo.json", log = dir + "/gloo.log";
  std::vector<std::string> argv = {a.python, script};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const pid_t pid = Spawn(argv, log, out);
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) {
    run.error = "cannot run " + a.python;
    return run;
  }
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  run.json = LastLine(ReadAll(out));
  if (run.exit_code == 0 && !run.json.empty()) {
    run.ok = true;
    return run;
  }
  if (!JsonString(run.json, "error", &run.error)) {
    run.error = a.python + " " + script + " exited with " + std::to_string(run.exit_code) + ": " +
                Tail(ReadAll(log), 600);
  }
  return run;
}

}  // namespace

int Compare(const BenchArgs& a, const std::string& self) {
  std::string script = a.gloo_script;
  if (script.empty()) {
    const std::string source_dir = RACKHUB_SOURCE_DIR;
    script = source_dir.empty() ? "" : source_dir + "/bench/gloo_allreduce.py";
  }
  const char* dtype = DTypeName(a.w.dtype);
  const std::string dir = MakeRunDir();

  // Is gloo usable at all? Then the rackhub rounds still run without it.
  std::string gloo_error, gloo_torch;
  if (script.empty() || !std::filesystem::exists(script)) {
    gloo_error = "gloo script not found: '" + script + "' (pass --gloo-script PATH)";
  } else {
    const GlooRun probe = RunGloo(a, script, dir, {"--probe"});
    if (!probe.ok) {
      gloo_error = probe.error;
    } else {
      JsonString(probe.json, "torch", &gloo_torch);
    }
  }
  if (!gloo_error.empty()) {
    std::fprintf(stderr,
                 "rackhub-bench: --compare gloo: gloo unavailable, timing rackhub only: %s\n",
                 gloo_error.c_str());
  }

  std::vector<double> rh_rounds, gl_rounds, rh_all, gl_all;
  std::string transport;
  double hub_cpu = 0;
  uint64_t gradient_bytes = 0;
  std::string gloo_dtype, gloo_note;
  bool verified = a.w.verify, ok = true;
  {
    Hub hub;
    if (!a.rack_addrs.empty()) hub.listen_host = a.rack_addrs[0];
    if (!a.hub_netns_prefix.empty()) hub.netns = a.hub_netns_prefix + "0";
    if (!hub.Open(a, dir)) {
      ok = false;
    }
    for (uint32_t round = 0; ok && round < a.rounds; ++round) {
      const RunResult r = RunPushPull(
          a, self, {&hub}, dir, "bench-" + std::to_string(getpid()) + "-r" + std::to_string(round));
      if (!r.ok) {
        ok = false;
        break;
      }
      verified = verified && r.verified;
      transport = r.transport;
      hub_cpu = r.hub_cpu_seconds < 0 || hub_cpu < 0 ? -1 : hub_cpu + r.hub_cpu_seconds;
      gradient_bytes += r.gradient_bytes;
      rh_rounds.push_back(Percentile(r.iteration_ms, 0.5));
      rh_all.insert(rh_all.end(), r.iteration_ms.begin(), r.iteration_ms.end());
      std::fprintf(stderr, "rackhub-bench: round %u/%u: rackhub %.3f ms", round + 1, a.rounds,
                   rh_rounds.back());
      if (gloo_error.empty()) {
        std::vector<std::string> gloo_args = {
            "--workers",    std::to_string(a.w.workers),    "--bytes",  std::to_string(a.w.bytes),
            "--dtype",      dtype,                          "--iterations",
            std::to_string(a.w.iterations), "--warmup", std::to_string(a.w.warmup)};
        if (a.w.profile != "even") {
          gloo_args.insert(gloo_args.end(), {"--profile", a.w.profile, "--bucket-mib",
                                             std::to_string(a.gloo_bucket_mib)});
        }
        if (!a.netns_per_worker.empty()) {
          gloo_args.insert(gloo_args.end(),
                           {"--netns-per-rank", a.netns_per_worker, "--master-addr",
                            a.gloo_master_addr, "--ifname", a.gloo_ifname});
        }
        const GlooRun g = RunGloo(a, script, dir, gloo_args);
        double median = 0;
        std::vector<double> times;
        if (!g.ok) {
          gloo_error = g.error;
        } else if (!JsonNumber(g.json, "median_ms", &median) ||
                   !JsonNumbers(g.json, "times_ms", &times)) {
          gloo_error = "unreadable gloo result: " + Tail(g.json, 300);
        } else {
          gl_rounds.push_back(median);
          gl_all.insert(gl_all.end(), times.begin(), times.end());
          JsonString(g.json, "dtype", &gloo_dtype);
          JsonString(g.json, "note", &gloo_note);
          std::fprintf(stderr, ", gloo %.3f ms (%s)", median, gloo_dtype.c_str());
        }
        if (!gloo_error.empty()) {
          std::fprintf(stderr, ", gloo failed: %s", gloo_error.c_str());
          gl_rounds.clear();
          gl_all.clear();
        }
      }
      std::fprintf(stderr, "\n");
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!ok) return 1;

  const double median = Percentile(rh_rounds, 0.5);
  const double gbps = static_cast<double>(a.w.bytes) / (median * 1e-3) / 1e9;
  const bool have_gloo = gloo_error.empty() && !gl_rounds.empty();
  const double gloo_median = have_gloo ? Percentile(gl_rounds, 0.5) : 0;
  const double ratio = have_gloo ? median / gloo_median : 0;
  const double cpu_per_gb = hub_cpu < 0 || gradient_bytes == 0 ? -1 : hub_cpu / (gradient_bytes / 1e9);
  auto list = [](const std::vector<double>& v) {
    std::string s = "[";
    char buf[32];
    for (size_t i = 0; i < v.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%s%.3f", i ? "," : "", v[i]);
      s += buf;
    }
    return s + "]";
  };
  auto number_or_null = [&](double v, const char* fmt) {
    if (!have_gloo) return std::string("null");
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, v);
    return std::string(buf);
  };
  auto string_or_null = [](const std::string& s) {
    if (s.empty()) return std::string("null");
    std::string quoted(1, '"');  // (not "\"" + ...: GCC 12 warns -Wrestrict there)
    quoted += JsonEscape(s);
    quoted += '"';
    return quoted;
  };
  if (a.json) {
    std::printf(
        "{\"compare\":\"gloo\",\"workers\":%u,\"bytes\":%llu,\"keys\":%u,\"iterations\":%u,"
        "\"warmup\":%u,\"rounds\":%u,\"dtype\":\"%s\",\"optimizer\":\"%s\",\"transport\":\"%s\","
        "\"median_ms\":%.3f,\"p10_ms\":%.3f,\"p50_ms\":%.3f,\"p90_ms\":%.3f,\"p99_ms\":%.3f,"
        "\"hub_cpu_s_per_gb\":%.4f,\"gbps_per_worker\":%.3f,\"verified\":%s,"
        "\"round_median_ms\":%s,\"gloo_median_ms\":%s,\"gloo_p10_ms\":%s,\"gloo_p50_ms\":%s,"
        "\"gloo_p90_ms\":%s,\"gloo_p99_ms\":%s,"
        "\"gloo_gbps_per_worker\":%s,\"gloo_round_median_ms\":%s,\"gloo_dtype\":%s,"
        "\"gloo_torch\":%s,\"gloo_note\":%s,\"gloo_error\":%s,\"ratio_to_gloo\":%s,"
        "\"profile\":\"%s\",\"gloo_bucket_mib\":%u}\n",
        a.w.workers, static_cast<unsigned long long>(a.w.bytes), a.w.keys, a.w.iterations,
        a.w.warmup, a.rounds, dtype, a.optimizer.c_str(), transport.c_str(), median,
        Percentile(rh_all, 0.1), Percentile(rh_all, 0.5), Percentile(rh_all, 0.9),
        Percentile(rh_all, 0.99), cpu_per_gb, gbps, verified ? "true" : "false",
        list(rh_rounds).c_str(), number_or_null(gloo_median, "%.3f").c_str(),
        number_or_null(Percentile(gl_all, 0.1), "%.3f").c_str(),
        number_or_null(Percentile(gl_all, 0.5), "%.3f").c_str(),
        number_or_null(Percentile(gl_all, 0.9), "%.3f").c_str(),
        number_or_null(Percentile(gl_all, 0.99), "%.3f").c_str(),
        number_or_null(static_cast<double>(a.w.bytes) / (gloo_median * 1e-3) / 1e9, "%.3f").c_str(),
        list(gl_rounds).c_str(), string_or_null(gloo_dtype).c_str(),
        string_or_null(gloo_torch).c_str(), string_or_null(gloo_note).c_str(),
        string_or_null(gloo_error).c_str(), number_or_null(ratio, "%.4f").c_str(),
        a.w.profile.c_str(), a.gloo_bucket_mib);
  } else {
    std::printf(
        "rackhub-bench --compare gloo: %u workers, %.1f MiB model in %u keys, %s on the wire, "
        "%s\n  %u rounds of [rackhub %u iterations, gloo %u iterations] (+%u warm-up each)\n",
        a.w.workers, static_cast<double>(a.w.bytes) / (1 << 20), a.w.keys, dtype,
        a.optimizer.c_str(), a.rounds, a.w.iterations, a.w.iterations, a.w.warmup);
    std::printf("  %-8s %14s %14s %8s\n", "round", "rackhub ms", "gloo ms", "ratio");
    for (size_t i = 0; i < rh_rounds.size(); ++i) {
      if (i < gl_rounds.size() && have_gloo) {
        std::printf("  %-8zu %14.3f %14.3f %8.3f\n", i + 1, rh_rounds[i], gl_rounds[i],
                    rh_rounds[i] / gl_rounds[i]);
      } else {
        std::printf("  %-8zu %14.3f %14s %8s\n", i + 1, rh_rounds[i], "-", "-");
      }
    }
    if (have_gloo) {
      std::printf("  %-8s %14.3f %14.3f %8.3f   (medians of the round medians)\n", "median", median,
                  gloo_median, ratio);
      std::printf("  rackhub/gloo      %.3f  (%s than gloo all_reduce %s, torch %s)\n", ratio,
                  ratio <= 1 ? "faster" : "slower", gloo_dtype.c_str(), gloo_torch.c_str());
      if (!gloo_note.empty()) std::printf("  note: %s\n", gloo_note.c_str());
    } else {
      std::printf("  %-8s %14.3f %14s %8s\n", "median", median, "-", "-");
      std::printf("  gloo: unavailable: %s\n", gloo_error.c_str());
    }
    std::printf("  rackhub per worker %.3f GB/s of model over %s; all iterations p50 %.3f, p99 %.3f ms\n",
                gbps, transport.c_str(), Percentile(rh_all, 0.5), Percentile(rh_all, 0.99));
    if (cpu_per_gb >= 0) {
      std::printf("  hub CPU            %.3f s per GB of gradient received\n", cpu_per_gb);
    }
    std::printf("  verified: %s\n", verified ? "true" : (a.w.verify ? "false" : "skipped"));
  }
  if (!verified && a.w.verify) return 1;
  return have_gloo ? 0 : kExitGlooUnavailable;
}

}  // namespace rackhub::bench
