#include "cross_rack_reference.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "rackhub/aggregation/kernels.h"
#include "training.h"
#include "worker_set.h"

namespace rackhub::testing {

namespace {

// What one worker generation saw at one version.
struct Seen {
  std::string who;  // "rack R rank K (FILE)"
  std::string kind;  // pull | iter
  std::string hash;
  std::string dump;
};

std::optional<std::vector<float>> ParseDump(const std::string& hex, uint64_t elements) {
  if (hex.size() != elements * 8) return std::nullopt;
  std::vector<float> out(elements);
  for (uint64_t i = 0; i < elements; ++i) {
    const uint32_t bits = static_cast<uint32_t>(std::stoul(hex.substr(i * 8, 8), nullptr, 16));
    std::memcpy(&out[i], &bits, 4);
  }
  return out;
}

bool SameBits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

std::string Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g (0x%08x)", static_cast<double>(f), b);
  return buf;
}

class Checker {
 public:
  explicit Checker(const CrossRackJob& job) : job_(job) {}

  void Problem(const std::string& what) {
    if (++problem_count_ <= 20) report_.problems += what + "\n";
  }

  // One generation's file: its order, and what it saw at each version.
  void Read(uint32_t rack, uint32_t rank, const std::string& file) {
    const std::string who =
        "rack " + std::to_string(rack) + " rank " + std::to_string(rank) + " (" + file + ")";
    std::optional<uint64_t> last;
    for (const WorkerLine& l : ReadWorkerOut(file)) {
      if (l.kind == "error") Problem(who + ": error" + l.text);
      if (l.kind != "pull" && l.kind != "iter") continue;
      if (l.kind == "iter") {
        if (!last || l.iteration != *last + 1) {
          Problem(who + ": PushPull result at version " + std::to_string(l.iteration) +
                  " after version " + (last ? std::to_string(*last) : "none"));
        }
        by_push_.insert(l.iteration);
      } else if (last && l.iteration < *last) {
        Problem(who + ": pulled version " + std::to_string(l.iteration) + " after version " +
                std::to_string(*last));
      }
      last = l.iteration;
      seen_[l.iteration].push_back({who, l.kind, l.hash, l.dump});
    }
  }

  ReferenceReport Run() {
    std::optional<KeyValues> state;
    uint64_t at = 0;
    for (const auto& [v, seen] : seen_) {
      const std::optional<std::vector<float>> params = Agree(v, seen);
      ++report_.versions;
      report_.newest = v;
      if (!state) {
        if (!params) {
          Problem("version " + std::to_string(v) + ", the first seen, has no pulled values");
          break;
        }
        if (v != 0) Problem("the first version seen is " + std::to_string(v) + ", not 0");
        for (float f : *params) {
          if (f != 0.0f) {
            Problem("version 0 is not all zeros (init zeros)");
            break;
          }
        }
        state = KeyValues{*params, std::vector<std::vector<float>>(
                                      aggregation::OptimizerStateSlots(job_.optimizer.type),
                                      std::vector<float>(job_.elements, 0.0f))};
        at = v;
        continue;
      }
      const KeyValues next = ReferenceStep(job_, *state, at);
      if (by_push_.count(v)) {
        ++report_.steps;
        if (v != at + 1) {
          Problem("version " + std::to_string(v) + " reached by a PushPull, but the newest "
                  "version before it is " + std::to_string(at));
        }
        const std::string want = HashFloats(next.params);
        for (const Seen& s : seen) {
          if (s.hash != want) {
            Problem("version " + std::to_string(v) + ": " + s.who + " has " + s.hash +
                    ", the reference step from version " + std::to_string(at) + " gives " +
                    want + Diff(next.params, params, 0, job_.elements));
            break;
          }
        }
        *state = next;
      } else if (!params) {
        Problem("version " + std::to_string(v) + " has neither a PushPull result nor values");
        break;
      } else {
        Realigned(v, at, *params, next, *state);
      }
      at = v;
    }
    return report_;
  }

 private:
  // The values every worker saw at `v` (nullopt without a pull), after
  // checking that they all saw the same.
  std::optional<std::vector<float>> Agree(uint64_t v, const std::vector<Seen>& seen) {
    std::optional<std::vector<float>> values;
    for (const Seen& s : seen) {
      if (s.hash != seen.front().hash) {
        Problem("version " + std::to_string(v) + ": " + s.who + " saw " + s.hash + " (" + s.kind +
                "), " + seen.front().who + " saw " + seen.front().hash + " (" +
                seen.front().kind + ")");
      }
      if (s.kind != "pull" || s.dump.empty() || values) continue;
      values = ParseDump(s.dump, job_.elements);
      if (!values) {
        Problem(s.who + ": pull of version " + std::to_string(v) +
                " without " + std::to_string(job_.elements) + " values (--dump-pulls)");
      } else if (HashFloats(*values) != s.hash) {
        Problem(s.who + ": pulled values of version " + std::to_string(v) +
                " do not match their hash");
      }
    }
    return values;
  }

  // Version v reached only by Pulls after version `at` (state): each chunk is
  // at's (skipped) or the step's (applied at its home before the round).
  void Realigned(uint64_t v, uint64_t at, const std::vector<float>& params, const KeyValues& next,
                 KeyValues& state) {
    ++report_.recoveries;
    uint64_t applied = 0;
    for (uint64_t first = 0, c = 0; first < job_.elements; first += job_.chunk_elements, ++c) {
      const size_t n = std::min<uint64_t>(job_.chunk_elements, job_.elements - first);
      if (SameBits(&params[first], &state.params[first], n)) {
        ++report_.chunks_skipped;
        continue;
      }
      if (SameBits(&params[first], &next.params[first], n)) {
        ++report_.chunks_applied;
        ++applied;
        std::copy_n(&next.params[first], n, &state.params[first]);
        for (size_t s = 0; s < state.slots.size(); ++s) {
          std::copy_n(&next.slots[s][first], n, &state.slots[s][first]);
        }
        continue;
      }
      const uint32_t home = static_cast<uint32_t>((c / job_.lanes) % job_.racks);
      Problem("version " + std::to_string(v) + " (pulled after version " + std::to_string(at) +
              "): chunk " + std::to_string(c) + " (home rack " + std::to_string(home) +
              ") is neither version " + std::to_string(at) + "'s values (a skipped step) nor " +
              "the update from them" + Diff(next.params, params, first, n) +
              "; unchanged would be" + Diff(state.params, params, first, n));
    }
    if (applied > 0 && v == at + 1) {
      Problem("version " + std::to_string(v) + ": " + std::to_string(applied) +
              " chunk(s) hold the update from version " + std::to_string(at) +
              ", so the realigned version must be at least " + std::to_string(at + 2));
    }
  }

  // Where `got` first differs from `want` in [first, first + n).
  static std::string Diff(const std::vector<float>& want,
                          const std::optional<std::vector<float>>& got, uint64_t first,
                          uint64_t n) {
    if (!got) return "";
    for (uint64_t i = first; i < first + n; ++i) {
      if (!SameBits(&want[i], &(*got)[i], 1)) {
        return " (element " + std::to_string(i) + ": " + Bits((*got)[i]) + ", expected " +
               Bits(want[i]) + ")";
      }
    }
    return " (same values)";
  }

  const CrossRackJob& job_;
  std::map<uint64_t, std::vector<Seen>> seen_;
  std::set<uint64_t> by_push_;
  ReferenceReport report_;
  size_t problem_count_ = 0;
};

}  // namespace

KeyValues ReferenceStep(const CrossRackJob& job, const KeyValues& from, uint64_t v) {
  const size_t n = job.elements;
  std::vector<float> sum(n), rack_sum(n), grad(n);
  for (uint32_t r = 0; r < job.racks; ++r) {
    for (uint32_t k = 0; k < job.workers_per_rack; ++k) {
      Gradient(job.seed, v, 64 * r + k, from.params, grad);
      for (size_t i = 0; i < n; ++i) rack_sum[i] = k == 0 ? grad[i] : rack_sum[i] + grad[i];
    }
    for (size_t i = 0; i < n; ++i) sum[i] = r == 0 ? rack_sum[i] : sum[i] + rack_sum[i];
  }
  KeyValues to{std::vector<float>(n), from.slots};
  aggregation::OptimizerStep step;
  step.grad_scale = static_cast<float>(1.0 / (job.racks * job.workers_per_rack));
  step.t = v + 1;
  aggregation::ApplyOptimizer(job.optimizer, step, sum.data(), from.params.data(),
                              to.params.data(), to.slots.empty() ? nullptr : to.slots[0].data(),
                              to.slots.size() < 2 ? nullptr : to.slots[1].data(), n);
  return to;
}

std::string ReferenceReport::Summary() const {
  std::ostringstream s;
  s << versions << " versions up to " << newest << ": " << steps << " PushPull steps and "
    << recoveries << " realigned versions (" << chunks_applied << " chunks applied at their home, "
    << chunks_skipped << " skipped) checked against the reference";
  return s.str();
}

ReferenceReport CheckAgainstReference(
    const CrossRackJob& job,
    const std::vector<std::pair<std::pair<uint32_t, uint32_t>, std::string>>& files) {
  Checker checker(job);
  for (const auto& [member, file] : files) checker.Read(member.first, member.second, file);
  return checker.Run();
}

}  // namespace rackhub::testing
