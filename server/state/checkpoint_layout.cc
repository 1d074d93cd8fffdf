#include "checkpoint_layout.h"

#include <algorithm>
#include <cstring>
#include <utility>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

namespace rackhub::server::checkpoint_layout {
namespace {

constexpr char kMagic[8] = {'R', 'H', 'C', 'K', 'P', 'T', 0, 0};
constexpr char kRecordMagic[8] = {'R', 'H', 'C', 'H', 'U', 'N', 'K', 0};

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

}  // namespace

std::string KeyLabel(const CheckpointKey& k) { return "key '" + k.name + "'"; }

// ---------------------------------------------------------------------------
// Header.

void EncodeHeader(const Header& header, std::byte* out) {
  std::memset(out, 0, kHeaderBytes);
  std::memcpy(out, kMagic, 8);
  Put32(out + 8, kCheckpointFormatVersion);
  Put32(out + 12, kHeaderBytes);
  Put64(out + 16, header.manifest_bytes);
  Put64(out + 24, header.manifest_hash);
  Put64(out + 32, header.file_bytes);
  Put64(out + 40, header.data_offset);
  Put64(out + 48, header.record_count);
  Put64(out + 56, XXH3_64bits(out, 56));
}

Status DecodeHeader(const std::byte* in, Header* header) {
  if (std::memcmp(in, kMagic, 8) != 0)
    return FailedPrecondition("not a checkpoint file (bad magic)");
  const uint32_t version = Get32(in + 8);
  if (version != kCheckpointFormatVersion) {
    return FailedPrecondition("format version " + std::to_string(version) +
                              ", this rackhubd reads " + std::to_string(kCheckpointFormatVersion));
  }
  if (Get64(in + 56) != XXH3_64bits(in, 56)) return FailedPrecondition("header checksum mismatch");
  Header& h = *header;
  h.manifest_bytes = Get64(in + 16);
  h.manifest_hash = Get64(in + 24);
  h.file_bytes = Get64(in + 32);
  h.data_offset = Get64(in + 40);
  h.record_count = Get64(in + 48);
  if (Get32(in + 12) != kHeaderBytes || h.manifest_bytes > kMaxManifestBytes ||
      h.data_offset % kAlign != 0 || h.data_offset < kHeaderBytes + h.manifest_bytes ||
      h.data_offset > h.file_bytes) {
    return FailedPrecondition("inconsistent header (manifest " + std::to_string(h.manifest_bytes) +
                              " bytes, data at " + std::to_string(h.data_offset) + ", file " +
                              std::to_string(h.file_bytes) + " bytes)");
  }
  return Status::Ok();
}

Status CheckSizeForHeader(uint64_t size) {
  if (size == 0) return FailedPrecondition("empty file (0 bytes)");
  if (size < kHeaderBytes) {
    return FailedPrecondition("truncated at byte " + std::to_string(size) + " of the " +
                              std::to_string(kHeaderBytes) + "-byte header");
  }
  return Status::Ok();
}

Status CheckSizeAgainstHeader(uint64_t size, const Header& header) {
  if (size < header.file_bytes) {
    return FailedPrecondition("truncated at byte " + std::to_string(size) + " of " +
                              std::to_string(header.file_bytes));
  }
  if (size > header.file_bytes) {
    return FailedPrecondition(std::to_string(size - header.file_bytes) +
                              " unexpected bytes after byte " + std::to_string(header.file_bytes));
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Manifest.

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

Status DecodeManifest(std::string_view bytes, CheckpointImage* image) {
  ManifestReader r(bytes);
  uint64_t created = 0;
  uint32_t key_count = 0;
  if (!r.Str(&image->tenant) || !r.U64(&image->sequence) || !r.U64(&created) ||
      !r.U32(&key_count)) {
    return FailedPrecondition("manifest: ends inside its preamble");
  }
  image->created_unix_ms = static_cast<int64_t>(created);
  if (key_count > bytes.size() / 40) {
    return FailedPrecondition("manifest: key count " + std::to_string(key_count) +
                              " does not fit in " + std::to_string(bytes.size()) + " bytes");
  }
  image->keys.resize(key_count);
  for (uint32_t i = 0; i < key_count; ++i) {
    CheckpointKey& k = image->keys[i];
    if (!r.U32(&k.id) || !r.Str(&k.name) || !r.U64(&k.elements) || !r.U32(&k.chunk_count) ||
        !r.U32(&k.chunk_elements) || !r.U64(&k.version) || !r.Str(&k.optimizer) ||
        !r.U32(&k.state_slots)) {
      return FailedPrecondition("manifest: ends inside key " + std::to_string(i) + " of " +
                                std::to_string(key_count));
    }
  }
  if (!r.done()) return FailedPrecondition("manifest: trailing bytes after the last key");
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Records.

Status CheckKeys(const std::vector<CheckpointKey>& keys) {
  for (size_t i = 0; i < keys.size(); ++i) {
    const CheckpointKey& k = keys[i];
    if (i > 0 && keys[i - 1].id >= k.id) {
      return InvalidArgument(KeyLabel(k) + ": key ids are not strictly increasing (" +
                             std::to_string(keys[i - 1].id) + " then " + std::to_string(k.id) +
                             ")");
    }
    if (k.state_slots > kMaxStateSlots) {
      return InvalidArgument(KeyLabel(k) + ": " + std::to_string(k.state_slots) +
                             " state slots, at most 2");
    }
    if (k.elements > 0 && k.chunk_elements == 0)
      return InvalidArgument(KeyLabel(k) + ": chunk_elements is 0");
    const uint64_t want =
        k.elements == 0 ? 0 : (k.elements + k.chunk_elements - 1) / k.chunk_elements;
    if (want != k.chunk_count) {
      return InvalidArgument(KeyLabel(k) + ": chunk_count " + std::to_string(k.chunk_count) +
                             ", but " + std::to_string(k.elements) + " elements in chunks of " +
                             std::to_string(k.chunk_elements) + " make " + std::to_string(want));
    }
  }
  return Status::Ok();
}

Status CheckImage(const CheckpointImage& image) {
  if (Status s = CheckKeys(image.keys); !s.ok()) return s;
  size_t pos = 0;
  for (const CheckpointKey& k : image.keys) {
    for (uint32_t c = 0; c < k.chunk_count; ++c, ++pos) {
      const std::string where = "chunk " + std::to_string(c) + " of " + KeyLabel(k) + ": ";
      if (pos >= image.chunks.size()) return InvalidArgument(where + "missing (chunks end early)");
      const CheckpointChunk& ch = image.chunks[pos];
      if (ch.key_id != k.id || ch.chunk != c) {
        return InvalidArgument(where + "expected at position " + std::to_string(pos) +
                               ", found key " + std::to_string(ch.key_id) + " chunk " +
                               std::to_string(ch.chunk));
      }
      const uint64_t n =
          std::min<uint64_t>(k.chunk_elements, k.elements - uint64_t{c} * k.chunk_elements);
      if (ch.params.size() != n) {
        return InvalidArgument(where + std::to_string(ch.params.size()) + " params, expected " +
                               std::to_string(n));
      }
      if (ch.state.size() != k.state_slots) {
        return InvalidArgument(where + std::to_string(ch.state.size()) +
                               " state slots, the key has " + std::to_string(k.state_slots));
      }
      for (const auto& s : ch.state) {
        if (s.size() != n) {
          return InvalidArgument(where + "a state slot of " + std::to_string(s.size()) +
                                 " elements, expected " + std::to_string(n));
        }
      }
    }
  }
  if (pos != image.chunks.size()) {
    return InvalidArgument(std::to_string(image.chunks.size() - pos) +
                           " chunks beyond those of the keys");
  }
  return Status::Ok();
}

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

uint64_t RecordsEnd(const std::vector<Record>& plan, uint64_t data_offset) {
  return plan.empty() ? data_offset : plan.back().offset + plan.back().bytes();
}

FilePlan PlanFile(const CheckpointImage& image) {
  FilePlan f;
  f.manifest = EncodeManifest(image);
  f.header.manifest_bytes = f.manifest.size();
  f.header.manifest_hash = XXH3_64bits(f.manifest.data(), f.manifest.size());
  f.header.data_offset = AlignUp(kHeaderBytes + f.manifest.size());
  f.records = PlanRecords(image.keys, f.header.data_offset);
  f.header.file_bytes = RecordsEnd(f.records, f.header.data_offset);
  f.header.record_count = f.records.size();
  return f;
}

Status DecodeAndPlan(std::string_view manifest, const Header& header, CheckpointImage* image,
                     std::vector<Record>* plan) {
  if (XXH3_64bits(manifest.data(), manifest.size()) != header.manifest_hash) {
    return FailedPrecondition("manifest checksum mismatch");
  }
  if (Status s = DecodeManifest(manifest, image); !s.ok()) return s;
  // Keys read from a file: damaged, not an invalid argument.
  if (Status s = CheckKeys(image->keys); !s.ok()) {
    return FailedPrecondition("manifest: " + s.message());
  }
  // Bounded before planning: every record takes at least its header in the
  // file (whose size the caller checked against header.file_bytes), so a
  // manifest cannot make the plan larger than the file.
  uint64_t chunks = 0;
  for (const CheckpointKey& k : image->keys) chunks += k.chunk_count;
  const uint64_t room = header.file_bytes > header.data_offset
                            ? (header.file_bytes - header.data_offset) / kRecordHeaderBytes
                            : 0;
  if (chunks != header.record_count || chunks > room) {
    return FailedPrecondition("manifest describes " + std::to_string(chunks) +
                              " chunks, header says " + std::to_string(header.record_count) +
                              " in a file of " + std::to_string(header.file_bytes) + " bytes");
  }
  *plan = PlanRecords(image->keys, header.data_offset);
  const uint64_t end = RecordsEnd(*plan, header.data_offset);
  if (plan->size() != header.record_count || end != header.file_bytes) {
    return FailedPrecondition("manifest describes " + std::to_string(plan->size()) +
                              " chunks ending at byte " + std::to_string(end) + ", header says " +
                              std::to_string(header.record_count) + " ending at byte " +
                              std::to_string(header.file_bytes));
  }
  return Status::Ok();
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

Status CheckRecordHeader(const std::byte* h, const Record& r, const CheckpointKey& k) {
  if (std::memcmp(h, kRecordMagic, 8) != 0) return FailedPrecondition("bad record magic");
  if (Get64(h + 56) != XXH3_64bits(h, 56))
    return FailedPrecondition("record header checksum mismatch");
  if (Get32(h + 8) != k.id || Get32(h + 12) != r.chunk || Get32(h + 16) != r.elements ||
      Get32(h + 20) != r.slots || Get64(h + 24) != r.payload || Get64(h + 40) != k.version) {
    return FailedPrecondition("record holds key id " + std::to_string(Get32(h + 8)) + " chunk " +
                              std::to_string(Get32(h + 12)) + " (" + std::to_string(Get32(h + 16)) +
                              " elements, " + std::to_string(Get32(h + 20)) + " slots, version " +
                              std::to_string(Get64(h + 40)) + "), not what the manifest says");
  }
  return Status::Ok();
}

bool PayloadMatches(const std::byte* h, const CheckpointChunk& c) {
  return Get64(h + 32) == PayloadHash(c);
}

}  // namespace rackhub::server::checkpoint_layout
