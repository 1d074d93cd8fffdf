// Model profiles of rackhub-bench (--profile): how the model is split into
// keys. "even" splits --bytes evenly over --keys; "resnet50" uses the 161
// parameter tensors of ResNet-50 (torchvision's resnet50: 53 convolutions,
// 53 batch norms with weight and bias, the classifier's weight and bias;
// 25,557,032 parameters), in the order model.parameters() yields them.
#include <cstdint>
#include <vector>

#include "bench.h"

namespace rackhub::bench {

namespace {

std::vector<uint64_t> ResNet50Elements() {
  std::vector<uint64_t> t;
  const auto conv = [&](uint64_t in, uint64_t out, uint64_t k) { t.push_back(in * out * k * k); };
  const auto bn = [&](uint64_t c) {
    t.push_back(c);  // weight
    t.push_back(c);  // bias
  };
  conv(3, 64, 7);
  bn(64);
  uint64_t in = 64;
  const uint64_t blocks[4] = {3, 4, 6, 3};
  for (int layer = 0; layer < 4; ++layer) {
    const uint64_t width = 64ull << layer;
    for (uint64_t b = 0; b < blocks[layer]; ++b) {
      conv(in, width, 1);
      bn(width);
      conv(width, width, 3);
      bn(width);
      conv(width, 4 * width, 1);
      bn(4 * width);
      if (b == 0) {  // downsample of the block's input
        conv(in, 4 * width, 1);
        bn(4 * width);
      }
      in = 4 * width;
    }
  }
  t.push_back(2048 * 1000);  // fc weight
  t.push_back(1000);         // fc bias
  return t;
}

}  // namespace

bool ApplyProfile(const std::string& profile, WorkerParams* w) {
  if (profile == "even") return true;
  if (profile != "resnet50") return false;
  uint64_t total = 0;
  for (uint64_t e : ResNet50Elements()) total += e;
  w->keys = 161;
  w->bytes = total * 4;
  return true;
}

std::vector<uint64_t> KeyElements(const WorkerParams& w) {
  if (w.profile == "resnet50") return ResNet50Elements();
  const uint64_t total = w.bytes / 4;
  std::vector<uint64_t> sizes(w.keys, total / w.keys);
  sizes.back() += total % w.keys;
  return sizes;
}

}  // namespace rackhub::bench
