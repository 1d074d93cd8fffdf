// rackhub-checkpoint-bench: how fast checkpoint files are written and read
// (server/state/checkpoint_file.h) compared with what the disk itself does in
// the same directory: a plain sequential write loop + fdatasync, and a plain
// sequential read of a file whose pages were dropped from the page cache.
//
// Per round and per tenant size, interleaved: disk write, WriteCheckpoint
// (including its fdatasync, rename and directory fsync), disk read (cold),
// ReadCheckpoint cold (pages dropped with posix_fadvise(DONTNEED) after the
// file was made durable), ReadCheckpoint warm (right after, from the page
// cache). Reports the median of the rounds in GB/s (1e9 bytes per second) of
// parameter + optimizer-state bytes and the ratio to the disk's figure.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "checkpoint_file.h"

namespace {

using rackhub::server::CheckpointImage;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// A tenant of `bytes` parameter + state bytes: 8 Adam keys (params, m, v) in
// 32 KiB chunks, arbitrary values.
CheckpointImage MakeTenant(uint64_t bytes) {
  CheckpointImage img;
  img.tenant = "bench";
  img.sequence = 1;
  const uint64_t elements_total = bytes / 12;
  const uint32_t chunk_elements = 8192;
  uint64_t x = 88172645463325252ull;
  for (uint32_t id = 1; id <= 8; ++id) {
    rackhub::server::CheckpointKey k;
    k.id = id;
    k.name = "layer" + std::to_string(id);
    k.elements = elements_total / 8;
    k.chunk_elements = chunk_elements;
    k.chunk_count = static_cast<uint32_t>((k.elements + chunk_elements - 1) / chunk_elements);
    k.optimizer = "adam";
    k.state_slots = 2;
    k.version = 1000;
    for (uint32_t c = 0; c < k.chunk_count; ++c) {
      rackhub::server::CheckpointChunk ch;
      ch.key_id = id;
      ch.chunk = c;
      const size_t n = std::min<uint64_t>(chunk_elements, k.elements - uint64_t{c} * chunk_elements);
      auto fill = [&](std::vector<float>& v) {
        v.resize(n);
        for (float& f : v) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;
          f = static_cast<float>(static_cast<int64_t>(x >> 40) - (1 << 23)) * 1e-7f;
        }
      };
      fill(ch.params);
      ch.state.resize(2);
      fill(ch.state[0]);
      fill(ch.state[1]);
      img.chunks.push_back(std::move(ch));
    }
    img.keys.push_back(std::move(k));
  }
  return img;
}

uint64_t PayloadBytes(const CheckpointImage& img) {
  uint64_t b = 0;
  for (const auto& c : img.chunks) b += c.params.size() * 4 * (1 + c.state.size());
  return b;
}

void DropCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Plain sequential write of `bytes` in 8 MiB writes, then fdatasync.
double DiskWrite(const std::string& path, uint64_t bytes) {
  std::vector<char> buf(8 << 20, 'r');
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::perror("open"), std::exit(1);
  for (uint64_t done = 0; done < bytes;) {
    const ssize_t n = ::write(fd, buf.data(), std::min<uint64_t>(buf.size(), bytes - done));
    if (n <= 0) std::perror("write"), std::exit(1);
    done += static_cast<uint64_t>(n);
  }
  ::fdatasync(fd);
  ::close(fd);
  return Seconds(t0);
}

// Plain sequential read of the file in 8 MiB reads, pages dropped first.
double DiskReadCold(const std::string& path) {
  DropCache(path);
  std::vector<char> buf(8 << 20);
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  while (::read(fd, buf.data(), buf.size()) > 0) {
  }
  ::close(fd);
  return Seconds(t0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"rackhub-checkpoint-bench: checkpoint write/read speed vs. the disk"};
  std::string dir = "/var/tmp/rackhub-checkpoint-bench";
  std::vector<uint64_t> sizes_mib = {256, 1024};
  int rounds = 5;
  app.add_option("--dir", dir, "directory on the disk to measure (created; emptied at the end)");
  app.add_option("--sizes-mib", sizes_mib, "tenant sizes (parameter + state MiB), e.g. 256,1024")
      ->delimiter(',');
  app.add_option("--rounds", rounds, "interleaved rounds (the median is reported)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  std::filesystem::create_directories(dir);
  const std::string tenant_dir = dir + "/tenant";
  const std::string plain = dir + "/plain.bin";
  struct Row {
    uint64_t bytes = 0;
    std::vector<double> disk_w, ckpt_w, disk_r, ckpt_rc, ckpt_rw;
  };
  std::vector<Row> rows;
  std::vector<CheckpointImage> images;
  for (uint64_t mib : sizes_mib) {
    images.push_back(MakeTenant(mib << 20));
    rows.emplace_back();
    rows.back().bytes = PayloadBytes(images.back());
  }
  for (int r = 0; r < rounds; ++r) {
    for (size_t s = 0; s < images.size(); ++s) {
      Row& row = rows[s];
      CheckpointImage& img = images[s];
      img.sequence = static_cast<uint64_t>(r + 1);
      const double gb = static_cast<double>(row.bytes) / 1e9;
      row.disk_w.push_back(gb / DiskWrite(plain, row.bytes));
      auto t0 = Clock::now();
      auto info = rackhub::server::WriteCheckpoint(tenant_dir, img, 1);
      row.ckpt_w.push_back(gb / Seconds(t0));
      if (!info.ok()) {
        std::fprintf(stderr, "%s\n", info.status().ToString().c_str());
        return 1;
      }
      row.disk_r.push_back(gb / DiskReadCold(plain));
      std::filesystem::remove(plain);
      DropCache(info->path);
      t0 = Clock::now();
      auto back = rackhub::server::ReadCheckpoint(info->path);
      row.ckpt_rc.push_back(gb / Seconds(t0));
      if (!back.ok()) {
        std::fprintf(stderr, "%s\n", back.status().ToString().c_str());
        return 1;
      }
      back = rackhub::NotFound("released");  // free the first copy before the second read
      t0 = Clock::now();
      back = rackhub::server::ReadCheckpoint(info->path);
      row.ckpt_rw.push_back(gb / Seconds(t0));
      std::fprintf(stderr, "round %d, %.0f MiB: disk w %.2f, ckpt w %.2f, disk r %.2f, "
                   "ckpt r cold %.2f warm %.2f GB/s\n",
                   r + 1, row.bytes / 1048576.0, row.disk_w.back(), row.ckpt_w.back(),
                   row.disk_r.back(), row.ckpt_rc.back(), row.ckpt_rw.back());
    }
  }
  std::printf("| tenant (param+state) | disk write | WriteCheckpoint | ratio | disk read (cold) "
              "| ReadCheckpoint cold | ratio | ReadCheckpoint warm |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Row& row : rows) {
    const double dw = Median(row.disk_w), cw = Median(row.ckpt_w), dr = Median(row.disk_r),
                 rc = Median(row.ckpt_rc), rw = Median(row.ckpt_rw);
    std::printf("| %.0f MiB | %.2f GB/s | %.2f GB/s | %.2f | %.2f GB/s | %.2f GB/s | %.2f | %.2f "
                "GB/s |\n",
                row.bytes / 1048576.0, dw, cw, cw / dw, dr, rc, rc / dr, rw);
  }
  std::printf("(median of %d interleaved rounds; GB/s = 1e9 bytes of parameters + optimizer "
              "state per second)\n", rounds);
  (void)rackhub::server::RemoveTenantCheckpoints(tenant_dir);
  return 0;
}
