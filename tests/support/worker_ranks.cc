#include "worker_ranks.h"

#include <cstring>
#include <sstream>

namespace rackhub::testing {

std::vector<std::string> Words(const std::string& line) {
  std::vector<std::string> w;
  std::istringstream in(line);
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

std::vector<float> HexFloats(const std::vector<std::string>& words, size_t from) {
  std::vector<float> v;
  for (size_t i = from; i < words.size(); ++i) {
    const uint32_t bits = static_cast<uint32_t>(std::stoul(words[i], nullptr, 16));
    float f;
    std::memcpy(&f, &bits, 4);
    v.push_back(f);
  }
  return v;
}

WorkerOutput ParseWorker(const std::string& path) {
  WorkerOutput w;
  w.text = ReadFile(path);
  std::istringstream in(w.text);
  for (std::string line; std::getline(in, line);) {
    const auto words = Words(line);
    if (words.empty()) continue;
    if (words[0] == "key" && words.size() == 3) w.key_ids[words[1]] = std::stoul(words[2]);
    if (words[0] == "init" && words.size() >= 2) w.init[words[1]] = HexFloats(words, 2);
    if (words[0] == "iter" && words.size() >= 3) {
      w.iters[{std::stoull(words[1]), words[2]}] = HexFloats(words, 3);
    }
    if (words[0] == "error" || words[0].find("_error") != std::string::npos) w.errors.push_back(line);
    if (words[0] == "done") w.done = true;
  }
  return w;
}

}  // namespace rackhub::testing
