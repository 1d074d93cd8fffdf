#include "checkpoint_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>

#include <tbb/parallel_for.h>

#include "checkpoint_layout.h"

// The I/O half of checkpoint files: what the bytes are (header, manifest,
// record plan, checksums) is checkpoint_layout.h; here they are written
// crash-safely and read back in parallel.

namespace rackhub::server {
namespace {

using checkpoint_layout::FilePlan;
using checkpoint_layout::Header;
using checkpoint_layout::kAlign;
using checkpoint_layout::kHeaderBytes;
using checkpoint_layout::kMaxStateSlots;
using checkpoint_layout::kRecordHeaderBytes;
using checkpoint_layout::Record;

// Records are written and read in batches of consecutive records of about
// this many bytes: one pwritev/preadv each, one TBB task each.
constexpr uint64_t kBatchBytes = 4ull << 20;
constexpr size_t kMaxIovPerBatch = 1000;  // < IOV_MAX (1024)
constexpr char kPrefix[] = "ckpt-";
constexpr char kSuffix[] = ".rhc";
constexpr char kTmpSuffix[] = ".rhc.tmp";
constexpr size_t kSeqDigits = 20;

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

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
  Header header;
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
  if (Status s = checkpoint_layout::CheckSizeForHeader(size); !s.ok()) {
    return s.WithContext(path);
  }
  std::byte h[kHeaderBytes];
  if (::pread(o.fd->get(), h, kHeaderBytes, 0) != static_cast<ssize_t>(kHeaderBytes)) {
    return Internal(Errno(path + ": read header"));
  }
  if (Status s = checkpoint_layout::DecodeHeader(h, &o.header); !s.ok()) {
    return s.WithContext(path);
  }
  if (Status s = checkpoint_layout::CheckSizeAgainstHeader(size, o.header); !s.ok()) {
    return s.WithContext(path);
  }
  std::string manifest(o.header.manifest_bytes, '\0');
  if (::pread(o.fd->get(), manifest.data(), manifest.size(), kHeaderBytes) !=
      static_cast<ssize_t>(manifest.size())) {
    return Internal(Errno(path + ": read manifest"));
  }
  if (Status s = checkpoint_layout::DecodeAndPlan(manifest, o.header, &o.image, &o.plan); !s.ok()) {
    return s.WithContext(path);
  }
  return o;
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
  if (Status s = checkpoint_layout::CheckImage(image); !s.ok()) return s.WithContext(final_path);
  if (Status s = MakeDirs(tenant_dir); !s.ok()) return s;
  for (uint64_t seq : ScanDir(tenant_dir, kTmpSuffix)) {
    ::unlink((tenant_dir + "/" + CheckpointFileName(seq) + ".tmp").c_str());  // stray, from a crash
  }

  const FilePlan file = checkpoint_layout::PlanFile(image);
  const std::vector<Record>& plan = file.records;

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
      checkpoint_layout::EncodeRecordHeader(r, image.keys[r.key_index],
                                            checkpoint_layout::PayloadHash(c), h);
      iov.push_back({h, kRecordHeaderBytes});
      iov.push_back({const_cast<float*>(c.params.data()), c.params.size() * sizeof(float)});
      for (const auto& s : c.state) {
        iov.push_back({const_cast<float*>(s.data()), s.size() * sizeof(float)});
      }
      if (const uint64_t pad = r.padding(); pad > 0) {
        iov.push_back({const_cast<std::byte*>(kZeros), pad});
      }
    }
    if (TransferAll<true>(fd.get(), iov, plan[first].offset) < 0) {
      error.Set(first,
                Internal(Errno(tmp_path + ": write at byte " + std::to_string(plan[first].offset))));
    }
  });
  if (error.failed()) return fail(error.status().message());

  // Header, manifest and zero padding up to the first record.
  std::vector<std::byte> head(file.header.data_offset, std::byte{0});
  checkpoint_layout::EncodeHeader(file.header, head.data());
  std::memcpy(&head[kHeaderBytes], file.manifest.data(), file.manifest.size());
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
  info.bytes = file.header.file_bytes;
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
      if (const uint64_t pad = r.padding(); pad > 0) {
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
                                         std::to_string(o.header.file_bytes)));
      return;
    }
    for (size_t i = first; i < last; ++i) {
      const Record& r = plan[i];
      const CheckpointKey& k = image.keys[r.key_index];
      const std::byte* h = &headers[(i - first) * kRecordHeaderBytes];
      if (Status s = checkpoint_layout::CheckRecordHeader(h, r, k); !s.ok()) {
        error.Set(i, s.WithContext(path + ": chunk " + std::to_string(r.chunk) + " of " +
                                   checkpoint_layout::KeyLabel(k) + " (record at byte " +
                                   std::to_string(r.offset) + ")"));
        return;
      }
      if (!checkpoint_layout::PayloadMatches(h, image.chunks[i])) {
        error.Set(i, Damaged(path, "chunk " + std::to_string(r.chunk) + " of " +
                                       checkpoint_layout::KeyLabel(k) + ": checksum mismatch"));
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

std::vector<uint64_t> CheckpointSequences(const std::string& tenant_dir) {
  std::vector<uint64_t> out = ScanDir(tenant_dir, kSuffix);
  std::sort(out.begin(), out.end());
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
