// The checkpoint file format (version 1) as pure functions on bytes: the
// header, the manifest, where each chunk record goes, record headers and
// their checksums (xxHash XXH3_64bits), and every consistency check on them.
// No file descriptors, no file system: checkpoint_file.cc does the I/O
// (temp file, fdatasync, rename, directory fsync, parallel pwritev/preadv)
// and calls these to build and to verify what it writes and reads. Internal
// to rackhub_server_core; everything else uses checkpoint_file.h.
//
// Ownership: plain values. Functions borrow their arguments for the call;
// out-parameters and pointed-to buffers belong to the caller.
//
// Threading: any thread; no shared state. The per-record functions
// (PayloadHash, EncodeRecordHeader, CheckRecordHeader, PayloadMatches) run
// concurrently from TBB tasks on different records.
//
// Errors: the Check*/Decode* functions return OK when all is well, else a
// Status saying what is wrong, whose message the caller puts after
// "<path>: " (Status::WithContext): FAILED_PRECONDITION for bytes read from a
// file (a damaged file), INVALID_ARGUMENT for keys or an image given to be
// written (CheckKeys, CheckImage).
//
// File layout (format version 1, little-endian, documented in
// docs/durability.md "Checkpoint file format"):
//
//   offset 0, 64 bytes: header (Header, EncodeHeader / DecodeHeader)
//     0  char[8] magic "RHCKPT\0\0"
//     8  u32     format version (1)
//     12 u32     header bytes (64)
//     16 u64     manifest bytes (M)
//     24 u64     XXH3_64bits of the manifest
//     32 u64     file bytes (the exact size of the complete file)
//     40 u64     data offset (first chunk record; 64-aligned, >= 64 + M)
//     48 u64     chunk record count
//     56 u64     XXH3_64bits of header bytes 0..55
//   offset 64, M bytes: manifest (EncodeManifest / DecodeManifest)
//     str tenant, u64 sequence, i64 created_unix_ms, u32 key count, then per
//     key: u32 id, str name, u64 elements, u32 chunk_count,
//     u32 chunk_elements, u64 version, str optimizer, u32 state slots;
//     str = u32 length + bytes.
//   from data offset: one record per chunk, sorted by (key id, chunk), each at
//   a 64-aligned offset that follows from the manifest alone (PlanRecords):
//     0  char[8] magic "RHCHUNK\0"
//     8  u32 key id, 12 u32 chunk index, 16 u32 elements, 20 u32 state slots
//     24 u64 payload bytes = elements * 4 * (1 + slots)
//     32 u64 XXH3_64bits of the payload
//     40 u64 key version
//     48 u64 reserved (0)
//     56 u64 XXH3_64bits of record bytes 0..55
//     64 payload: params[elements], state[0][elements], state[1][elements]
//        (fp32 bit patterns as in memory), zero padding to a 64-byte multiple
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint_file.h"
#include "rackhub/common/status.h"

namespace rackhub::server::checkpoint_layout {

static_assert(std::endian::native == std::endian::little,
              "checkpoint files store little-endian values as in memory");

inline constexpr uint64_t kHeaderBytes = 64;
inline constexpr uint64_t kRecordHeaderBytes = 64;
inline constexpr uint64_t kAlign = 64;  // records and payloads start at multiples
inline constexpr uint64_t kMaxManifestBytes = 1ull << 30;  // sanity bound before allocating
inline constexpr uint32_t kMaxStateSlots = 2;

inline uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// "key '<name>'", as error messages name a key.
std::string KeyLabel(const CheckpointKey& k);

// ---------------------------------------------------------------------------
// Header.

// The header's variable fields (magic, format version, header size and the
// header checksum are implied).
struct Header {
  uint64_t manifest_bytes = 0;
  uint64_t manifest_hash = 0;  // XXH3_64bits of the manifest
  uint64_t file_bytes = 0;     // exact size of the complete file
  uint64_t data_offset = 0;    // first chunk record
  uint64_t record_count = 0;
};

// Writes the kHeaderBytes bytes of the header to out[0..63].
void EncodeHeader(const Header& header, std::byte* out);

// Decodes and checks in[0..63] (kHeaderBytes bytes): magic, format version,
// header checksum, then the fields' consistency (header size, manifest size
// bound, data offset alignment and range).
Status DecodeHeader(const std::byte* in, Header* header);

// A file of `size` bytes against the header it must hold: CheckSizeForHeader
// before the header is read (empty, shorter than the header),
// CheckSizeAgainstHeader after (truncated, or bytes beyond file_bytes).
Status CheckSizeForHeader(uint64_t size);
Status CheckSizeAgainstHeader(uint64_t size, const Header& header);

// ---------------------------------------------------------------------------
// Manifest: u32/u64/i64 little-endian, str = u32 length + bytes.

std::string EncodeManifest(const CheckpointImage& image);

// Fills everything but `chunks` of *image.
Status DecodeManifest(std::string_view bytes, CheckpointImage* image);

// ---------------------------------------------------------------------------
// Records: where each chunk goes, computed from the keys alone (the writer and
// the reader compute the same plan).

struct Record {
  uint64_t offset = 0;  // of the record header
  uint32_t key_index = 0;
  uint32_t chunk = 0;
  uint32_t elements = 0;
  uint32_t slots = 0;
  uint64_t payload = 0;  // elements * 4 * (1 + slots)
  uint64_t padding() const { return AlignUp(payload) - payload; }
  uint64_t bytes() const { return kRecordHeaderBytes + AlignUp(payload); }
};

// The keys' consistency: ids strictly increasing, at most kMaxStateSlots
// slots, chunk_count == ceil(elements / chunk_elements).
Status CheckKeys(const std::vector<CheckpointKey>& keys);

// An image is writable: CheckKeys, and image.chunks holds every chunk of
// every key exactly once, in order, each of the right size and slot count.
Status CheckImage(const CheckpointImage& image);

// REQUIRES: CheckKeys(keys) is OK.
std::vector<Record> PlanRecords(const std::vector<CheckpointKey>& keys, uint64_t data_offset);

// The end of the last record (data_offset if there is none): the file's size.
uint64_t RecordsEnd(const std::vector<Record>& plan, uint64_t data_offset);

// Everything of a file to write except the chunk payloads.
struct FilePlan {
  std::string manifest;
  Header header;
  std::vector<Record> records;  // records[i] holds image.chunks[i]
};

// REQUIRES: CheckImage(image) is OK.
FilePlan PlanFile(const CheckpointImage& image);

// Checks a manifest read at kHeaderBytes against its header (checksum), then
// decodes it into *image (without chunks), checks the keys (CheckKeys) and
// plans the records, which must be header.record_count records ending at
// header.file_bytes.
Status DecodeAndPlan(std::string_view manifest, const Header& header, CheckpointImage* image,
                     std::vector<Record>* plan);

// XXH3_64bits of a chunk's payload: params, then each state slot.
uint64_t PayloadHash(const CheckpointChunk& c);

// Writes the kRecordHeaderBytes bytes of record r's header (key k) to h.
void EncodeRecordHeader(const Record& r, const CheckpointKey& k, uint64_t payload_hash,
                        std::byte* h);

// Checks a record header read from the file against the plan: magic, header
// checksum, then identity (key id, chunk, elements, slots, payload bytes,
// version). The payload checksum is PayloadMatches'.
Status CheckRecordHeader(const std::byte* h, const Record& r, const CheckpointKey& k);

// Whether the payload checksum in record header h matches chunk c as read.
bool PayloadMatches(const std::byte* h, const CheckpointChunk& c);

}  // namespace rackhub::server::checkpoint_layout
