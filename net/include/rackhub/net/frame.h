// rackhub data-plane wire frames (specified in docs/wire-protocol.md).
//
// Every message is a fixed 40-byte little-endian header followed by
// `payload_bytes` of payload. One TCP connection carries one (worker, lane)
// pair; frames on it are processed in order.
//
//   offset size field
//   0      4    magic         kMagic ("RHUB" read as bytes R,H,U,B)
//   4      1    version       kVersion
//   5      1    opcode        Opcode
//   6      1    flags         Flags
//   7      1    dtype         DType of the payload (PUSH, PARAMS, INIT)
//   8      4    tenant        tenant handle (from WELCOME; 0 in HELLO)
//   12     4    key           key id (from WELCOME / KEY_INFO)
//   16     4    chunk         chunk number within the key (0-based)
//   20     4    payload_bytes length of the payload that follows
//   24     8    iteration     PUSH: the update this gradient contributes to
//                             (0, 1, 2, ...); PARAMS: the number of updates
//                             the returned parameters include
//   32     8    request_id    chosen by the client, echoed in the reply
//
// Conversation (one connection per lane; the client opens lane 0 first and
// learns the lane count from its WELCOME):
//   C->S HELLO(payload: control.proto Hello)  S->C WELCOME(payload: Welcome)
//   C->S DECLARE(payload: KeyDeclaration)     S->C KEY_INFO(payload: KeyEntry)
//   C->S PUSH(key, chunk, iteration, gradient) S->C PARAMS(updated params)
//   C->S INIT(key, chunk, values)  (rank 0)   S->C PARAMS(iteration 0)
//   C->S PULL(key, chunk)                     S->C PARAMS(current params, once
//                                                  the key is initialized)
//   C->S SET_OPTIMIZER(key, iteration = first update it applies to,
//                      payload: OptimizerUpdate)  S->C ACK
//   C->S HEARTBEAT                             S->C HEARTBEAT
//   C->S BYE                                   (server closes quietly)
//   Hub links (one TCP connection per (hub, peer hub, lane), lane i to lane i):
//   HUB_HELLO, HUB_CHALLENGE, HUB_PROOF, HUB_ACCEPT (mutual challenge-response
//   over the hub secret, which never travels), then KEY_BIND before a key's
//   first chunk, then RACK_SUM (to
//   the chunk's home) and RACK_PARAMS (from it). Tenant and key ids in these
//   frames are the sender's; KEY_BIND maps them to the receiver's.
//   S->C ERROR(payload: ErrorBody: u32 code + UTF-8 text), request_id of the
//        offending request. Fatal errors (flag kFlagFatal) close the connection.
//
// Thread safety: plain functions over byte buffers; no shared state. Errors
// are rackhub::Status values (rackhub/common/status.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rackhub/common/status.h"

namespace rackhub::net {

inline constexpr uint32_t kMagic = 0x42554852;  // bytes 'R','H','U','B' little-endian
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 40;
// Largest control payload (HELLO, WELCOME, DECLARE, ...): a WELCOME lists
// every key of a tenant, 1 MiB holds several thousand.
inline constexpr uint32_t kMaxControlPayload = 4u << 20;
// Largest data payload: one chunk of the largest chunk size in fp32.
inline constexpr uint32_t kMaxDataPayload = 64u << 20;

enum class Opcode : uint8_t {
  kHello = 1,
  kWelcome = 2,
  kPush = 3,
  kParams = 4,
  kInit = 5,
  kPull = 6,
  kError = 7,
  kHeartbeat = 8,
  kBye = 9,
  kDeclare = 10,
  kKeyInfo = 11,
  kSetOptimizer = 12,
  kAck = 13,
  // Between hubs (rack exchange, docs/architecture.md):
  kHubHello = 14,    // payload: control.proto HubHello; first frame of a hub link
  kKeyBind = 15,     // payload: KeyBind; names (tenant, key) before its first chunk
  kRackSum = 16,     // fp32 rack sum of one chunk for `iteration`, to the chunk's home hub
  kRackParams = 17,  // the home hub's new parameters of one chunk (key dtype)
  // Row-sparse tables (docs/wire-protocol.md, section 6b). `chunk` is the
  // table's row range; payloads start with a RowsPrefix.
  kPushRows = 18,  // rows pushed for `iteration` + the row ids wanted back
  kRows = 19,      // the hub's rows (key dtype) answering PUSH_ROWS / PULL_ROWS
  kPullRows = 20,  // row ids wanted now, no contribution
  // Hub-link authentication (docs/wire-protocol.md, section 7), after HUB_HELLO:
  kHubChallenge = 21,  // acceptor -> opener: control.proto HubChallenge (its nonce)
  kHubProof = 22,      // opener -> acceptor: HubProof (the opener's HMAC)
  kHubAccept = 23,     // acceptor -> opener: HubProof (the acceptor's HMAC); link up
  // Cross-rack recovery (docs/wire-protocol.md section 7b):
  kRackVersions = 24,  // control.proto RackVersions: a hub's key versions in a recovery round
  kRackAlign = 25,     // the home's parameters of one chunk at the agreed version (key dtype)
  // Cluster checkpoints (docs/wire-protocol.md section 7c):
  kRackCheckpoint = 26,  // control.proto RackCheckpoint, on lane 0's link
  // Elastic tenants with hub optimizers (docs/wire-protocol.md section 6e),
  // from a worker on every lane, no payload, answered with ACK:
  kCommit = 27,    // `iteration` = the members' commit number: copy every chunk
  kRollback = 28,  // `iteration` = the commit asked for: every chunk back to it
  // Bounded/async tenants spanning racks (docs/wire-protocol.md section 7d):
  kRackRelay = 29,       // a worker's PUSH / INIT / PULL (or a member notice) to the chunk's home
  kRackRelayReply = 30,  // the home's answer to one (an encoded PARAMS or ERROR frame)
};
inline constexpr uint8_t kMaxOpcode = 30;

// RACK_RELAY's payload starts with this prefix (then the worker's payload):
// u8 kind (RelayKind), u8 opcode (the worker's: PUSH, INIT or PULL), u16
// reserved (0), u32 rank (the worker's rank on the sending hub's rack),
// u64 session (its HELLO's session). RACK_RELAY_REPLY's payload is a whole
// frame: its kHeaderBytes header, then its payload. Both may carry a chunk
// of up to kMaxDataPayload bytes besides.
inline constexpr size_t kRelayPrefixBytes = 16;
inline constexpr uint32_t kMaxRelayPayload = kMaxDataPayload + kHeaderBytes + kRelayPrefixBytes;
enum class RelayKind : uint8_t {
  kFrame = 0,       // the worker's frame (opcode, header fields, payload)
  kMemberBack = 1,  // the worker is connected to the sender on this lane
  kMemberGone = 2,  // its connection there closed
};

enum class DType : uint8_t { kNone = 0, kFp32 = 1, kFp16 = 2, kBf16 = 3 };
inline constexpr uint32_t DTypeBytes(DType d) { return d == DType::kFp32 ? 4 : 2; }
const char* DTypeName(DType d);

enum Flags : uint8_t {
  kFlagFatal = 1,  // ERROR: the server closes the connection after this frame
  // PUSH: the payload is a sparse (top-k) gradient, see SparsePayload.
  kFlagSparse = 2,
  // PARAMS of a tenant that is not sync (docs/consistency.md): the payload
  // ends with a 16-byte VersionsSuffix after the parameters.
  kFlagVersions = 4,
  // PARAMS of an elastic tenant (docs/elastic.md): the payload ends with a
  // 16-byte MembershipSuffix after the parameters.
  kFlagMembership = 8,
};

// Error codes carried in ERROR frames (and surfaced by the client).
enum class WireError : uint32_t {
  kMalformed = 1,          // bad magic/version/opcode/length/field
  kUnauthenticated = 2,    // wrong tenant or token
  kUnknownKey = 3,
  kBadChunk = 4,           // chunk out of range or wrong payload size
  kBadDType = 5,
  kBadIteration = 6,       // stale or ahead of the hub
  kDuplicatePush = 7,      // the rank already pushed this chunk this iteration
  kNotReady = 8,           // INIT expected / key not initialized
  kWorkerLost = 9,         // another worker of the tenant disconnected or timed out
  kQuotaExceeded = 10,
  kInvalidArgument = 11,   // e.g. a DECLARE that contradicts the existing key
  kTenantGone = 12,        // the tenant or key was deleted
  kShuttingDown = 13,
  kInternal = 14,
};
// The text a WORKER_LOST opens with when a ROLLBACK failed the push (its
// update was past the members' commit: docs/elastic.md, "Hub optimizers"):
// the pusher restores the commit instead of pushing the same gradient again.
inline constexpr char kRollbackRefusal[] = "rollback: rank ";
const char* WireErrorName(WireError e);
const char* OpcodeName(Opcode op);  // "PUSH", "RACK_SUM", ...

struct FrameHeader {
  uint32_t magic = kMagic;
  uint8_t version = kVersion;
  Opcode opcode = Opcode::kHeartbeat;
  uint8_t flags = 0;
  DType dtype = DType::kNone;
  uint32_t tenant = 0;
  uint32_t key = 0;
  uint32_t chunk = 0;
  uint32_t payload_bytes = 0;
  uint64_t iteration = 0;
  uint64_t request_id = 0;
};

// Row-sparse payloads: a u32 `count` and a u32 `want` (little-endian), then
//   PUSH_ROWS: count u64 row ids, want u64 row ids, count rows of dim elements
//              of the header's dtype;
//   PULL_ROWS: count u64 row ids (want 0);
//   ROWS:      count rows (want 0), in the order the request asked for them.
inline constexpr size_t kRowsPrefixBytes = 8;
struct RowsPayload {
  std::vector<uint64_t> ids;   // PUSH_ROWS: pushed; PULL_ROWS: wanted
  std::vector<uint64_t> want;  // PUSH_ROWS only
  const std::byte* rows = nullptr;  // inside the parsed payload; null if none
  size_t row_bytes = 0;             // bytes of `rows`
};
// Parses a PUSH_ROWS or PULL_ROWS payload of rows of `dim` elements of
// `dtype`, or INVALID_ARGUMENT naming what is wrong with it (sizes, counts).
Result<RowsPayload> ParseRowsPayload(Opcode op, std::span<const std::byte> payload,
                                     uint32_t dim, DType dtype);
// Builds a PUSH_ROWS (rows != empty or ids empty) or PULL_ROWS payload
// prefix + ids (+ want); the rows follow separately.
std::string EncodeRowsRequest(std::span<const uint64_t> ids, std::span<const uint64_t> want);

// Sparse PUSH payload (flag kFlagSparse; docs/wire-protocol.md section 6c):
//   u32 count, count u32 indices (strictly ascending, < the chunk's
//   elements), count values of the header's dtype. Entries not listed are 0.
inline constexpr size_t kSparsePrefixBytes = 4;
inline constexpr size_t SparsePayloadBytes(uint32_t count, DType dtype) {
  return kSparsePrefixBytes + size_t{count} * (4 + DTypeBytes(dtype));
}
struct SparsePayload {
  uint32_t count = 0;
  const std::byte* indices = nullptr;  // inside the parsed payload
  const std::byte* values = nullptr;
};
// Parses and checks a sparse PUSH payload of a chunk of `elements` with at
// most `max_count` entries, or INVALID_ARGUMENT naming what is wrong
// ("indices: ...").
Result<SparsePayload> ParseSparsePayload(std::span<const std::byte> payload, uint32_t elements,
                                         uint32_t max_count, DType dtype);

// What ends a PARAMS payload with kFlagVersions: u64 `updates` (updates
// applied to the chunk, every worker's), u64 `slowest` (the iteration count
// of the slowest live worker of the chunk when the reply was released).
inline constexpr size_t kVersionsSuffixBytes = 16;
struct VersionsSuffix {
  uint64_t updates = 0;
  uint64_t slowest = 0;
};

// What ends a PARAMS payload with kFlagMembership: u64 `generation` (the
// membership generation of the update that produced these parameters; 0
// before the first update), u32 `members` (its member count, the divisor of
// a mean), u32 reserved (0).
inline constexpr size_t kMembershipSuffixBytes = 16;
struct MembershipSuffix {
  uint64_t generation = 0;
  uint32_t members = 0;
};

// Serializes `h` into exactly kHeaderBytes bytes.
void EncodeHeader(const FrameHeader& h, std::span<std::byte, kHeaderBytes> out);
// Parses kHeaderBytes bytes; no validation beyond the layout.
FrameHeader DecodeHeader(std::span<const std::byte, kHeaderBytes> in);

// Checks the fields every frame must satisfy whatever its state: magic,
// version, known opcode, payload length within the opcode's bound, known
// dtype. OK, or INVALID_ARGUMENT with a message naming the field
// ("payload_bytes: ...").
Status CheckHeader(const FrameHeader& h);

// RACK_RELAY's prefix and RACK_RELAY_REPLY's frame (section 7d; the sizes
// and kinds above).
// The prefix's fields (little-endian on the wire, as the header).
struct RelayPrefix {
  RelayKind kind = RelayKind::kFrame;
  Opcode opcode = Opcode::kHeartbeat;  // kFrame: the worker's; notices: unused (0 on the wire)
  uint32_t rank = 0;                   // on the sending hub's rack
  uint64_t session = 0;
};
// Exactly kRelayPrefixBytes bytes (the reserved field 0; a notice's opcode
// byte 0).
std::string EncodeRelayPrefix(const RelayPrefix& p);
// Reads the prefix at the start of a RACK_RELAY payload, or INVALID_ARGUMENT
// naming what is wrong: shorter than the prefix, an unknown kind, a nonzero
// reserved field. The opcode is not checked here (the home says which it
// serves).
Result<RelayPrefix> DecodeRelayPrefix(std::span<const std::byte> payload);
// Checks a RACK_RELAY_REPLY payload is one whole PARAMS or ERROR frame
// (header valid by CheckHeader, payload_bytes = the rest) and returns its
// header, or INVALID_ARGUMENT naming what is wrong.
Result<FrameHeader> DecodeRelayReply(std::span<const std::byte> payload);

// A whole ERROR frame answering `request_id` on a connection of `tenant`:
// the header (payload_bytes set, kFlagFatal if `fatal`) and its body.
struct ErrorFrame {
  FrameHeader header;
  std::string body;
};
ErrorFrame MakeErrorFrame(WireError code, std::string_view text, uint32_t tenant,
                          uint64_t request_id, bool fatal);

// ERROR payload: u32 code (LE) followed by the text.
std::string EncodeErrorBody(WireError code, std::string_view text);
struct ErrorBody {
  WireError code{};
  std::string text;
};
// INVALID_ARGUMENT if `body` is shorter than 4 bytes.
Result<ErrorBody> DecodeErrorBody(std::span<const std::byte> body);

}  // namespace rackhub::net
