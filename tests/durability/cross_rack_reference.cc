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
    Trace t;
    t.who = "rack " + std::to_string(rack) + " rank " + std::to_string(rank) + " (" + file + ")";
    std::optional<uint64_t> last;
    for (const WorkerLine& l : ReadWorkerOut(file)) {
      if (l.kind == "error") Problem(t.who + ": error" + l.text);
      if (l.kind != "pull" && l.kind != "iter") continue;
      if (l.kind == "iter" && (!last || l.iteration != *last + 1)) {
        Problem(t.who + ": PushPull result at version " + std::to_string(l.iteration) +
                " after version " + (last ? std::to_string(*last) : "none"));
      } else if (l.kind == "pull" && last && l.iteration < *last && !job_.rollbacks) {
        Problem(t.who + ": pulled version " + std::to_string(l.iteration) + " after version " +
                std::to_string(*last));
      }
      last = l.iteration;
      seen_[l.iteration].push_back({t.who, l.kind, l.hash});
      report_.newest = std::max(report_.newest, l.iteration);
      t.lines.push_back(l);
    }
    traces_.push_back(std::move(t));
  }

  // Derives every state from the one before it, trace by trace, until no
  // line can be explained any more: PushPull results and Pulls of known
  // states first; a realigned Pull (a new state only Pulls saw) only when
  // nothing else moves, so that every state it could come from is known.
  ReferenceReport Run() {
    report_.versions = seen_.size();
    if (!job_.rollbacks) {
      for (const auto& [v, seen] : seen_) Agree(v, seen);
    }
    const std::vector<float> zeros(job_.elements, 0.0f);
    report_.states[{0, HashFloats(zeros)}] =
        KeyValues{zeros, std::vector<std::vector<float>>(
                             aggregation::OptimizerStateSlots(job_.optimizer.type), zeros)};
    for (bool moved = true; moved;) {
      moved = false;
      for (Trace& t : traces_) {
        while (Advance(t, false)) moved = true;
      }
      for (size_t i = 0; i < traces_.size() && !moved; ++i) moved = Advance(traces_[i], true);
    }
    for (const Trace& t : traces_) {
      if (t.next >= t.lines.size()) continue;
      const WorkerLine& l = t.lines[t.next];
      Problem(t.who + ": " + l.kind + " of version " + std::to_string(l.iteration) + " (" +
              l.hash + ") follows from no state the reference verified" +
              (t.why.empty() ? " (no values to start from: --dump-pulls)" : ": " + t.why));
    }
    return report_;
  }

 private:
  using StateId = std::pair<uint64_t, std::string>;  // version, params hash

  // One generation's pull and iter lines, and how far they are explained.
  struct Trace {
    std::string who;
    std::vector<WorkerLine> lines;
    size_t next = 0;                // the first line not explained yet
    std::optional<StateId> prev;    // the state of the line before it
    std::string why;                // why lines[next] could not be explained
  };

  // Explains t.lines[t.next] if it can (true: t.next moved on). A realigned
  // Pull only with `realign`.
  bool Advance(Trace& t, bool realign) {
    if (t.next >= t.lines.size()) return false;
    const WorkerLine& l = t.lines[t.next];
    const StateId id{l.iteration, l.hash};
    if (l.kind == "iter") {
      if (!t.prev || t.prev->first + 1 != l.iteration) return Abandon(t);  // reported by Read
      const auto from = report_.states.find(*t.prev);
      if (from == report_.states.end()) return false;
      KeyValues next = ReferenceStep(job_, from->second, t.prev->first);
      if (HashFloats(next.params) != l.hash) {
        Problem("version " + std::to_string(l.iteration) + ": " + t.who + " has " + l.hash +
                ", the reference step from version " + std::to_string(t.prev->first) +
                " gives " + HashFloats(next.params));
        return Abandon(t);
      }
      report_.steps += report_.states.emplace(id, std::move(next)).second;
      return Explained(t, id);
    }
    if (report_.states.count(id)) {
      report_.rollbacks += t.prev && l.iteration < t.prev->first;
      return Explained(t, id);
    }
    if (!realign || l.dump.empty()) return false;
    const std::optional<std::vector<float>> params = ParseDump(l.dump, job_.elements);
    if (!params || HashFloats(*params) != l.hash) {
      Problem(t.who + ": pulled values of version " + std::to_string(l.iteration) +
              (params ? " do not match their hash" : " are not " + std::to_string(job_.elements) +
                                                         " values (--dump-pulls)"));
      return Abandon(t);
    }
    // The newest verified state below the version that explains it.
    t.why.clear();
    for (auto it = report_.states.lower_bound({l.iteration, ""});
         it != report_.states.begin();) {
      --it;
      std::string why;
      std::optional<KeyValues> state = Realigned(l.iteration, it->first.first, *params,
                                                 it->second, &why);
      if (state) {
        report_.states.emplace(id, std::move(*state));
        return Explained(t, id);
      }
      if (t.why.empty()) t.why = why;
    }
    return false;
  }

  bool Explained(Trace& t, const StateId& id) {
    t.prev = id;
    ++t.next;
    return true;
  }
  bool Abandon(Trace& t) {  // a problem was reported: the rest cannot be derived
    t.next = t.lines.size();
    return true;
  }

  // Without rollbacks: every worker at `v` saw the same parameters.
  void Agree(uint64_t v, const std::vector<Seen>& seen) {
    for (const Seen& s : seen) {
      if (s.hash != seen.front().hash) {
        Problem("version " + std::to_string(v) + ": " + s.who + " saw " + s.hash + " (" + s.kind +
                "), " + seen.front().who + " saw " + seen.front().hash + " (" +
                seen.front().kind + ")");
        return;
      }
    }
  }

  // Version v reached only by Pulls after version `at` (state): each chunk is
  // at's (skipped) or the step's (applied at its home before the round). The
  // state at v, or nullopt with *why.
  std::optional<KeyValues> Realigned(uint64_t v, uint64_t at, const std::vector<float>& params,
                                     const KeyValues& from, std::string* why) {
    const KeyValues next = ReferenceStep(job_, from, at);
    KeyValues state = from;
    uint64_t applied = 0, skipped = 0;
    for (uint64_t first = 0, c = 0; first < job_.elements; first += job_.chunk_elements, ++c) {
      const size_t n = std::min<uint64_t>(job_.chunk_elements, job_.elements - first);
      if (SameBits(&params[first], &from.params[first], n)) {
        ++skipped;
        continue;
      }
      if (SameBits(&params[first], &next.params[first], n)) {
        ++applied;
        std::copy_n(&next.params[first], n, &state.params[first]);
        for (size_t s = 0; s < state.slots.size(); ++s) {
          std::copy_n(&next.slots[s][first], n, &state.slots[s][first]);
        }
        continue;
      }
      const uint32_t home = static_cast<uint32_t>((c / job_.lanes) % job_.racks);
      *why = "version " + std::to_string(v) + " (pulled after version " + std::to_string(at) +
             "): chunk " + std::to_string(c) + " (home rack " + std::to_string(home) +
             ") is neither version " + std::to_string(at) + "'s values (a skipped step) nor " +
             "the update from them" + Diff(next.params, params, first, n) +
             "; unchanged would be" + Diff(from.params, params, first, n);
      return std::nullopt;
    }
    if (applied > 0 && v == at + 1) {
      *why = "version " + std::to_string(v) + ": " + std::to_string(applied) +
             " chunk(s) hold the update from version " + std::to_string(at) +
             ", so the realigned version must be at least " + std::to_string(at + 2);
      return std::nullopt;
    }
    ++report_.recoveries;
    report_.chunks_applied += applied;
    report_.chunks_skipped += skipped;
    return state;
  }

  // Where `got` first differs from `want` in [first, first + n).
  static std::string Diff(const std::vector<float>& want, const std::vector<float>& got,
                          uint64_t first, uint64_t n) {
    for (uint64_t i = first; i < first + n; ++i) {
      if (!SameBits(&want[i], &got[i], 1)) {
        return " (element " + std::to_string(i) + ": " + Bits(got[i]) + ", expected " +
               Bits(want[i]) + ")";
      }
    }
    return " (same values)";
  }

  const CrossRackJob& job_;
  std::vector<Trace> traces_;
  std::map<uint64_t, std::vector<Seen>> seen_;
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
    << chunks_skipped << " skipped) checked against the reference, " << rollbacks
    << " Pulls back to an older version";
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
