// Unit tests for checkpoint files (server/state/checkpoint_file.h): bit-exact
// round trips, retention, every kind of damage refused with a precise
// message and skipped by LoadNewestValid, and crash safety under SIGKILL.

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint_file.h"

extern char** environ;

namespace rackhub::server {
namespace {

namespace fs = std::filesystem;

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Arbitrary bit patterns (NaNs with payloads, infinities, -0, denormals
// included) as a function of (sequence, key, chunk, slot, element).
uint32_t Bits(uint64_t seq, uint32_t key, uint32_t chunk, uint32_t slot, uint32_t i) {
  return static_cast<uint32_t>(
      Mix(seq * 0x100000001b3ull ^ (uint64_t{key} << 40) ^ (uint64_t{chunk} << 20) ^
          (uint64_t{slot} << 56) ^ i));
}

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t ToBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

struct KeySpec {
  uint32_t id;
  std::string name;
  uint64_t elements;
  uint32_t chunk_elements;
  uint32_t slots;
  std::string optimizer;
};

CheckpointImage MakeImage(uint64_t seq, const std::vector<KeySpec>& specs) {
  CheckpointImage img;
  img.tenant = "team-a";
  img.sequence = seq;
  img.created_unix_ms = 1790000000000 + static_cast<int64_t>(seq);
  for (const KeySpec& s : specs) {
    CheckpointKey k;
    k.id = s.id;
    k.name = s.name;
    k.elements = s.elements;
    k.chunk_elements = s.chunk_elements;
    k.chunk_count = static_cast<uint32_t>((s.elements + s.chunk_elements - 1) / s.chunk_elements);
    k.version = seq * 10 + s.id;
    k.optimizer = s.optimizer;
    k.state_slots = s.slots;
    for (uint32_t c = 0; c < k.chunk_count; ++c) {
      CheckpointChunk ch;
      ch.key_id = k.id;
      ch.chunk = c;
      const uint32_t n = static_cast<uint32_t>(
          std::min<uint64_t>(s.chunk_elements, s.elements - uint64_t{c} * s.chunk_elements));
      ch.params.resize(n);
      for (uint32_t i = 0; i < n; ++i) ch.params[i] = FromBits(Bits(seq, k.id, c, 0, i));
      ch.state.resize(s.slots);
      for (uint32_t sl = 0; sl < s.slots; ++sl) {
        ch.state[sl].resize(n);
        for (uint32_t i = 0; i < n; ++i) ch.state[sl][i] = FromBits(Bits(seq, k.id, c, sl + 1, i));
      }
      img.chunks.push_back(std::move(ch));
    }
    img.keys.push_back(std::move(k));
  }
  // Special values at fixed places (besides the random NaNs and denormals).
  auto& p = img.chunks.front().params;
  p[0] = -0.0f;
  p[1] = std::numeric_limits<float>::infinity();
  p[2] = -std::numeric_limits<float>::infinity();
  p[3] = FromBits(0x7fc01234);  // quiet NaN with a payload
  p[4] = FromBits(0xff800001);  // signalling NaN, sign set
  p[5] = std::numeric_limits<float>::denorm_min();
  return img;
}

// Several keys: odd chunk sizes, short last chunks, 0/1/2 state slots, a key
// with no elements.
std::vector<KeySpec> SmallSpecs() {
  return {{1, "w", 1000, 256, 2, "adam"},
          {2, "b", 7, 16, 0, "sgd"},
          {5, "m", 333, 64, 1, "momentum"},
          {6, "empty", 0, 64, 0, "sgd"},
          {9, "acc", 4099, 1024, 1, "adagrad"}};
}

// Compares every field and every float bit for bit.
void ExpectBitEqual(const CheckpointImage& a, const CheckpointImage& b) {
  EXPECT_EQ(a.tenant, b.tenant);
  EXPECT_EQ(a.sequence, b.sequence);
  EXPECT_EQ(a.created_unix_ms, b.created_unix_ms);
  ASSERT_EQ(a.keys.size(), b.keys.size());
  for (size_t i = 0; i < a.keys.size(); ++i) {
    const CheckpointKey &x = a.keys[i], &y = b.keys[i];
    EXPECT_EQ(x.id, y.id);
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.elements, y.elements);
    EXPECT_EQ(x.chunk_count, y.chunk_count);
    EXPECT_EQ(x.chunk_elements, y.chunk_elements);
    EXPECT_EQ(x.version, y.version);
    EXPECT_EQ(x.optimizer, y.optimizer);
    EXPECT_EQ(x.state_slots, y.state_slots);
  }
  ASSERT_EQ(a.chunks.size(), b.chunks.size());
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    const CheckpointChunk &x = a.chunks[i], &y = b.chunks[i];
    ASSERT_EQ(x.key_id, y.key_id);
    ASSERT_EQ(x.chunk, y.chunk);
    ASSERT_EQ(x.params.size(), y.params.size());
    ASSERT_EQ(0, std::memcmp(x.params.data(), y.params.data(), x.params.size() * 4))
        << "params of chunk " << i;
    ASSERT_EQ(x.state.size(), y.state.size());
    for (size_t s = 0; s < x.state.size(); ++s) {
      ASSERT_EQ(x.state[s].size(), y.state[s].size());
      ASSERT_EQ(0, std::memcmp(x.state[s].data(), y.state[s].data(), x.state[s].size() * 4))
          << "state " << s << " of chunk " << i;
    }
  }
}

class CheckpointFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rackhub_ckpt_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/tenants/team-a";
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string Path(uint64_t seq) const { return dir_ + "/" + CheckpointFileName(seq); }

  std::string root_;
  std::string dir_;
};

TEST_F(CheckpointFileTest, RoundTripIsBitExact) {
  const CheckpointImage img = MakeImage(42, SmallSpecs());
  ASSERT_EQ(ToBits(img.chunks[0].params[0]), 0x80000000u);
  Result<CheckpointInfo> info = WriteCheckpoint(dir_, img, 3);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->path, Path(42));
  EXPECT_EQ(CheckpointFileName(42), "ckpt-00000000000000000042.rhc");
  EXPECT_EQ(info->bytes, fs::file_size(Path(42)));
  EXPECT_EQ(info->bytes % 64, 0u);
  struct stat st;
  ASSERT_EQ(::stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  Result<CheckpointImage> back = ReadCheckpoint(Path(42));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectBitEqual(img, *back);

  const std::vector<CheckpointInfo> list = ListCheckpoints(dir_);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].sequence, 42u);
  EXPECT_EQ(list[0].created_unix_ms, img.created_unix_ms);
  EXPECT_EQ(list[0].problem, "");
  ASSERT_EQ(list[0].key_versions.size(), 5u);
  EXPECT_EQ(list[0].key_versions[0], (std::pair<std::string, uint64_t>{"w", 421}));
  EXPECT_EQ(list[0].key_versions, info->key_versions);
}

TEST_F(CheckpointFileTest, EmptyImageRoundTrips) {
  CheckpointImage img;
  img.tenant = "t";
  img.sequence = 1;
  ASSERT_TRUE(WriteCheckpoint(dir_, img, 1).ok());
  Result<CheckpointImage> back = ReadCheckpoint(Path(1));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectBitEqual(img, *back);
}

TEST_F(CheckpointFileTest, KeepDeletesTheOldest) {
  const auto specs = SmallSpecs();
  for (uint64_t seq = 1; seq <= 5; ++seq) ASSERT_TRUE(WriteCheckpoint(dir_, MakeImage(seq, specs), 3).ok());
  std::vector<uint64_t> seqs;
  for (const auto& i : ListCheckpoints(dir_)) seqs.push_back(i.sequence);
  EXPECT_EQ(seqs, (std::vector<uint64_t>{5, 4, 3}));
  // An older sequence written now is kept even beyond `keep` (never delete
  // the file just written); the oldest others go.
  ASSERT_TRUE(WriteCheckpoint(dir_, MakeImage(2, specs), 1).ok());
  seqs.clear();
  for (const auto& i : ListCheckpoints(dir_)) seqs.push_back(i.sequence);
  EXPECT_EQ(seqs, (std::vector<uint64_t>{5, 2}));
  ASSERT_TRUE(WriteCheckpoint(dir_, MakeImage(6, specs), 1).ok());
  seqs.clear();
  for (const auto& i : ListCheckpoints(dir_)) seqs.push_back(i.sequence);
  EXPECT_EQ(seqs, (std::vector<uint64_t>{6}));
  Result<CheckpointInfo> zero = WriteCheckpoint(dir_, MakeImage(7, specs), 0);
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(Path(7)));
}

TEST_F(CheckpointFileTest, InconsistentImageIsRefusedAndNothingWritten) {
  CheckpointImage img = MakeImage(3, SmallSpecs());
  img.chunks.erase(img.chunks.begin() + 2);
  Result<CheckpointInfo> r = WriteCheckpoint(dir_, img, 2);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), Path(3) + ": chunk 2 of key 'w': expected at position 2, found "
                                            "key 1 chunk 3");
  img = MakeImage(3, SmallSpecs());
  img.chunks[1].state.pop_back();
  r = WriteCheckpoint(dir_, img, 2);
  EXPECT_EQ(r.status().message(), Path(3) + ": chunk 1 of key 'w': 1 state slots, the key has 2");
  img = MakeImage(3, SmallSpecs());
  img.chunks[3].params.push_back(1.0f);
  r = WriteCheckpoint(dir_, img, 2);
  EXPECT_EQ(r.status().message(), Path(3) + ": chunk 3 of key 'w': 233 params, expected 232");
  img = MakeImage(3, SmallSpecs());
  std::swap(img.keys[0], img.keys[1]);
  r = WriteCheckpoint(dir_, img, 2);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ListCheckpoints(dir_).empty());
}

// ---------------------------------------------------------------------------
// Damage: each kind is refused by ReadCheckpoint with a precise message, and
// LoadNewestValid skips it (reporting why) and returns the older valid one.

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
uint64_t Get64(const std::string& b, size_t at) {
  uint64_t v;
  std::memcpy(&v, b.data() + at, 8);
  return v;
}

// Byte offset of the record of the `index`-th chunk (in file order), from
// the documented layout: records follow the data offset, each 64 + the
// payload rounded up to 64.
uint64_t RecordOffset(const std::string& file, const CheckpointImage& img, size_t index) {
  uint64_t at = Get64(file, 40);
  for (size_t i = 0; i < index; ++i) {
    const auto& c = img.chunks[i];
    const uint64_t payload = c.params.size() * 4 * (1 + c.state.size());
    at += 64 + (payload + 63) / 64 * 64;
  }
  return at;
}

class CheckpointDamageTest : public CheckpointFileTest {
 protected:
  void SetUp() override {
    CheckpointFileTest::SetUp();
    old_ = MakeImage(1, SmallSpecs());
    new_ = MakeImage(2, SmallSpecs());
    ASSERT_TRUE(WriteCheckpoint(dir_, old_, 5).ok());
    ASSERT_TRUE(WriteCheckpoint(dir_, new_, 5).ok());
    bytes_ = ReadAll(Path(2));
  }

  // Replaces file 2 with `damaged`, then checks both refusals and the fallback.
  void ExpectRefused(const std::string& damaged, const std::string& reason) {
    WriteAll(Path(2), damaged);
    Result<CheckpointImage> r = ReadCheckpoint(Path(2));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(r.status().message(), Path(2) + ": " + reason);
    std::vector<std::string> skipped;
    Result<CheckpointImage> loaded = LoadNewestValid(dir_, &skipped);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    ExpectBitEqual(old_, *loaded);
    EXPECT_EQ(skipped, std::vector<std::string>{Path(2) + ": " + reason});
    const auto list = ListCheckpoints(dir_);
    ASSERT_EQ(list.size(), 2u);
    EXPECT_EQ(list[0].sequence, 2u);
    EXPECT_EQ(list[1].problem, "");
  }

  std::string Flip(size_t at) const {
    std::string b = bytes_;
    b[at] = static_cast<char>(b[at] ^ 0x10);
    return b;
  }

  CheckpointImage old_, new_;
  std::string bytes_;
};

TEST_F(CheckpointDamageTest, EmptyFile) { ExpectRefused("", "empty file (0 bytes)"); }

TEST_F(CheckpointDamageTest, TruncatedInsideTheHeader) {
  ExpectRefused(bytes_.substr(0, 30), "truncated at byte 30 of the 64-byte header");
}

TEST_F(CheckpointDamageTest, TruncatedInsideTheManifest) {
  const std::string total = std::to_string(bytes_.size());
  ExpectRefused(bytes_.substr(0, 64), "truncated at byte 64 of " + total);
  ExpectRefused(bytes_.substr(0, 90), "truncated at byte 90 of " + total);
}

TEST_F(CheckpointDamageTest, TruncatedInsideChunks) {
  const std::string total = std::to_string(bytes_.size());
  const size_t first = RecordOffset(bytes_, new_, 0);
  ExpectRefused(bytes_.substr(0, first + 10), "truncated at byte " + std::to_string(first + 10) +
                                                  " of " + total);
  ExpectRefused(bytes_.substr(0, bytes_.size() - 1),
                "truncated at byte " + std::to_string(bytes_.size() - 1) + " of " + total);
  ExpectRefused(bytes_.substr(0, bytes_.size() - 100),
                "truncated at byte " + std::to_string(bytes_.size() - 100) + " of " + total);
}

TEST_F(CheckpointDamageTest, TrailingBytes) {
  ExpectRefused(bytes_ + std::string(5, 'x'),
                "5 unexpected bytes after byte " + std::to_string(bytes_.size()));
}

TEST_F(CheckpointDamageTest, BitFlipInHeader) {
  ExpectRefused(Flip(0), "not a checkpoint file (bad magic)");
  ExpectRefused(Flip(17), "header checksum mismatch");  // manifest length
  ExpectRefused(Flip(60), "header checksum mismatch");  // the checksum itself
}

TEST_F(CheckpointDamageTest, BitFlipInManifest) {
  ExpectRefused(Flip(64 + 3), "manifest checksum mismatch");
  ExpectRefused(Flip(64 + Get64(bytes_, 16) - 1), "manifest checksum mismatch");
}

TEST_F(CheckpointDamageTest, BitFlipInChunkPayload) {
  // Chunk 2 of key 'w' (its third chunk), somewhere in its second state slot.
  const uint64_t rec = RecordOffset(bytes_, new_, 2);
  ExpectRefused(Flip(rec + 64 + 256 * 4 * 2 + 77), "chunk 2 of key 'w': checksum mismatch");
  // The last chunk of the last key ('acc' has 5 chunks; the last holds 3 elements).
  const size_t last = new_.chunks.size() - 1;
  ExpectRefused(Flip(RecordOffset(bytes_, new_, last) + 64 + 5),
                "chunk 4 of key 'acc': checksum mismatch");
}

TEST_F(CheckpointDamageTest, BitFlipInRecordHeader) {
  const uint64_t rec = RecordOffset(bytes_, new_, 4);  // 'b' chunk 0 (after 4 of 'w')
  ExpectRefused(Flip(rec + 12), "chunk 0 of key 'b' (record at byte " + std::to_string(rec) +
                                    "): record header checksum mismatch");
}

TEST_F(CheckpointDamageTest, DuplicatedChunkRecord) {
  // Record 1 ('w' chunk 1) overwritten by a copy of record 0 (same size): a
  // chunk present twice and one missing.
  const uint64_t r0 = RecordOffset(bytes_, new_, 0), r1 = RecordOffset(bytes_, new_, 1);
  std::string b = bytes_;
  b.replace(r1, r1 - r0, bytes_.substr(r0, r1 - r0));
  ExpectRefused(b, "chunk 1 of key 'w' (record at byte " + std::to_string(r1) +
                       "): record holds key id 1 chunk 0 (256 elements, 2 slots, version 21), not "
                       "what the manifest says");
}

TEST_F(CheckpointDamageTest, OtherFormatVersion) {
  std::string b = bytes_;
  const uint32_t v = 7;
  std::memcpy(&b[8], &v, 4);  // the header checksum is stale too: the version is checked first
  ExpectRefused(b, "format version 7, this rackhubd reads 1");
}

TEST_F(CheckpointDamageTest, NotACheckpoint) {
  ExpectRefused(std::string(4096, 'z'), "not a checkpoint file (bad magic)");
}

TEST_F(CheckpointDamageTest, EverythingDamagedIsNotFound) {
  WriteAll(Path(1), "");
  WriteAll(Path(2), bytes_.substr(0, 100));
  std::vector<std::string> skipped;
  Result<CheckpointImage> r = LoadNewestValid(dir_, &skipped);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_EQ(skipped[0], Path(2) + ": truncated at byte 100 of " + std::to_string(bytes_.size()));
  EXPECT_EQ(skipped[1], Path(1) + ": empty file (0 bytes)");
  EXPECT_EQ(LoadNewestValid(root_ + "/nope", nullptr).status().code(), StatusCode::kNotFound);
}

TEST_F(CheckpointDamageTest, LeftoverTempFileIsIgnoredThenDeleted) {
  // What a crash mid-write leaves: the chunks written, the header not yet.
  const std::string tmp = Path(3) + ".tmp";
  std::string partial = bytes_;
  std::fill(partial.begin(), partial.begin() + 64, '\0');
  WriteAll(tmp, partial);
  Result<CheckpointImage> r = ReadCheckpoint(tmp);
  EXPECT_EQ(r.status().message(), tmp + ": not a checkpoint file (bad magic)");
  WriteAll(tmp, bytes_.substr(0, 1000));
  EXPECT_EQ(ReadCheckpoint(tmp).status().message(),
            tmp + ": truncated at byte 1000 of " + std::to_string(bytes_.size()));
  EXPECT_EQ(ListCheckpoints(dir_).size(), 2u);
  std::vector<std::string> skipped;
  Result<CheckpointImage> loaded = LoadNewestValid(dir_, &skipped);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->sequence, 2u);
  EXPECT_TRUE(skipped.empty());
  ASSERT_TRUE(WriteCheckpoint(dir_, MakeImage(4, SmallSpecs()), 5).ok());
  EXPECT_FALSE(fs::exists(tmp));
}

TEST_F(CheckpointFileTest, ListAndDelete) {
  EXPECT_TRUE(ListCheckpoints(dir_).empty());  // no directory yet
  for (uint64_t seq : {3, 10, 7}) ASSERT_TRUE(WriteCheckpoint(dir_, MakeImage(seq, SmallSpecs()), 9).ok());
  WriteAll(dir_ + "/notes.txt", "not ours");
  WriteAll(dir_ + "/ckpt-12.rhc", "bad name, not ours");
  WriteAll(Path(20), "garbage");
  auto list = ListCheckpoints(dir_);
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(list[0].sequence, 20u);
  EXPECT_EQ(list[0].problem, Path(20) + ": truncated at byte 7 of the 64-byte header");
  EXPECT_EQ(list[1].sequence, 10u);
  EXPECT_EQ(list[2].sequence, 7u);
  EXPECT_EQ(list[3].sequence, 3u);
  EXPECT_EQ(list[1].problem, "");
  EXPECT_EQ(list[1].bytes, fs::file_size(Path(10)));

  EXPECT_TRUE(DeleteCheckpoint(dir_, 10).ok());
  EXPECT_EQ(DeleteCheckpoint(dir_, 10).code(), StatusCode::kNotFound);
  list = ListCheckpoints(dir_);
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[1].sequence, 7u);

  // The tenant is deleted: our files go; the directory stays while others remain.
  WriteAll(Path(11) + ".tmp", "x");
  EXPECT_TRUE(RemoveTenantCheckpoints(dir_).ok());
  EXPECT_TRUE(ListCheckpoints(dir_).empty());
  EXPECT_FALSE(fs::exists(Path(11) + ".tmp"));
  EXPECT_TRUE(fs::exists(dir_ + "/notes.txt"));
  fs::remove(dir_ + "/notes.txt");
  fs::remove(dir_ + "/ckpt-12.rhc");
  EXPECT_TRUE(RemoveTenantCheckpoints(dir_).ok());
  EXPECT_FALSE(fs::exists(dir_));
  EXPECT_TRUE(RemoveTenantCheckpoints(dir_).ok());  // already gone
}

// ---------------------------------------------------------------------------
// Crash safety: a child process writes a large checkpoint and is SIGKILLed at
// a random moment; whatever is left, LoadNewestValid returns the old or the
// new complete image, and every listed file verifies.

constexpr char kCrashDirEnv[] = "RACKHUB_CKPT_CRASH_DIR";
constexpr char kCrashSeqEnv[] = "RACKHUB_CKPT_CRASH_SEQ";

std::vector<KeySpec> BigSpecs() {  // ~64 MiB of params + state
  return {{1, "emb", 4u << 20, 8192, 2, "adam"},
          {2, "fc", 1u << 20, 8192, 1, "momentum"},
          {3, "bias", 1000, 8192, 0, "sgd"}};
}

// Checks `img` is exactly MakeImage(seq, BigSpecs()) without building it.
void ExpectIsBigImage(const CheckpointImage& img, uint64_t seq) {
  ASSERT_EQ(img.sequence, seq);
  const CheckpointImage want = MakeImage(seq, BigSpecs());
  ExpectBitEqual(want, img);
}

// The child: run only by the crash test (through exec, so it starts with a
// fresh TBB scheduler), with the directory and sequence in the environment.
TEST(CheckpointCrashChild, DISABLED_WriteBig) {
  const char* dir = std::getenv(kCrashDirEnv);
  const char* seq = std::getenv(kCrashSeqEnv);
  ASSERT_NE(dir, nullptr);
  ASSERT_NE(seq, nullptr);
  const Result<CheckpointInfo> r =
      WriteCheckpoint(dir, MakeImage(std::strtoull(seq, nullptr, 10), BigSpecs()), 2);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
}

pid_t SpawnWriter(const std::string& dir, uint64_t seq) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  env_strings.push_back(std::string(kCrashDirEnv) + "=" + dir);
  env_strings.push_back(std::string(kCrashSeqEnv) + "=" + std::to_string(seq));
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string a0 = "checkpoint_file_test", a1 = "--gtest_filter=CheckpointCrashChild.*",
              a2 = "--gtest_also_run_disabled_tests";
  char* argv[] = {a0.data(), a1.data(), a2.data(), nullptr};
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    ::execve("/proc/self/exe", argv, envp.data());
    ::_exit(127);
  }
  return pid;
}

TEST_F(CheckpointFileTest, SigkillDuringWriteLeavesOldOrNewNeverGarbage) {
  uint64_t current = 1;
  ASSERT_TRUE(WriteCheckpoint(dir_, MakeImage(current, BigSpecs()), 2).ok());
  // How long a whole child run takes, to kill within it.
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = SpawnWriter(dir_, ++current);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const auto run_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  std::mt19937_64 rng(12345);
  int saw_old = 0, saw_new = 0;
  for (int iter = 0; iter < 20; ++iter) {
    const uint64_t next = current + 1;
    pid = SpawnWriter(dir_, next);
    const auto delay = std::uniform_int_distribution<int64_t>(0, run_us * 11 / 10)(rng);
    std::this_thread::sleep_for(std::chrono::microseconds(delay));
    ::kill(pid, SIGKILL);
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);

    std::vector<std::string> skipped;
    Result<CheckpointImage> loaded = LoadNewestValid(dir_, &skipped);
    ASSERT_TRUE(loaded.ok()) << "iteration " << iter << ": " << loaded.status().ToString();
    EXPECT_TRUE(skipped.empty()) << skipped.front();
    ASSERT_TRUE(loaded->sequence == current || loaded->sequence == next)
        << "iteration " << iter << ": sequence " << loaded->sequence;
    ExpectIsBigImage(*loaded, loaded->sequence);
    (loaded->sequence == next ? saw_new : saw_old)++;
    current = loaded->sequence;
    // No listed file is partial: every one verifies completely.
    for (const CheckpointInfo& info : ListCheckpoints(dir_)) {
      EXPECT_EQ(info.problem, "") << "iteration " << iter;
      Result<CheckpointImage> r = ReadCheckpoint(info.path);
      EXPECT_TRUE(r.ok()) << "iteration " << iter << ": " << r.status().ToString();
    }
  }
  std::printf("crash test: %d kills left the old image, %d the new one (child run %.0f ms)\n",
              saw_old, saw_new, run_us / 1000.0);
  // The next write clears any stray temp file.
  ASSERT_TRUE(WriteCheckpoint(dir_, MakeImage(current + 1, BigSpecs()), 2).ok());
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().extension(), ".rhc") << e.path();
  }
}

}  // namespace
}  // namespace rackhub::server
