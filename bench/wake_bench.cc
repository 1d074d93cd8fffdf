// rackhub-wake-bench: what a hand-over between two processes costs on this
// host, the floor under every round trip the shared-memory transport makes
// (bench/results/latency-2026-11-28.md). Two processes ping-pong a counter
// `--iterations` times, in interleaved rounds of three modes:
//   same-cpu   both pinned to one CPU, each sleeps on an eventfd (read) and
//              wakes the other with a write: two sleeps per round trip;
//   cross-cpu  the same with the processes on two different CPUs;
//   spin       two CPUs, each spins on a shared counter (no system call).
// Prints, per mode, the median over rounds of each round's p10/p50/p90
// round trip in microseconds. No rackhub code runs here: it measures the
// machine (its scheduler, its wake-up IPIs), not the project.
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <new>
#include <string>
#include <vector>

namespace {

using WakeClock = std::chrono::steady_clock;

bool PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return sched_setaffinity(0, sizeof set, &set) == 0;
}

struct WakeStats {
  double p10 = 0, p50 = 0, p90 = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One round of `n` round trips; the parent is on cpu_a, the child on cpu_b.
// Returns false if a process could not be made or pinned.
bool RunWakeRound(const std::string& mode, int n, int cpu_a, int cpu_b, WakeStats* out) {
  const bool spin = mode == "spin";
  auto* shared = static_cast<std::atomic<uint64_t>*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE,
                                                          MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (shared == MAP_FAILED) return false;
  new (shared) std::atomic<uint64_t>(0);
  const int to_child = eventfd(0, EFD_CLOEXEC);
  const int to_parent = eventfd(0, EFD_CLOEXEC);
  if (to_child < 0 || to_parent < 0) return false;
  const pid_t child = fork();
  if (child < 0) return false;
  uint64_t v = 0;
  const uint64_t one = 1;
  if (child == 0) {
    if (!PinTo(cpu_b)) _exit(2);
    for (int i = 0; i < n; ++i) {
      if (spin) {
        while (shared->load(std::memory_order_acquire) != uint64_t(2 * i + 1)) {
        }
        shared->store(2 * i + 2, std::memory_order_release);
      } else {
        if (read(to_child, &v, sizeof v) != sizeof v || write(to_parent, &one, sizeof one) < 0) {
          _exit(3);
        }
      }
    }
    _exit(0);
  }
  bool ok = PinTo(cpu_a);
  std::vector<double> us;
  us.reserve(n);
  for (int i = 0; ok && i < n; ++i) {
    const auto t0 = WakeClock::now();
    if (spin) {
      shared->store(2 * i + 1, std::memory_order_release);
      while (shared->load(std::memory_order_acquire) != uint64_t(2 * i + 2)) {
      }
    } else {
      ok = write(to_child, &one, sizeof one) == sizeof one && read(to_parent, &v, sizeof v) == sizeof v;
    }
    us.push_back(std::chrono::duration<double, std::micro>(WakeClock::now() - t0).count());
  }
  if (!ok) kill(child, SIGKILL);  // it would wait for the parent forever
  int status = 0;
  waitpid(child, &status, 0);
  close(to_child);
  close(to_parent);
  munmap(shared, 4096);
  if (!ok || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return false;
  std::sort(us.begin(), us.end());
  out->p10 = us[us.size() / 10];
  out->p50 = us[us.size() / 2];
  out->p90 = us[us.size() * 9 / 10];
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 5000, rounds = 5;
  CLI::App app{"rackhub-wake-bench: process hand-over cost (eventfd same/cross CPU, spin)"};
  app.add_option("--iterations", iterations, "round trips per round")->check(CLI::Range(10, 10000000));
  app.add_option("--rounds", rounds, "interleaved rounds")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
    std::fprintf(stderr, "rackhub-wake-bench: needs two CPUs\n");
    return 1;
  }
  const std::vector<std::string> modes = {"same-cpu", "cross-cpu", "spin"};
  std::vector<std::vector<WakeStats>> results(modes.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t m = 0; m < modes.size(); ++m) {
      WakeStats s;
      if (!RunWakeRound(modes[m], iterations, 0, modes[m] == "same-cpu" ? 0 : 1, &s)) {
        std::fprintf(stderr, "rackhub-wake-bench: round %d of %s failed\n", r + 1,
                     modes[m].c_str());
        return 1;
      }
      results[m].push_back(s);
    }
  }
  std::printf("| mode | p10 us | p50 us | p90 us |\n|---|---:|---:|---:|\n");
  for (size_t m = 0; m < modes.size(); ++m) {
    std::vector<double> p10, p50, p90;
    for (const WakeStats& s : results[m]) {
      p10.push_back(s.p10);
      p50.push_back(s.p50);
      p90.push_back(s.p90);
    }
    std::printf("| %s | %.1f | %.1f | %.1f |\n", modes[m].c_str(), Median(p10), Median(p50),
                Median(p90));
  }
  return 0;
}
