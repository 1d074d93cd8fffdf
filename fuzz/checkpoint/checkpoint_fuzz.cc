// checkpoint_fuzz: the checkpoint loader (server/state/checkpoint_file.h) on a
// file written from the input: ReadCheckpoint, ListCheckpoints and
// LoadNewestValid, as rackhubd runs them at start-up and on
// `rackhubctl checkpoint list|restore`.
// Input: byte 0 holds flags, the rest is the file. Flag 1 ("fix-up") first
// recomputes the checksums a damaged file would fail on (header, manifest,
// each chunk record and payload, found by walking the records the way
// docs/durability.md "Checkpoint file format" lays them out), so mutations
// reach the manifest and record checks behind them; flag 2 also sets the
// header's file size to the real one.
//
// Contract checked: every file loads or is refused with FAILED_PRECONDITION
// whose message starts with the path (no crash, leak, UB, huge allocation);
// ListCheckpoints and LoadNewestValid agree with ReadCheckpoint, and refuse a
// file whose manifest names another sequence than its file name;
// a file that loads is consistent (keys sorted, every chunk of every key
// present with `elements` values and `state_slots` slots), writes back with
// WriteCheckpoint and reads back bit for bit the same; the listing agrees
// with the loader on whether the header and manifest verify.
#include <unistd.h>
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint_file.h"

namespace {

namespace srv = rackhub::server;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "checkpoint_fuzz: contract broken: %s\n", what);
    std::abort();
  }
}

uint64_t Get64(const std::string& f, uint64_t off) {
  uint64_t v;
  std::memcpy(&v, f.data() + off, 8);
  return v;
}
void Put64(std::string* f, uint64_t off, uint64_t v) { std::memcpy(f->data() + off, &v, 8); }
uint64_t Hash(const std::string& f, uint64_t off, uint64_t n) {
  return XXH3_64bits(f.data() + off, n);
}

// Recomputes the checksums of the documented layout (format version 1).
void FixUp(std::string* f, bool fix_size) {
  if (f->size() < 64) return;
  if (fix_size) Put64(f, 32, f->size());
  const uint64_t manifest = Get64(*f, 16);
  if (manifest <= f->size() - 64) Put64(f, 24, Hash(*f, 64, manifest));
  Put64(f, 56, Hash(*f, 0, 56));
  uint64_t off = Get64(*f, 40);
  const uint64_t records = Get64(*f, 48);
  for (uint64_t i = 0; i < records && off <= f->size() && f->size() - off >= 64; ++i) {
    const uint64_t payload = Get64(*f, off + 24);
    if (payload > f->size() - off - 64) break;
    Put64(f, off + 32, Hash(*f, off + 64, payload));
    Put64(f, off + 56, Hash(*f, off, 56));
    off += 64 + (payload + 63) / 64 * 64;
  }
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

void CheckConsistent(const srv::CheckpointImage& img) {
  size_t next = 0;
  for (size_t k = 0; k < img.keys.size(); ++k) {
    const srv::CheckpointKey& key = img.keys[k];
    Check(k == 0 || img.keys[k - 1].id < key.id, "keys sorted by id");
    Check(key.state_slots <= 2 && key.chunk_elements > 0, "slots and chunk size");
    uint64_t covered = 0;
    for (uint32_t c = 0; c < key.chunk_count; ++c, ++next) {
      Check(next < img.chunks.size(), "every chunk present");
      const srv::CheckpointChunk& ch = img.chunks[next];
      Check(ch.key_id == key.id && ch.chunk == c, "chunks in order");
      Check(ch.params.size() <= key.chunk_elements && ch.state.size() == key.state_slots,
            "chunk size and slots");
      for (const auto& s : ch.state) Check(s.size() == ch.params.size(), "slot sizes");
      covered += ch.params.size();
    }
    Check(covered == key.elements, "the chunks hold the key's elements");
  }
  Check(next == img.chunks.size(), "no extra chunks");
}

void CheckRoundTrip(const srv::CheckpointImage& img, const std::string& dir) {
  const auto written = srv::WriteCheckpoint(dir, img, 1);
  Check(written.ok(), "a loaded image writes back");
  const auto back = srv::ReadCheckpoint(written->path);
  Check(back.ok(), "and reads back");
  Check(back->tenant == img.tenant && back->sequence == img.sequence &&
            back->created_unix_ms == img.created_unix_ms && back->keys.size() == img.keys.size() &&
            back->chunks.size() == img.chunks.size(),
        "the same image");
  for (size_t i = 0; i < img.chunks.size(); ++i) {
    Check(SameBits(back->chunks[i].params, img.chunks[i].params), "the same parameters");
    for (size_t s = 0; s < img.chunks[i].state.size(); ++s) {
      Check(SameBits(back->chunks[i].state[s], img.chunks[i].state[s]), "the same state");
    }
  }
}

struct Dirs {
  std::string in, out;
};

const Dirs& TempDirs() {
  static const Dirs dirs = [] {
    char tmpl[] = "/tmp/rackhub-checkpoint-fuzz-XXXXXX";
    Check(mkdtemp(tmpl) != nullptr, "mkdtemp");
    Dirs d{std::string(tmpl) + "/in", std::string(tmpl) + "/out"};
    std::filesystem::create_directories(d.in);
    return d;
  }();
  return dirs;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string file(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) FixUp(&file, data[0] & 2);
  const Dirs& dirs = TempDirs();
  const std::string path = dirs.in + "/" + srv::CheckpointFileName(7);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(file.data(), static_cast<std::streamsize>(file.size()));
    Check(out.good(), "input file written");
  }
  const auto loaded = srv::ReadCheckpoint(path);
  const auto listed = srv::ListCheckpoints(dirs.in);
  Check(listed.size() == 1 && listed[0].sequence == 7, "the file is listed");
  if (!loaded.ok()) {
    Check(loaded.status().code() == rackhub::StatusCode::kFailedPrecondition &&
              loaded.status().message().rfind(path, 0) == 0,
          "a damaged file is FAILED_PRECONDITION naming the path");
    std::vector<std::string> skipped;
    Check(!srv::LoadNewestValid(dirs.in, &skipped).ok() && skipped.size() == 1,
          "and skipped by LoadNewestValid");
    return 0;
  }
  // A file that verifies but whose manifest names another sequence than its
  // file name is damaged for the listing and for every restore (the
  // Checkpointer checks the name after ReadCheckpoint).
  std::vector<std::string> skipped;
  const auto newest = srv::LoadNewestValid(dirs.in, &skipped);
  if (loaded->sequence == 7) {
    Check(listed[0].problem.empty() && newest.ok(), "a file that loads is listed and loaded");
  } else {
    Check(!listed[0].problem.empty() && !newest.ok() && skipped.size() == 1,
          "a file under another sequence's name is listed as damaged and skipped");
  }
  CheckConsistent(*loaded);
  CheckRoundTrip(*loaded, dirs.out);
  return 0;
}
