// Checkpoint files: one tenant's training state (every key's fp32 master
// parameters, optimizer state slots and version) written to and read back
// from `<tenant_dir>/ckpt-<sequence, 20 digits>.rhc`, crash-safely and fast.
//
// This module only stores and loads a CheckpointImage; taking a consistent
// snapshot from the lanes and restoring it into them is the caller's job.
//
// Ownership: plain values. WriteCheckpoint borrows the image for the duration
// of the call; ReadCheckpoint returns a new image the caller owns. Files and
// directories are owned by this module: nothing else should create or delete
// `ckpt-*.rhc` or `ckpt-*.rhc.tmp` files in a tenant directory.
//
// Threading: any thread. Each call runs its own TBB parallel loops (it may
// use every core while it runs). Calls that write or delete in the same
// tenant_dir must be serialized by the caller (one writer per tenant);
// readers (ReadCheckpoint, ListCheckpoints, LoadNewestValid) may run
// concurrently with a writer and see either the old or the new set of
// complete files, never a partial one (files appear by rename only).
//
// Crash safety: a checkpoint is written to `ckpt-<seq>.rhc.tmp`, fdatasync'ed,
// renamed to its final name and the directory fsync'ed; only then are older
// files beyond `keep` deleted. A crash at any moment leaves the previous
// complete files, possibly plus the new complete one, plus perhaps a stray
// temp file (never listed or loaded; deleted by the next WriteCheckpoint).
//
// File layout: format version 1, little-endian; the byte-level description
// and the pure encode/decode/check functions are in checkpoint_layout.h
// (internal), the reference is docs/durability.md "Checkpoint file format".
// This module (checkpoint_file.cc) does the I/O around them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "rackhub/common/status.h"

namespace rackhub::server {

// Format version this rackhubd writes and the only one it reads.
inline constexpr uint32_t kCheckpointFormatVersion = 1;

struct CheckpointChunk {  // one chunk of one key, at its key's version
  uint32_t key_id = 0;
  uint32_t chunk = 0;                      // index within the key
  std::vector<float> params;               // fp32 master values, `elements` long
  std::vector<std::vector<float>> state;   // optimizer state slots (0..2), each `elements` long
};

struct CheckpointKey {
  uint32_t id = 0;
  std::string name;
  uint64_t elements = 0;
  uint32_t chunk_count = 0;     // ceil(elements / chunk_elements)
  uint32_t chunk_elements = 0;  // elements per chunk; the last chunk may be short
  uint64_t version = 0;         // every chunk of the key is at this version
  std::string optimizer;        // optimizer type name, informational + checked on restore
  uint32_t state_slots = 0;     // optimizer state slots of every chunk of this key (0..2)
};

struct CheckpointImage {
  std::string tenant;
  uint64_t sequence = 0;
  int64_t created_unix_ms = 0;
  std::vector<CheckpointKey> keys;      // sorted by id
  std::vector<CheckpointChunk> chunks;  // sorted by (key_id, chunk); every chunk of every key
};

struct CheckpointInfo {
  std::string path;
  uint64_t sequence = 0;  // from the file name
  int64_t created_unix_ms = 0;
  uint64_t bytes = 0;     // size on disk
  std::vector<std::pair<std::string, uint64_t>> key_versions;  // name, version
  // Empty when the header and manifest verify (the chunks are not checked);
  // otherwise why they do not (the file cannot be loaded).
  std::string problem;
};

// Writes `image` as tenant_dir/ckpt-<image.sequence>.rhc (see the contract
// above), creating tenant_dir (mode 0700) if missing, then deletes the oldest
// checkpoints beyond the `keep` newest; the file just written is never
// deleted. Stray temp files are deleted first. An existing file with the same
// sequence is replaced atomically.
// Errors: INVALID_ARGUMENT for an inconsistent image or keep == 0 (nothing is
// written), INTERNAL for an I/O error (the temp file is removed; older files
// are untouched).
Result<CheckpointInfo> WriteCheckpoint(const std::string& tenant_dir, const CheckpointImage& image,
                                       uint32_t keep);

// Reads and fully verifies one checkpoint file. Errors: NOT_FOUND (no such
// file), FAILED_PRECONDITION (damaged, truncated, other format version; the
// message starts with the path and names the exact problem), INTERNAL (I/O).
Result<CheckpointImage> ReadCheckpoint(const std::string& path);

// The checkpoints of tenant_dir, newest (highest sequence) first, from their
// headers and manifests only. Temp files and other names are ignored; a
// missing directory lists nothing.
std::vector<CheckpointInfo> ListCheckpoints(const std::string& tenant_dir);
// The sequences of tenant_dir's checkpoint files from their names only
// (nothing is read), ascending.
std::vector<uint64_t> CheckpointSequences(const std::string& tenant_dir);

// Deletes tenant_dir/ckpt-<sequence>.rhc (NOT_FOUND if absent).
Status DeleteCheckpoint(const std::string& tenant_dir, uint64_t sequence);

// Deletes every checkpoint and temp file of the tenant, then tenant_dir
// itself if it is then empty (the tenant was deleted). A missing directory is OK.
Status RemoveTenantCheckpoints(const std::string& tenant_dir);

// Tries the checkpoints of tenant_dir newest first and returns the first that
// verifies; each one that does not is appended to *skipped (if not null) as
// "<path>: <reason>". NOT_FOUND if none verifies (or there is none).
Result<CheckpointImage> LoadNewestValid(const std::string& tenant_dir,
                                        std::vector<std::string>* skipped);

// "ckpt-00000000000000000042.rhc".
std::string CheckpointFileName(uint64_t sequence);

}  // namespace rackhub::server
