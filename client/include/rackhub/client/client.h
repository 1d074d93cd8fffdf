// librackhub: the worker side of the rackhub data plane (docs/architecture.md,
// docs/wire-protocol.md).
//
// A Client is one worker (rank) of one tenant. It keeps one TCP connection per
// hub lane; chunk g of the tenant's chunk space travels on lane g % lanes.
// Operations on keys (PushPull, Init, Pull, SetOptimizer) and an elastic
// tenant's CommitElastic / RollbackElastic are asynchronous and return a
// Ticket, completed either through Wait/WaitFor or through an optional
// callback. DeclareKey is blocking.
//
// Threads and ownership:
//  - Every Client method may be called from any thread, concurrently.
//  - The client runs one internal I/O thread (a Boost.Asio io_context that owns
//    every lane socket). Completion callbacks run on that thread: keep them
//    short and do not call Wait/WaitFor/Close from inside them (issuing new
//    operations from a callback is fine).
//  - Buffers passed to asynchronous calls (`grad`, `out`, `values`) are
//    borrowed, not copied (fp32 keys are sent from and received into them
//    directly): they must stay alive and untouched until the ticket completes
//    (Wait returned, or the callback ran). A ticket completes only once the
//    I/O thread no longer touches them, even when it fails.
//  - The Client object must outlive every ticket it issued; the destructor
//    calls Close().
//
// Installed as <rackhub/client/client.h> (docs/packaging.md): C++20, only
// standard headers, linked against librackhub.so (CMake: find_package(rackhub)
// and rackhub::client; pkg-config: rackhub). Nothing of the wire format
// (rackhub/net/) is part of this API; WireError below mirrors its error codes.
//
// Errors (one page for all of them: docs/errors.md): every failure reaches the
// caller as an Error. A request the hub refuses fails with kServer and the
// hub's code and text. A ticket that is not done after Options::op_timeout
// fails with kTimeout. Nothing blocks forever.
//
// Reconnect (every transport; Options::reconnect, default on): when a lane breaks
// (EOF, reset, a fatal ERROR other than MALFORMED / UNAUTHENTICATED /
// TENANT_GONE / the client-caused BAD_CHUNK, BAD_DTYPE, DUPLICATE_PUSH,
// NOT_READY, INVALID_ARGUMENT, garbage from the hub, e.g. a hub restart) the
// client reconnects every lane (HELLO with the same tenant, token, rank and
// rack) with exponential back-off (50 ms doubling to 1 s), for as long as the
// op_timeout of the oldest pending ticket allows (no pending ticket: up to
// op_timeout after the break; op_timeout 0: until Close). Pending tickets
// stay pending and are re-sent on the new connection. Only if the reconnect
// fails do they fail with kConnectionLost; then every later call fails at once
// and the client must be recreated. A reconnect chooses the transport as
// Connect does (shared memory asks the hub for a fresh offer).
//
// Resynchronization (the training-loop contract). After a reconnect the hub
// may be at another version of a key than the client (a restarted hub reloads
// its newest checkpoint). Such a key is marked "resync needed": a PushPull on
// it that was in flight, and every later PushPull until the caller Pulls the
// key, fails with kRolledBack, Error::iteration = the hub's version N (nothing
// is sent). A PushPull refused by the hub with kServer/WORKER_LOST (another
// rank of the tenant died) or kServer/BAD_ITERATION (the key moved on without
// this rank; Error::iteration = the chunk's version) marks the key the same
// way, the error staying kServer with its wire code. What a trainer does on
// kRolledBack or kServer/WORKER_LOST: Pull the key(s) (that clears the mark and
// sets the key's next iteration to the hub's), drop the step's gradients and
// continue the loop with the next batch; after WORKER_LOST the next PushPull
// waits for the lost rank or its replacement (bounded by the hub's straggler
// timeout). A FROM_CLIENT key rolled back to 0 by a hub
// that had no checkpoint may have no values: rank 0 Inits it again first
// (kServer/INVALID_ARGUMENT "already initialized" is fine), else the Pulls
// wait for that. A key that is gone after a reconnect (deleted, or another
// layout) fails its operations with kServer/UNKNOWN_KEY.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace rackhub::client {

// Data-plane transport of a client (docs/architecture.md, Transports).
enum class Transport {
  kTcp,   // TCP to Options::hub
  kRdma,  // RDMA (RC queue pairs over rdma_cm) to Options::rdma_hub; fails without a device
  kAuto,  // RDMA when a verbs device is present and the hub accepts it, else TCP
};

// Shared memory with a hub on the same host (docs/architecture.md,
// Transports): the client asks the hub over TCP for its offer and compares
// the hub's boot id with its own.
enum class Shm {
  kAuto,  // use it when the hub is on this host and offers it (transport kTcp or kAuto)
  kOn,    // required: Connect fails with kConnectFailed when it cannot be used
  kOff,   // never
};

struct Options {
  std::string hub = "127.0.0.1:7700";  // HOST:PORT of the hub's data plane
  Transport transport = Transport::kTcp;
  // HOST:PORT of the hub's RDMA listener (its data.rdma_listen); "" = the
  // host of `hub`, port 7702 (the hub's default).
  std::string rdma_hub;
  std::string rdma_device;             // "" = whichever device routes to the hub
  uint32_t rdma_ring_bytes = 4u << 20; // registered receive ring per lane (and as much staging)
  bool rdma_busy_poll = false;         // busy-poll the completion queue instead of sleeping
  Shm shm = Shm::kAuto;
  bool shm_busy_poll = false;          // poll the ring 50 us before sleeping on the doorbell
  std::string tenant;
  std::string token;                   // the tenant's data-plane token
  uint32_t rank = 0;                   // worker rank in its rack
  uint32_t rack = 0;
  std::chrono::milliseconds connect_timeout{10000};  // whole Connect(): all lanes
  std::chrono::milliseconds op_timeout{120000};      // per ticket; 0 = no timeout
  // Reconnect a broken TCP connection (see above); false: a broken lane
  // fails every ticket with kConnectionLost at once.
  bool reconnect = true;
};

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument = 1,  // caller's mistake, detected locally; nothing was sent
  kConnectFailed = 2,    // TCP/RDMA connect / handshake failed or timed out
  kUnauthenticated = 3,  // the hub refused the tenant name or token
  kConnectionLost = 4,   // a lane connection broke; the client is unusable
  kTimeout = 5,          // op_timeout expired
  kServer = 6,           // the hub answered with an ERROR frame (see Error::wire)
  kClosed = 7,           // Close() was called
  kRolledBack = 8,       // the hub's version of the key differs (Error::iteration); Pull it
  kResource = 9,         // a local resource (shared memory, descriptors) could not be made
};
const char* ErrorCodeName(ErrorCode code);

// The hub's error code of an ERROR frame: the same numbers as the wire's u32
// code (docs/wire-protocol.md, Error codes; docs/errors.md says which are
// fatal). kNone: no hub error.
enum class WireError : uint32_t {
  kNone = 0,
  kMalformed = 1,         // bad magic/version/opcode/length/field
  kUnauthenticated = 2,   // wrong tenant or token
  kUnknownKey = 3,
  kBadChunk = 4,          // chunk out of range or wrong payload size
  kBadDType = 5,
  kBadIteration = 6,      // stale or ahead of the hub
  kDuplicatePush = 7,     // the rank already pushed this chunk this iteration
  kNotReady = 8,          // INIT expected / key not initialized
  kWorkerLost = 9,        // another worker of the tenant disconnected or timed out
  kQuotaExceeded = 10,
  kInvalidArgument = 11,  // e.g. a DECLARE that contradicts the existing key
  kTenantGone = 12,       // the tenant or key was deleted
  kShuttingDown = 13,
  kInternal = 14,
};
// "WORKER_LOST", ...; "NONE" for kNone, "UNKNOWN" for a code this client does
// not know.
const char* WireErrorName(WireError code);

struct Error {
  ErrorCode code = ErrorCode::kOk;
  WireError wire = WireError::kNone;  // set for kServer (and kUnauthenticated from the hub)
  std::string message;       // human readable; includes the hub's text if any
  // kRolledBack: the hub's version of the key (the iteration a Pull returns).
  // kServer/BAD_ITERATION: the chunk's version the hub reported.
  uint64_t iteration = 0;

  bool ok() const { return code == ErrorCode::kOk; }
  static Error Ok() { return {}; }
};

// Wire dtype of a key (the hub keeps an fp32 master copy).
enum class DType : uint8_t { kFp32 = 1, kFp16 = 2, kBf16 = 3 };
// kRandom: row-sparse tables only: row r, column c starts at
// TableInitValues(init_seed, init_scale, ...) (uniform in [-scale, scale)).
enum class Init : uint8_t { kZeros = 1, kFromClient = 2, kRandom = 3 };

struct OptimizerSpec {
  // sgd | momentum | nesterov | adam | adamw | adagrad | sum-only.
  // Empty: the tenant's default (DeclareKey) or "keep the type" (SetOptimizer).
  std::string type;
  double learning_rate = 0, momentum = 0, weight_decay = 0, beta1 = 0, beta2 = 0, epsilon = 0,
         initial_accumulator = 0;
  // How the workers' contributions combine: "mean" (or empty) of the
  // gradients, "sum", or element-wise "min", "max", "product" (type
  // sum-only only; docs/admin.md, Reductions).
  std::string reduction = {};
};

using KeyId = uint32_t;
using Ticket = uint64_t;
using Callback = std::function<void(const Error&)>;

struct KeyDecl {
  std::string name;
  uint64_t elements = 0;
  DType dtype = DType::kFp32;
  std::optional<OptimizerSpec> optimizer = std::nullopt;  // unset: the tenant's default
  Init init = Init::kZeros;
  // A row-sparse table (an embedding table) of rows x dim when rows > 0
  // (elements then 0 or rows * dim): PushPullRows / PullRows instead of
  // PushPull / Pull. init kZeros or kRandom (with init_scale > 0).
  uint64_t rows = 0;
  uint32_t dim = 0;
  float init_scale = 0;
  uint64_t init_seed = 0;
  // Top-k sparsification (docs/compression.md), dense keys only: in (0, 1],
  // 0 = dense pushes. Each chunk's push carries its ceil(ratio * elements)
  // largest-magnitude entries (sent dense when that is not smaller). With
  // error_feedback the entries not sent are kept in a residual on this
  // worker and added to the next PushPull's gradient.
  double topk_ratio = 0;  // k = ceil(ratio * n) of this double (not of a float)
  bool error_feedback = true;
  // A participant set (a process set's keys): the ranks, strictly ascending
  // and < workers(), whose pushes each update sums, in rank order (kMean
  // divides by their count); only they may push it (another rank's push
  // fails with kServer / INVALID_ARGUMENT naming the key), and keys of
  // disjoint sets complete independently. Empty: every worker. Part of the
  // key: every rank must declare it with the same set (a different set is
  // refused). Dense keys of single-rack, sync, non-elastic tenants only.
  std::vector<uint32_t> participants = {};
};

struct KeyInfo {
  KeyId id = 0;
  std::string name;
  uint64_t elements = 0;
  DType dtype = DType::kFp32;
  Init init = Init::kZeros;
  uint64_t first_chunk = 0;  // tenant-wide index of chunk 0
  uint64_t chunk_count = 0;
  uint64_t version = 0;          // updates applied, as the hub last reported it
  uint64_t next_iteration = 0;   // the iteration the next PushPull contributes to
  bool resync_needed = false;    // PushPull fails with kRolledBack until a Pull
  uint64_t rows = 0;             // row-sparse table: rows x dim; 0 for dense keys
  uint32_t dim = 0;
  uint64_t rows_per_chunk = 0;   // table: chunk c holds rows [c * rows_per_chunk, ...)
  double topk_ratio = 0;         // > 0: pushes are top-k sparsified (the ratio as declared)
  std::vector<uint32_t> participants = {};  // KeyDecl::participants (empty: every worker)
  // Bounded/async tenants (docs/consistency.md), as the last PushPull/Pull
  // reported (the minimum over the key's chunks; 0 in sync tenants):
  // updates applied (every worker's contributions), and the iteration count
  // of the slowest live worker when the replies were released.
  uint64_t updates = 0;
  uint64_t slowest_iteration = 0;
  // Elastic tenants (docs/elastic.md), as the last successful PushPull/Pull
  // reported: the membership generation of the update that produced the
  // parameters and its member count (what a mean divided by); 0 before the
  // first update and in other tenants. membership_mixed: the key's chunks
  // named different generations (the lowest is reported; after a Pull it
  // cannot happen).
  uint64_t membership_generation = 0;
  uint32_t members = 0;
  bool membership_mixed = false;
};

// Memory the client lends to the hubs on its host: a PushPull whose `grad`
// lies in a lease is read by a hub over shared memory in place, with no copy
// into the ring (fp32 keys, dense pushes: each chunk's part of at least
// 4 KiB; docs/client.md, "Zero-copy pushes"). Over TCP and RDMA it is
// ordinary memory. Any client of the process may push from any lease. Keep
// the lease (a shared handle: copies share the memory) alive, and do not
// write it, until the PushPull that reads it completed. Zero-filled.
class LeasedBuffer {
 public:
  LeasedBuffer() = default;
  std::span<float> floats() const { return floats_; }
  explicit operator bool() const { return region_ != nullptr; }

 private:
  friend class Client;
  std::shared_ptr<void> region_;
  std::span<float> floats_;
};

class Client {
 public:
  // A lease of `elements` floats (kInvalidArgument for 0 or more than
  // 16 Gi elements; kInternal when the memory cannot be made).
  static Error LeaseElements(size_t elements, LeasedBuffer* out);
  // A lease the size of key `key` (kInvalidArgument for an unknown key or a
  // row-sparse table).
  Error Lease(KeyId key, LeasedBuffer* out) const;

  // Connects every lane (lane 0 first, then the lane count from its WELCOME)
  // within options.connect_timeout. Returns null and fills *error on failure
  // (kInvalidArgument for a bad hub address, kUnauthenticated, kConnectFailed).
  static std::unique_ptr<Client> Connect(const Options& options, Error* error);

  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // What the hub told us at connect time.
  uint32_t tenant_handle() const;
  uint32_t lanes() const;
  uint32_t workers() const;
  uint32_t chunk_elements() const;
  uint32_t straggler_timeout_ms() const;
  // Successful reconnects so far.
  uint64_t reconnects() const;
  // The transport the lanes use now: "tcp", "rdma", "shm" (or "memory" in
  // tests). A reconnect always dials TCP.
  const char* transport() const;

  // Creates the key or returns the existing one of that name (every rank may
  // declare the same key). Blocks up to op_timeout. Quota refusals and
  // contradicting declarations fail with kServer.
  Error DeclareKey(const KeyDecl& decl, KeyId* out);
  // A key known from the WELCOME table or an earlier DeclareKey.
  std::optional<KeyId> FindKey(const std::string& name) const;
  std::optional<KeyInfo> GetKeyInfo(KeyId key) const;

  // Sends `grad` (converted to the key's dtype) for the key's next iteration
  // and receives the updated parameters into `out`. Sizes must equal the key's
  // element count. At most one PushPull per key may be pending (different keys
  // may be pipelined freely). On success the key's next iteration advances.
  Ticket PushPull(KeyId key, std::span<const float> grad, std::span<float> out,
                  Callback done = nullptr);
  // Rank 0 of a FROM_CLIENT key: supplies the initial parameters.
  Ticket Init(KeyId key, std::span<const float> values, Callback done = nullptr);
  // Current parameters (waits on the hub until the key is initialized).
  // Resynchronizes the key's next iteration with the hub and clears its
  // "resync needed" mark.
  Ticket Pull(KeyId key, std::span<float> out, Callback done = nullptr);
  // Row-sparse tables (docs/architecture.md, Row-sparse tables).
  // Contributes rows `ids` (any order; duplicates are summed in the order
  // given; may be empty) with `grads` (ids.size() * dim values, row after
  // row) to the table's next iteration, and receives into `out`
  // (want.size() * dim) the rows `want` after the update: the hub sums each
  // touched row over every worker in rank order and applies the optimizer to
  // touched rows only. Every rank contributes to every iteration (an empty
  // push when its batch touches no row). Ids are checked here before anything
  // is sent (kInvalidArgument: out of range, sizes); nothing is changed then.
  // Buffers are copied when the call returns (unlike PushPull) except `out`,
  // which is borrowed. Same iteration and resync rules as PushPull.
  Ticket PushPullRows(KeyId key, std::span<const uint64_t> ids, std::span<const float> grads,
                      std::span<const uint64_t> want, std::span<float> out,
                      Callback done = nullptr);
  // The current rows `ids` into `out` (ids.size() * dim); contributes
  // nothing. Resynchronizes the table's next iteration like Pull.
  Ticket PullRows(KeyId key, std::span<const uint64_t> ids, std::span<float> out,
                  Callback done = nullptr);

  // New hyperparameters (same type) taking effect at update `from_iteration`.
  Ticket SetOptimizer(KeyId key, const OptimizerSpec& spec, uint64_t from_iteration,
                      Callback done = nullptr);

  // Elastic tenants whose keys run an optimizer on the hub (docs/elastic.md,
  // "Hub optimizers"). CommitElastic: the members' commit number `commit`
  // (every member sends the same, after every one of them has its step's
  // replies and before any pushes the next): the hub keeps a copy of every
  // such chunk (parameters, optimizer state, version). RollbackElastic:
  // every such chunk back to that copy (`commit` must be the hub's last
  // commit); Pull the keys afterwards. Both go to every lane and complete
  // once every lane answered; both are idempotent. Errors (kServer): a
  // tenant that is not elastic, a rollback before any commit or of another
  // commit (INVALID_ARGUMENT, naming it), a rollback while the tenant
  // recovers (WORKER_LOST: Pull a key, ask again).
  Ticket CommitElastic(uint64_t commit, Callback done = nullptr);
  Ticket RollbackElastic(uint64_t commit, Callback done = nullptr);

  // Blocks until the ticket completes and returns its result; consumes the
  // ticket (a second Wait returns kInvalidArgument). Tickets issued with a
  // callback are consumed by the callback: do not Wait on them.
  Error Wait(Ticket ticket);
  // As Wait, but gives up after `timeout` with kTimeout, leaving the ticket
  // pending (it can be waited again).
  Error WaitFor(Ticket ticket, std::chrono::milliseconds timeout);

  // Sends BYE on every lane, fails pending tickets with kClosed, stops the I/O
  // thread. Idempotent. Later calls fail with kClosed. Must not be called from
  // a callback.
  void Close();

  class Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The initial values of rows [first_row, first_row + rows) of a table
// declared with Init::kRandom (init_seed, init_scale), bit for bit as the hub
// makes them, into `out` (rows * dim): for single-process references.
void TableInitValues(uint64_t seed, float scale, uint64_t first_row, uint64_t rows, uint32_t dim,
                     float* out);

// Element conversions used on the wire (round to nearest, ties to even; NaN
// stays NaN; exposed for tests and bindings).
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
uint16_t FloatToBfloat16(float f);
float Bfloat16ToFloat(uint16_t b);

}  // namespace rackhub::client
