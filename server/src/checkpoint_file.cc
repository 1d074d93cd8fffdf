#include "checkpoint_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>

#include <tbb/parallel_for.h>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

namespace rackhub::server {
namespace {

static_assert(std::endian::native == std::endian::little,
              "checkpoint files store little-endian values as in memory");

constexpr char kMagic[8] = {'R', 'H', 'C', 'K', 'P', 'T', 0, 0};
constexpr char kRecordMagic[8] = {'R', 'H', 'C', 'H', 'U', 'N', 'K', 0};
constexpr uint64_t kHeaderBytes = 64;
constexpr uint64_t kRecordHeaderBytes = 64;
constexpr uint64_t kAlign = 64;
constexpr uint64_t kMaxManifestBytes = 1ull << 30;  // sanity bound before allocating
constexpr uint32_t kMaxStateSlots = 2;
// Records are written and read in batches of consecutive records of about
// this many bytes: one pwritev/preadv each, one TBB task each.
constexpr uint64_t kBatchBytes = 4ull << 20;
constexpr size_t kMaxIovPerBatch = 1000;  // < IOV_MAX (1024)
constexpr char kPrefix[] = "ckpt-";
constexpr char kSuffix[] = ".rhc";
constexpr char kTmpSuffix[] = ".rhc.tmp";
constexpr size_t kSeqDigits = 20;

uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

void Put32(std::byte* p, uint32_t v) { std::memcpy(p, &v, 4); }
void Put64(std::byte* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t Get32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t Get64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// ---------------------------------------------------------------------------
// Manifest encoding: u32/u64/i64 little-endian, str = u32 length + bytes.

class ManifestWriter {
 public:
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void Str(const std::string& s) {
    U32(static_cast<uint32_t>(s.size()));
    Raw(s.data(), s.size());
  }
  std::string& bytes() { return out_; }

 private:
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

class ManifestReader {
 public:
  explicit ManifestReader(std::string_view in) : in_(in) {}
  bool U32(uint32_t* v) { return Raw(v, 4); }
  bool U64(uint64_t* v) { return Raw(v, 8); }
  bool Str(std::string* s) {
    uint32_t n = 0;
    if (!U32(&n) || n > in_.size() - pos_) return false;
    s->assign(in_.substr(pos_, n));
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  bool Raw(void* p, size_t n) {
    if (in_.size() - pos_ < n) return false;
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  std::string_view in_;
  size_t pos_ = 0;
};

std::string EncodeManifest(const CheckpointImage& image) {
  ManifestWriter w;
  w.Str(image.tenant);
  w.U64(image.sequence);
  w.U64(static_cast<uint64_t>(image.created_unix_ms));
  w.U32(static_cast<uint32_t>(image.keys.size()));
  for (const CheckpointKey& k : image.keys) {
    w.U32(k.id);
    w.Str(k.name);
    w.U64(k.elements);
    w.U32(k.chunk_count);
    w.U32(k.chunk_elements);
    w.U64(k.version);
    w.Str(k.optimizer);
    w.U32(k.state_slots);
  }
  return std::move(w.bytes());
}

// Fills everything but `chunks`. "" on success, else what is wrong.
std::string DecodeManifest(std::string_view bytes, CheckpointImage* image) {
  ManifestReader r(bytes);
  uint64_t created = 0;
  uint32_t key_count = 0;
  if (!r.Str(&image->tenant) || !r.U64(&image->sequence) || !r.U64(&created) ||
      !r.U32(&key_count)) {
    return "manifest: ends inside its preamble";
  }
  image->created_unix_ms = static_cast<int64_t>(created);
  if (key_count > bytes.size() / 40) return "manifest: key count " + std::to_string(key_count) +
                                            " does not fit in " + std::to_string(bytes.size()) +
                                            " bytes";
  image->keys.resize(key_count);
  for (uint32_t i = 0; i < key_count; ++i) {
    CheckpointKey& k = image->keys[i];
    if (!r.U32(&k.id) || !r.Str(&k.name) || !r.U64(&k.elements) || !r.U32(&k.chunk_count) ||
        !r.U32(&k.chunk_elements) || !r.U64(&k.version) || !r.Str(&k.optimizer) ||
        !r.U32(&k.state_slots)) {
      return "manifest: ends inside key " + std::to_string(i) + " of " + std::to_string(key_count);
    }
  }
  if (!r.done()) return "manifest: trailing bytes after the last key";
  return "";
}

// ---------------------------------------------------------------------------
// Layout: where each chunk record goes, computed from the keys alone (the
// writer and the reader compute the same plan).

struct Record {
  uint64_t offset = 0;   // of the record header
  uint32_t key_index = 0;
  uint32_t chunk = 0;
  uint32_t elements = 0;
  uint32_t slots = 0;
  uint64_t payload = 0;  // elements * 4 * (1 + slots)
  uint64_t bytes() const { return kRecordHeaderBytes + AlignUp(payload); }
};

std::string KeyLabel(const CheckpointKey& k) { return "key '" + k.name + "'"; }

// "" if the keys are consistent, else what is wrong.
std::string CheckKeys(const std::vector<CheckpointKey>& keys) {
  for (size_t i = 0; i < keys.size(); ++i) {
    const CheckpointKey& k = keys[i];
    if (i > 0 && keys[i - 1].id >= k.id) {
      return KeyLabel(k) + ": key ids are not strictly increasing (" +
             std::to_string(keys[i - 1].id) + " then " + std::to_string(k.id) + ")";
    }
    if (k.state_slots > kMaxStateSlots) {
      return KeyLabel(k) + ": " + std::to_string(k.state_slots) + " state slots, at most 2";
    }
    if (k.elements > 0 && k.chunk_elements == 0) return KeyLabel(k) + ": chunk_elements is 0";
    const uint64_t want =
        k.elements == 0 ? 0 : (k.elements + k.chunk_elements - 1) / k.chunk_elements;
    if (want != k.chunk_count) {
      return KeyLabel(k) + ": chunk_count " + std::to_string(k.chunk_count) + ", but " +
             std::to_string(k.elements) + " elements in chunks of " +
             std::to_string(k.chunk_elements) + " make " + std::to_string(want);
    }
  }
  return "";
}

// REQUIRES: CheckKeys(keys) == "".
std::vector<Record> PlanRecords(const std::vector<CheckpointKey>& keys, uint64_t data_offset) {
  std::vector<Record> plan;
  uint64_t offset = data_offset;
  for (uint32_t ki = 0; ki < keys.size(); ++ki) {
    const CheckpointKey& k = keys[ki];
    for (uint32_t c = 0; c < k.chunk_count; ++c) {
      Record r;
      r.offset = offset;
      r.key_index = ki;
      r.chunk = c;
      r.elements = static_cast<uint32_t>(
          std::min<uint64_t>(k.chunk_elements, k.elements - uint64_t{c} * k.chunk_elements));
      r.slots = k.state_slots;
      r.payload = uint64_t{r.elements} * 4 * (1 + r.slots);
      offset += r.bytes();
      plan.push_back(r);
    }
  }
  return plan;
}

// Consecutive record ranges [first, last) of about kBatchBytes each.
std::vector<std::pair<size_t, size_t>> Batches(const std::vector<Record>& plan) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t first = 0;
  uint64_t bytes = 0;
  size_t iovs = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const size_t rec_iovs = 3 + plan[i].slots;  // header, params, slots, padding
    if (i > first && (bytes + plan[i].bytes() > kBatchBytes || iovs + rec_iovs > kMaxIovPerBatch)) {
      out.emplace_back(first, i);
      first = i;
      bytes = 0;
      iovs = 0;
    }
    bytes += plan[i].bytes();
    iovs += rec_iovs;
  }
  if (first < plan.size()) out.emplace_back(first, plan.size());
  return out;
}

uint64_t PayloadHash(const CheckpointChunk& c) {
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, c.params.data(), c.params.size() * sizeof(float));
  for (const auto& s : c.state) XXH3_64bits_update(&st, s.data(), s.size() * sizeof(float));
  return XXH3_64bits_digest(&st);
}

void EncodeRecordHeader(const Record& r, const CheckpointKey& k, uint64_t payload_hash,
                        std::byte* h) {
  std::memset(h, 0, kRecordHeaderBytes);
  std::memcpy(h, kRecordMagic, 8);
  Put32(h + 8, k.id);
  Put32(h + 12, r.chunk);
  Put32(h + 16, r.elements);
  Put32(h + 20, r.slots);
  Put64(h + 24, r.payload);
  Put64(h + 32, payload_hash);
  Put64(h + 40, k.version);
  Put64(h + 56, XXH3_64bits(h, 56));
}

// Collects the first failure of a parallel loop, by lowest record index, so
// the message does not depend on scheduling.
class FirstError {
 public:
  void Set(size_t index, Status status) {
    std::lock_guard lock(mu_);
    if (index < index_) {
      index_ = index;
      status_ = std::move(status);
    }
    failed_.store(true, std::memory_order_relaxed);
  }
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  // REQUIRES: failed(), and the loop has finished.
  const Status& status() const { return status_; }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mu_;
  size_t index_ = SIZE_MAX;   // GUARDED_BY(mu_)
  Status status_;             // GUARDED_BY(mu_)
};

// pwritev/preadv of all of `iov`, continuing after short transfers. Returns
// the bytes transferred (less than asked only for a read at end of file) or
// -1 with errno set.
template <bool kWrite>
int64_t TransferAll(int fd, std::vector<iovec>& iov, uint64_t offset) {
  int64_t done = 0;
  size_t first = 0;
  while (first < iov.size()) {
    const ssize_t n = kWrite ? ::pwritev(fd, &iov[first], static_cast<int>(iov.size() - first),
                                         static_cast<off_t>(offset))
                             : ::preadv(fd, &iov[first], static_cast<int>(iov.size() - first),
                                        static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (n == 0) return done;  // end of file (reads only)
    done += n;
    offset += static_cast<uint64_t>(n);
    size_t left = static_cast<size_t>(n);
    while (first < iov.size() && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (left > 0) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return done;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now, reporting the error close(2) may carry.
  int Close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

Status SyncDir(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return Internal(Errno(dir + ": open directory"));
  if (::fsync(fd.get()) != 0) return Internal(Errno(dir + ": fsync directory"));
  return Status::Ok();
}

// mkdir -p with mode 0700 for what it creates; the parent of each created
// directory is fsync'ed so the new entry is durable.
Status MakeDirs(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    return S_ISDIR(st.st_mode) ? Status::Ok() : FailedPrecondition(dir + ": not a directory");
  }
  const size_t slash = dir.find_last_of('/', dir.size() > 1 ? dir.size() - 2 : 0);
  const std::string parent =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : dir.substr(0, slash));
  if (slash != std::string::npos || parent != ".") {
    if (Status s = MakeDirs(parent); !s.ok()) return s;
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return Internal(Errno(dir + ": mkdir"));
  return SyncDir(parent);
}

// Parses "ckpt-<20 digits><suffix>".
bool ParseName(std::string_view name, std::string_view suffix, uint64_t* sequence) {
  const size_t prefix = sizeof(kPrefix) - 1;
  if (name.size() != prefix + kSeqDigits + suffix.size()) return false;
  if (name.substr(0, prefix) != kPrefix || name.substr(prefix + kSeqDigits) != suffix) return false;
  uint64_t v = 0;
  for (size_t i = prefix; i < prefix + kSeqDigits; ++i) {
    const char c = name[i];
    if (c < '0' || c > '9') return false;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - digit) / 10) return false;
    v = v * 10 + digit;
  }
  *sequence = v;
  return true;
}

// Checkpoint sequences (suffix ".rhc") or temp sequences (".rhc.tmp") in dir.
std::vector<uint64_t> ScanDir(const std::string& dir, std::string_view suffix) {
  std::vector<uint64_t> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    uint64_t seq = 0;
    if (ParseName(e->d_name, suffix, &seq)) out.push_back(seq);
  }
  ::closedir(d);
  std::sort(out.rbegin(), out.rend());
  return out;
}

std::string PathOf(const std::string& dir, uint64_t sequence) {
  return dir + "/" + CheckpointFileName(sequence);
}

// ---------------------------------------------------------------------------
// Reading the header and manifest (shared by ReadCheckpoint and ListCheckpoints).

struct Opened {
  std::unique_ptr<Fd> fd;
  uint64_t file_bytes = 0;
  uint64_t data_offset = 0;
  uint64_t record_count = 0;
  CheckpointImage image;  // without chunks
  std::vector<Record> plan;
};

Status Damaged(const std::string& path, const std::string& what) {
  return FailedPrecondition(path + ": " + what);
}

Result<Opened> OpenAndReadManifest(const std::string& path) {
  Opened o;
  o.fd = std::make_unique<Fd>(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (o.fd->get() < 0) {
    if (errno == ENOENT) return NotFound(path + ": no such file");
    return Internal(Errno(path + ": open"));
  }
  struct stat st;
  if (::fstat(o.fd->get(), &st) != 0) return Internal(Errno(path + ": fstat"));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0) return Damaged(path, "empty file (0 bytes)");
  if (size < kHeaderBytes) {
    return Damaged(path, "truncated at byte " + std::to_string(size) + " of the " +
                             std::to_string(kHeaderBytes) + "-byte header");
  }
  std::byte h[kHeaderBytes];
  if (::pread(o.fd->get(), h, kHeaderBytes, 0) != static_cast<ssize_t>(kHeaderBytes)) {
    return Internal(Errno(path + ": read header"));
  }
  if (std::memcmp(h, kMagic, 8) != 0) return Damaged(path, "not a checkpoint file (bad magic)");
  const uint32_t version = Get32(h + 8);
  if (version != kCheckpointFormatVersion) {
    return Damaged(path, "format version " + std::to_string(version) + ", this rackhubd reads " +
                             std::to_string(kCheckpointFormatVersion));
  }
  if (Get64(h + 56) != XXH3_64bits(h, 56)) return Damaged(path, "header checksum mismatch");
  const uint64_t manifest_bytes = Get64(h + 16);
  const uint64_t manifest_hash = Get64(h + 24);
  o.file_bytes = Get64(h + 32);
  o.data_offset = Get64(h + 40);
  o.record_count = Get64(h + 48);
  if (Get32(h + 12) != kHeaderBytes || manifest_bytes > kMaxManifestBytes ||
      o.data_offset % kAlign != 0 || o.data_offset < kHeaderBytes + manifest_bytes ||
      o.data_offset > o.file_bytes) {
    return Damaged(path, "inconsistent header (manifest " + std::to_string(manifest_bytes) +
                             " bytes, data at " + std::to_string(o.data_offset) + ", file " +
                             std::to_string(o.file_bytes) + " bytes)");
  }
  if (size < o.file_bytes) {
    return Damaged(path, "truncated at byte " + std::to_string(size) + " of " +
                             std::to_string(o.file_bytes));
  }
  if (size > o.file_bytes) {
    return Damaged(path, std::to_string(size - o.file_bytes) + " unexpected bytes after byte " +
                             std::to_string(o.file_bytes));
  }
  std::string manifest(manifest_bytes, '\0');
  if (::pread(o.fd->get(), manifest.data(), manifest_bytes, kHeaderBytes) !=
      static_cast<ssize_t>(manifest_bytes)) {
    return Internal(Errno(path + ": read manifest"));
  }
  if (XXH3_64bits(manifest.data(), manifest.size()) != manifest_hash) {
    return Damaged(path, "manifest checksum mismatch");
  }
  if (std::string e = DecodeManifest(manifest, &o.image); !e.empty()) return Damaged(path, e);
  if (std::string e = CheckKeys(o.image.keys); !e.empty()) return Damaged(path, "manifest: " + e);
  o.plan = PlanRecords(o.image.keys, o.data_offset);
  const uint64_t end = o.plan.empty() ? o.data_offset : o.plan.back().offset + o.plan.back().bytes();
  if (o.plan.size() != o.record_count || end != o.file_bytes) {
    return Damaged(path, "manifest describes " + std::to_string(o.plan.size()) +
                             " chunks ending at byte " + std::to_string(end) + ", header says " +
                             std::to_string(o.record_count) + " ending at byte " +
                             std::to_string(o.file_bytes));
  }
  return o;
}

// "" if the image is writable, else what is wrong with it.
std::string CheckImage(const CheckpointImage& image) {
  if (std::string e = CheckKeys(image.keys); !e.empty()) return e;
  size_t pos = 0;
  for (const CheckpointKey& k : image.keys) {
    for (uint32_t c = 0; c < k.chunk_count; ++c, ++pos) {
      const std::string where =
          "chunk " + std::to_string(c) + " of " + KeyLabel(k) + ": ";
      if (pos >= image.chunks.size()) return where + "missing (chunks end early)";
      const CheckpointChunk& ch = image.chunks[pos];
      if (ch.key_id != k.id || ch.chunk != c) {
        return where + "expected at position " + std::to_string(pos) + ", found key " +
               std::to_string(ch.key_id) + " chunk " + std::to_string(ch.chunk);
      }
      const uint64_t n =
          std::min<uint64_t>(k.chunk_elements, k.elements - uint64_t{c} * k.chunk_elements);
      if (ch.params.size() != n) {
        return where + std::to_string(ch.params.size()) + " params, expected " + std::to_string(n);
      }
      if (ch.state.size() != k.state_slots) {
        return where + std::to_string(ch.state.size()) + " state slots, the key has " +
               std::to_string(k.state_slots);
      }
      for (const auto& s : ch.state) {
        if (s.size() != n) {
          return where + "a state slot of " + std::to_string(s.size()) + " elements, expected " +
                 std::to_string(n);
        }
      }
    }
  }
  if (pos != image.chunks.size()) {
    return std::to_string(image.chunks.size() - pos) + " chunks beyond those of the keys";
  }
  return "";
}

}  // namespace

std::string CheckpointFileName(uint64_t sequence) {
  std::string digits = std::to_string(sequence);
  return kPrefix + std::string(kSeqDigits - digits.size(), '0') + digits + kSuffix;
}

Result<CheckpointInfo> WriteCheckpoint(const std::string& tenant_dir, const CheckpointImage& image,
                                       uint32_t keep) {
  const std::string final_path = PathOf(tenant_dir, image.sequence);
  if (keep == 0) return InvalidArgument(final_path + ": keep must be at least 1");
  if (std::string e = CheckImage(image); !e.empty()) return InvalidArgument(final_path + ": " + e);
  if (Status s = MakeDirs(tenant_dir); !s.ok()) return s;
  for (uint64_t seq : ScanDir(tenant_dir, kTmpSuffix)) {
    ::unlink((tenant_dir + "/" + CheckpointFileName(seq) + ".tmp").c_str());  // stray, from a crash
  }

  const std::string manifest = EncodeManifest(image);
  const uint64_t data_offset = AlignUp(kHeaderBytes + manifest.size());
  const std::vector<Record> plan = PlanRecords(image.keys, data_offset);
  const uint64_t file_bytes =
      plan.empty() ? data_offset : plan.back().offset + plan.back().bytes();

  const std::string tmp_path = final_path + ".tmp";
  Fd fd(::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (fd.get() < 0) return Internal(Errno(tmp_path + ": create"));
  auto fail = [&](const std::string& message) -> Status {
    ::unlink(tmp_path.c_str());
    return Internal(message);
  };
  // No fallocate: on ext4 its unwritten extents made writes ~1.5x slower
  // (bench/results/checkpoint-2026-11-23.md); delayed allocation does better.
  static const std::byte kZeros[kAlign] = {};
  const auto batches = Batches(plan);
  FirstError error;
  tbb::parallel_for(size_t{0}, batches.size(), [&](size_t b) {
    if (error.failed()) return;
    const auto [first, last] = batches[b];
    std::vector<std::byte> headers((last - first) * kRecordHeaderBytes);
    std::vector<iovec> iov;
    iov.reserve((last - first) * (3 + kMaxStateSlots));
    for (size_t i = first; i < last; ++i) {
      const Record& r = plan[i];
      const CheckpointChunk& c = image.chunks[i];
      std::byte* h = &headers[(i - first) * kRecordHeaderBytes];
      EncodeRecordHeader(r, image.keys[r.key_index], PayloadHash(c), h);
      iov.push_back({h, kRecordHeaderBytes});
      iov.push_back({const_cast<float*>(c.params.data()), c.params.size() * sizeof(float)});
      for (const auto& s : c.state) {
        iov.push_back({const_cast<float*>(s.data()), s.size() * sizeof(float)});
      }
      if (const uint64_t pad = AlignUp(r.payload) - r.payload; pad > 0) {
        iov.push_back({const_cast<std::byte*>(kZeros), pad});
      }
    }
    if (TransferAll<true>(fd.get(), iov, plan[first].offset) < 0) {
      error.Set(first,
                Internal(Errno(tmp_path + ": write at byte " + std::to_string(plan[first].offset))));
    }
  });
  if (error.failed()) return fail(error.status().message());

  std::vector<std::byte> head(data_offset, std::byte{0});
  std::memcpy(head.data(), kMagic, 8);
  Put32(&head[8], kCheckpointFormatVersion);
  Put32(&head[12], kHeaderBytes);
  Put64(&head[16], manifest.size());
  Put64(&head[24], XXH3_64bits(manifest.data(), manifest.size()));
  Put64(&head[32], file_bytes);
  Put64(&head[40], data_offset);
  Put64(&head[48], plan.size());
  Put64(&head[56], XXH3_64bits(head.data(), 56));
  std::memcpy(&head[kHeaderBytes], manifest.data(), manifest.size());
  std::vector<iovec> head_iov{{head.data(), head.size()}};
  if (TransferAll<true>(fd.get(), head_iov, 0) < 0) return fail(Errno(tmp_path + ": write header"));
  if (::fdatasync(fd.get()) != 0) return fail(Errno(tmp_path + ": fdatasync"));
  if (fd.Close() != 0) return fail(Errno(tmp_path + ": close"));
  if (::rename(tmp_path.c_str(), final_path.c_str()) != 0) {
    return fail(Errno(tmp_path + ": rename to " + final_path));
  }
  if (Status s = SyncDir(tenant_dir); !s.ok()) return s;

  // The new file is durable: retire the oldest beyond `keep` (never the new one).
  const std::vector<uint64_t> existing = ScanDir(tenant_dir, kSuffix);
  for (size_t i = keep; i < existing.size(); ++i) {
    if (existing[i] != image.sequence) ::unlink(PathOf(tenant_dir, existing[i]).c_str());
  }

  CheckpointInfo info;
  info.path = final_path;
  info.sequence = image.sequence;
  info.created_unix_ms = image.created_unix_ms;
  info.bytes = file_bytes;
  for (const CheckpointKey& k : image.keys) info.key_versions.emplace_back(k.name, k.version);
  return info;
}

Result<CheckpointImage> ReadCheckpoint(const std::string& path) {
  Result<Opened> opened = OpenAndReadManifest(path);
  if (!opened.ok()) return opened.status();
  Opened& o = *opened;
  CheckpointImage& image = o.image;
  const std::vector<Record>& plan = o.plan;
  image.chunks.resize(plan.size());
  const int fd = o.fd->get();
  const auto batches = Batches(plan);
  FirstError error;
  tbb::parallel_for(size_t{0}, batches.size(), [&](size_t b) {
    if (error.failed()) return;
    const auto [first, last] = batches[b];
    std::vector<std::byte> headers((last - first) * kRecordHeaderBytes);
    std::byte pad_sink[kAlign];
    std::vector<iovec> iov;
    iov.reserve((last - first) * (3 + kMaxStateSlots));
    uint64_t want = 0;
    for (size_t i = first; i < last; ++i) {
      const Record& r = plan[i];
      CheckpointChunk& c = image.chunks[i];
      c.key_id = image.keys[r.key_index].id;
      c.chunk = r.chunk;
      c.params.resize(r.elements);
      c.state.resize(r.slots);
      iov.push_back({&headers[(i - first) * kRecordHeaderBytes], kRecordHeaderBytes});
      iov.push_back({c.params.data(), r.elements * sizeof(float)});
      for (auto& s : c.state) {
        s.resize(r.elements);
        iov.push_back({s.data(), r.elements * sizeof(float)});
      }
      if (const uint64_t pad = AlignUp(r.payload) - r.payload; pad > 0) {
        iov.push_back({pad_sink, pad});
      }
      want += r.bytes();
    }
    const int64_t got = TransferAll<false>(fd, iov, plan[first].offset);
    if (got < 0) {
      error.Set(first,
                Internal(Errno(path + ": read at byte " + std::to_string(plan[first].offset))));
      return;
    }
    if (static_cast<uint64_t>(got) < want) {  // the file shrank under us
      error.Set(first, Damaged(path, "truncated at byte " +
                                         std::to_string(plan[first].offset + got) + " of " +
                                         std::to_string(o.file_bytes)));
      return;
    }
    for (size_t i = first; i < last; ++i) {
      const Record& r = plan[i];
      const CheckpointKey& k = image.keys[r.key_index];
      const std::byte* h = &headers[(i - first) * kRecordHeaderBytes];
      const std::string where = path + ": chunk " + std::to_string(r.chunk) + " of " +
                                KeyLabel(k) + " (record at byte " + std::to_string(r.offset) +
                                "): ";
      if (std::memcmp(h, kRecordMagic, 8) != 0) {
        error.Set(i, FailedPrecondition(where + "bad record magic"));
        return;
      }
      if (Get64(h + 56) != XXH3_64bits(h, 56)) {
        error.Set(i, FailedPrecondition(where + "record header checksum mismatch"));
        return;
      }
      if (Get32(h + 8) != k.id || Get32(h + 12) != r.chunk || Get32(h + 16) != r.elements ||
          Get32(h + 20) != r.slots || Get64(h + 24) != r.payload || Get64(h + 40) != k.version) {
        error.Set(i, FailedPrecondition(
                         where + "record holds key id " + std::to_string(Get32(h + 8)) +
                         " chunk " + std::to_string(Get32(h + 12)) + " (" +
                         std::to_string(Get32(h + 16)) + " elements, " +
                         std::to_string(Get32(h + 20)) + " slots, version " +
                         std::to_string(Get64(h + 40)) + "), not what the manifest says"));
        return;
      }
      if (Get64(h + 32) != PayloadHash(image.chunks[i])) {
        error.Set(i, Damaged(path, "chunk " + std::to_string(r.chunk) + " of " + KeyLabel(k) +
                                       ": checksum mismatch"));
        return;
      }
    }
  });
  if (error.failed()) return error.status();
  return std::move(image);
}

std::vector<CheckpointInfo> ListCheckpoints(const std::string& tenant_dir) {
  std::vector<CheckpointInfo> out;
  for (uint64_t seq : ScanDir(tenant_dir, kSuffix)) {
    CheckpointInfo info;
    info.path = PathOf(tenant_dir, seq);
    info.sequence = seq;
    struct stat st;
    if (::stat(info.path.c_str(), &st) != 0) continue;  // deleted meanwhile
    info.bytes = static_cast<uint64_t>(st.st_size);
    Result<Opened> o = OpenAndReadManifest(info.path);
    if (o.ok()) {
      info.created_unix_ms = o->image.created_unix_ms;
      for (const CheckpointKey& k : o->image.keys) info.key_versions.emplace_back(k.name, k.version);
      if (o->image.sequence != seq) {
        info.problem = info.path + ": manifest says sequence " + std::to_string(o->image.sequence);
      }
    } else {
      info.problem = o.status().message();
    }
    out.push_back(std::move(info));
  }
  return out;
}

Status DeleteCheckpoint(const std::string& tenant_dir, uint64_t sequence) {
  const std::string path = PathOf(tenant_dir, sequence);
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return NotFound(path + ": no such checkpoint");
    return Internal(Errno(path + ": unlink"));
  }
  return Status::Ok();
}

Status RemoveTenantCheckpoints(const std::string& tenant_dir) {
  for (std::string_view suffix : {std::string_view(kSuffix), std::string_view(kTmpSuffix)}) {
    for (uint64_t seq : ScanDir(tenant_dir, suffix)) {
      const std::string path =
          tenant_dir + "/" + CheckpointFileName(seq) + std::string(suffix.substr(4));
      if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Internal(Errno(path + ": unlink"));
    }
  }
  if (::rmdir(tenant_dir.c_str()) != 0 && errno != ENOENT && errno != ENOTEMPTY &&
      errno != EEXIST) {
    return Internal(Errno(tenant_dir + ": rmdir"));
  }
  return Status::Ok();
}

Result<CheckpointImage> LoadNewestValid(const std::string& tenant_dir,
                                        std::vector<std::string>* skipped) {
  const std::vector<uint64_t> seqs = ScanDir(tenant_dir, kSuffix);
  for (uint64_t seq : seqs) {
    const std::string path = PathOf(tenant_dir, seq);
    Result<CheckpointImage> image = ReadCheckpoint(path);
    if (image.ok() && image->sequence != seq) {
      image = FailedPrecondition(path + ": manifest says sequence " +
                                 std::to_string(image->sequence));
    }
    if (image.ok()) return image;
    if (skipped != nullptr) skipped->push_back(image.status().message());
  }
  return NotFound(tenant_dir + ": no valid checkpoint (" + std::to_string(seqs.size()) +
                  " checkpoint files, none verifies)");
}

}  // namespace rackhub::server
