#include "worker_set.h"

#include <signal.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <sstream>

namespace rackhub::testing {

WorkerLine ParseWorkerLine(const std::string& line) {
  std::istringstream ls(line);
  WorkerLine w;
  ls >> w.kind;
  if (w.kind == "pull" || w.kind == "iter") {
    ls >> w.iteration >> w.hash >> w.dump;
  } else if (w.kind == "bound") {
    ls >> w.iteration >> w.updates >> w.slowest;
  } else {
    std::getline(ls, w.text);
  }
  return w;
}

std::vector<WorkerLine> ReadWorkerOut(const std::string& path) {
  std::vector<WorkerLine> out;
  std::string text = ReadFile(path);
  text.erase(text.find_last_of('\n') == std::string::npos ? 0 : text.find_last_of('\n') + 1);
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(ParseWorkerLine(line));
  return out;
}

const std::vector<WorkerLine>& WorkerSet::Lines(const std::string& file) const {
  Cached& c = cache_[file];
  std::ifstream in(file, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(c.offset));
  std::string fresh((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c.offset += fresh.size();
  c.partial += fresh;
  size_t start = 0;
  for (size_t end; (end = c.partial.find('\n', start)) != std::string::npos; start = end + 1) {
    c.lines.push_back(ParseWorkerLine(c.partial.substr(start, end - start)));
  }
  c.partial.erase(0, start);
  return c.lines;
}

std::string WorkerSet::Name(const Member& m) {
  return "rack " + std::to_string(m.first) + " rank " + std::to_string(m.second);
}

void WorkerSet::Start(uint32_t rank, uint32_t rack) {
  const Member m{rack, rank};
  const std::string out = setup_.dir + "/rack" + std::to_string(rack) + "-rank" +
                          std::to_string(rank) + "-" + std::to_string(files_.size()) + ".out";
  files_.emplace_back(m, out);
  current_[m] = out;
  std::vector<std::string> argv{BinPath("rackhub-durability-worker"),
                                "--hub",
                                setup_.hubs.at(rack),
                                "--tenant",
                                setup_.tenant,
                                "--token",
                                setup_.token,
                                "--rank",
                                std::to_string(rank),
                                "--out",
                                out};
  if (setup_.hubs.size() > 1) argv.insert(argv.end(), {"--rack", std::to_string(rack)});
  argv.insert(argv.end(), setup_.args.begin(), setup_.args.end());
  procs_[m] = std::make_unique<ChildProcess>(argv, out + ".log");
}

void WorkerSet::Kill(uint32_t rank, uint32_t rack) {
  auto& p = procs_[{rack, rank}];
  p->Kill(SIGKILL);
  p->Wait(std::chrono::seconds(10));
  p.reset();
}

ChildProcess* WorkerSet::Process(uint32_t rank, uint32_t rack) {
  const auto it = procs_.find({rack, rank});
  return it == procs_.end() ? nullptr : it->second.get();
}

int WorkerSet::Wait(uint32_t rank, uint32_t rack, std::chrono::milliseconds limit) {
  ChildProcess* p = Process(rank, rack);
  return p ? p->Wait(limit) : -1;
}

uint64_t WorkerSet::Newest(const std::set<std::string>& kinds) const {
  uint64_t m = 0;
  for (const auto& [member, f] : files_) {
    for (const auto& l : Lines(f)) {
      if (kinds.count(l.kind)) m = std::max(m, l.iteration);
    }
  }
  return m;
}

uint64_t WorkerSet::MaxIteration() const { return Newest({"iter", "bound"}); }

uint64_t WorkerSet::MaxVersion() const { return Newest({"iter", "bound", "pull"}); }

uint64_t WorkerSet::MinCurrent() const {
  uint64_t m = UINT64_MAX;
  for (const auto& [member, f] : current_) {
    uint64_t mine = 0;
    for (const auto& l : Lines(f)) {
      if (l.kind == "iter" || l.kind == "bound") mine = std::max(mine, l.iteration);
    }
    m = std::min(m, mine);
  }
  return m;
}

std::string WorkerSet::Problems() {
  std::string out = Exited();
  std::map<uint64_t, std::pair<std::string, std::string>> hashes;  // iteration -> hash, file
  for (const auto& [member, f] : files_) {
    for (const auto& l : Lines(f)) {
      if (l.kind == "error") out += f + ": error " + l.text + "\n";
      if (l.kind == "bound" && setup_.bound >= 0 &&
          l.iteration > l.slowest + static_cast<uint64_t>(setup_.bound)) {
        out += f + ": iteration " + std::to_string(l.iteration) + " released with the slowest at " +
               std::to_string(l.slowest) + ", beyond bounded:" + std::to_string(setup_.bound) +
               "\n";
      }
      if (l.kind != "pull" && l.kind != "iter") continue;
      if (setup_.bound >= 0) continue;  // workers see different parameters there
      auto [it, fresh] = hashes.try_emplace(l.iteration, l.hash, f);
      if (!fresh && it->second.first != l.hash) {
        out += "iteration " + std::to_string(l.iteration) + ": " + f + " has " + l.hash + ", " +
               it->second.second + " has " + it->second.first + "\n";
      }
    }
  }
  return out;
}

std::set<std::string> WorkerSet::Transports() const {
  std::set<std::string> out;
  for (const auto& [member, f] : files_) {
    for (const auto& l : Lines(f)) {
      if (l.kind == "transport") out.insert(l.text.substr(l.text.find_first_not_of(' ')));
    }
  }
  return out;
}

size_t WorkerSet::Resyncs() const {
  size_t n = 0;
  for (const auto& [member, f] : files_) {
    for (const auto& l : Lines(f)) n += l.kind == "resync";
  }
  return n;
}

std::string WorkerSet::Exited() {
  std::string out;
  for (auto& [member, p] : procs_) {
    const int code = p ? p->Wait(std::chrono::milliseconds(0)) : -1;
    if (code != -1) {
      out += Name(member) + " exited with " + std::to_string(code) + ": " +
             Tail(member.second, member.first) + "\n";
    }
  }
  return out;
}

std::string WorkerSet::Tail(uint32_t rank, uint32_t rack) const {
  const auto it = current_.find({rack, rank});
  if (it == current_.end()) return "";
  // The last 8 lines, each cut at 300 characters (pull lines may carry values).
  const auto tail = [](const std::string& s) {
    std::vector<std::string> lines;
    std::istringstream in(s);
    for (std::string l; std::getline(in, l);) {
      lines.push_back(l.size() > 300 ? l.substr(0, 300) + "..." : l);
    }
    std::string out;
    for (size_t i = lines.size() > 8 ? lines.size() - 8 : 0; i < lines.size(); ++i) {
      out += lines[i] + "\n";
    }
    return out;
  };
  return tail(ReadFile(it->second)) + tail(ReadFile(it->second + ".log"));
}

}  // namespace rackhub::testing
