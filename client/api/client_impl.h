// Private to librackhub: the state behind rackhub::client::Client.
//
// Threads: caller threads touch only what `mu_` guards (key table, ticket
// table, client state) and post work to the I/O thread. Everything marked
// "I/O thread" (lanes, pending requests, per-operation progress) is touched
// only from handlers of `io_`, i.e. from the I/O thread, or from the thread
// that joined it (Close) after it stopped.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "rackhub/client/client.h"
#include "rackhub/net/asio.h"
#include "rackhub/net/frame.h"

namespace rackhub::client {

namespace asio = boost::asio;

// An Error with `code`, `message` and the hub's `wire` code (if any): the
// one way the client's files make one.
inline Error MakeError(ErrorCode code, std::string message, WireError wire = WireError::kNone) {
  Error e;
  e.code = code;
  e.wire = wire;
  e.message = std::move(message);
  return e;
}

namespace internal {

enum class OpKind {
  kPushPull, kInit, kPull, kSetOptimizer, kDeclare, kPushPullRows, kPullRows,
  kCommit, kRollback,  // elastic tenants: tenant-wide, every lane, no key
};
const char* OpKindName(OpKind kind);

// One ticket: a request split into one frame per chunk (or per lane).
struct Operation {
  // Set by the issuing thread before the operation is posted; read-only after.
  Ticket ticket = 0;
  OpKind kind = OpKind::kPushPull;
  KeyId key = 0;
  DType dtype = DType::kFp32;
  uint64_t elements = 0;
  uint64_t first_chunk = 0;
  uint64_t iteration = 0;     // PUSH iteration / SET_OPTIMIZER from_iteration
  std::span<const float> in;  // PushPull gradient / Init values (borrowed)
  std::span<float> out;       // PushPull / Pull destination (borrowed)
  // `in` converted for fp16/bf16 keys: the key's staging buffer, reused by
  // every operation of the key (one at a time), so no allocation and no
  // page faults per push.
  std::shared_ptr<std::vector<uint16_t>> narrowed;
  std::string control;  // protobuf payload (DECLARE, SET_OPTIMIZER)
  Callback callback;
  // PushPullRows / PullRows: one request per chunk (row range) of the table,
  // built by the issuing thread: its payload, and for each row its reply
  // carries, the row's place in `out`.
  struct RowPart {
    std::string payload;
    std::vector<uint32_t> places;
  };
  std::vector<RowPart> row_parts;
  uint32_t dim = 0;
  // PushPull of a top-k key (compress.cc): the key's residual (error
  // feedback; null without) and every chunk's payload, built by the issuing
  // thread into the key's reused buffer: sparse (kFlagSparse) or, where
  // that is not smaller, the chunk dense.
  double topk_ratio = 0;
  std::shared_ptr<std::vector<float>> residual;
  struct PackedChunk {
    size_t offset = 0;
    size_t bytes = 0;
    bool sparse = false;
  };
  std::shared_ptr<std::vector<std::byte>> packed;
  std::vector<PackedChunk> packed_chunks;

  // I/O thread.
  size_t remaining = 0;   // replies still expected
  int io_refs = 0;        // transfers in flight that read or write `in`/`out`
  bool failed = false;    // error holds why; the rest of the replies are ignored
  bool finished = false;  // completion delivered
  Error error;
  uint64_t min_reply_iteration = UINT64_MAX;
  // Bounded/async tenants: the replies' VersionsSuffix, minimum over chunks.
  uint64_t min_updates = UINT64_MAX;
  uint64_t min_slowest = UINT64_MAX;
  // Elastic tenants: the replies' MembershipSuffix (the lowest generation
  // over the chunks, with its member count; `membership_mixed` when chunks
  // named different generations).
  uint64_t membership_generation = UINT64_MAX;
  uint32_t members = 0;
  bool membership_mixed = false;
  std::optional<KeyInfo> declared;  // KEY_INFO of a DECLARE
  bool started = false;  // Start ran: it is (re)sent by a reconnect

  // Completion as seen by waiters.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;  // GUARDED_BY(mu)
  Error result;       // GUARDED_BY(mu)
};
using OperationPtr = std::shared_ptr<Operation>;

// A request sent on a lane, waiting for its reply.
struct PendingRequest {
  OperationPtr op;
  net::Opcode expect = net::Opcode::kParams;
  uint32_t chunk = 0;
  uint64_t offset = 0;    // first element of the chunk in the key
  uint32_t elements = 0;  // elements of the chunk
};

// A frame in a lane's write queue: header plus an optional payload borrowed
// from `op` (the caller's buffer, or a buffer the operation or its key holds).
// payload_bytes is set from `bytes` when the frame is sent.
// OutFrame::pos of a frame the lanes do not keep in step (control frames,
// pulls, rows).
inline constexpr uint64_t kUnpaced = UINT64_MAX;

struct OutFrame {
  net::FrameHeader header;
  const void* payload = nullptr;
  size_t bytes = 0;
  OperationPtr op;        // null for BYE
  bool holds_io = false;  // set by the lane: the payload holds an io_ref of op
  // A push's place in the client's stream of pushed bytes, in issue order
  // across lanes (lane.h, "lanes in step"); kUnpaced for other frames.
  uint64_t pos = kUnpaced;
};

class Lane;
class Dialer;
struct DialedLane;

// Every lane of one dial attempt, handshaken (connect.cc), and what they are.
struct DialedLanes {
  std::vector<DialedLane> lanes;
  const char* transport = "tcp";
  uint64_t max_payload = 0;  // the smallest of the lanes'
};

// Lets transports release io_refs (Impl::HoldIo) for as long as the client's
// state lives: Close clears `impl` once the I/O thread is gone.
struct IoGate {
  Client::Impl* impl = nullptr;
};

}  // namespace internal

class Client::Impl {
  // Impl's own files name the operation types without internal::.
  using Lane = internal::Lane;
  using OpKind = internal::OpKind;
  using Operation = internal::Operation;
  using OperationPtr = internal::OperationPtr;
  using OutFrame = internal::OutFrame;
  using PendingRequest = internal::PendingRequest;

 public:
  explicit Impl(const Options& options);
  ~Impl();

  // Handshakes every lane and starts the I/O thread.
  Error Connect();

  Error DeclareKey(const KeyDecl& decl, KeyId* out);
  std::optional<KeyId> FindKey(const std::string& name) const;
  std::optional<KeyInfo> GetKeyInfo(KeyId key) const;
  Ticket PushPull(KeyId key, std::span<const float> grad, std::span<float> out, Callback done);
  Ticket InitKey(KeyId key, std::span<const float> values, Callback done);
  Ticket Pull(KeyId key, std::span<float> out, Callback done);
  Ticket SetOptimizer(KeyId key, const OptimizerSpec& spec, uint64_t from_iteration, Callback done);
  Ticket Elastic(OpKind kind, uint64_t commit, Callback done);
  Ticket PushPullRows(KeyId key, std::span<const uint64_t> ids, std::span<const float> grads,
                      std::span<const uint64_t> want, std::span<float> out, Callback done);
  Ticket PullRows(KeyId key, std::span<const uint64_t> ids, std::span<float> out, Callback done);
  Error Wait(Ticket ticket, std::optional<std::chrono::milliseconds> timeout);
  void Close();

  uint32_t tenant_handle() const { return tenant_handle_; }
  uint32_t lanes() const { return lane_count_; }
  uint32_t workers() const { return workers_; }
  uint32_t chunk_elements() const { return chunk_elements_; }
  uint32_t straggler_timeout_ms() const { return straggler_timeout_ms_; }

  // ---- Called by lanes (I/O thread) ----
  // Lanes in step (lane.h): the oldest pushed byte no lane has written yet
  // (UINT64_MAX: none waits), and "a lane wrote pushed bytes: every lane
  // may hand more to its connection now".
  uint64_t PaceFrontier() const;
  void PumpLanes();
  // One reply of `op` arrived and was stored.
  void ReplyArrived(const internal::OperationPtr& op, uint64_t iteration);
  // A PARAMS reply's VersionsSuffix (bounded/async tenants), before ReplyArrived.
  void VersionsArrived(const internal::OperationPtr& op, const net::VersionsSuffix& v);
  // A PARAMS reply's MembershipSuffix (elastic tenants), before ReplyArrived.
  void MembershipArrived(const internal::OperationPtr& op, const net::MembershipSuffix& m);
  void FailOp(const internal::OperationPtr& op, Error error);
  // Drops one io_ref of `op` and completes it if that was the last thing.
  void ReleaseIo(const internal::OperationPtr& op);
  // What a transport holds while it needs a frame's payload: keeps `op` (and
  // so its buffers) alive, and with `io_ref` releases one io_ref of it when
  // dropped (on the I/O thread, or after Close: then it does nothing).
  std::shared_ptr<const void> HoldIo(const internal::OperationPtr& op, bool io_ref);
  // A lane broke: fails everything, the client becomes unusable.
  // `reconnectable`: the break may be healed by reconnecting (EOF, reset,
  // SHUTTING_DOWN, ...); false for fatal errors the client caused itself.
  // With Options::reconnect (TCP) the client then reconnects every lane and
  // re-sends the pending tickets; otherwise (or once that fails) everything
  // fails with kConnectionLost and the client is unusable.
  void ConnectionLost(const std::string& reason, bool reconnectable = true);
  void LaneClosed();
  bool closing() const { return closing_io_; }
  uint64_t reconnects() const { return reconnects_.load(); }
  const char* transport() const { return transport_.load(); }
  // A broken lane is reconnected (Options::reconnect).
  bool reconnect_enabled() const { return options_.reconnect && can_reconnect_; }

 private:
  enum class State { kOpen, kBroken, kClosed };

  // Issue helpers (caller threads).
  // A new operation of `kind` on `key`, completed through `done` (if set).
  static OperationPtr NewOperation(OpKind kind, KeyId key, Callback done);
  // Issues `op` (REQUIRES: mu_ not held): registers its ticket if the client
  // is usable and the key admits it (AdmitLocked) and posts it to the I/O
  // thread; otherwise completes the ticket at once with the failure.
  Ticket Issue(OperationPtr op);
  Error UsableLocked() const;                        // REQUIRES: mu_ held
  Ticket Register(const OperationPtr& op);           // REQUIRES: mu_ held
  Ticket CompleteNow(OperationPtr op, Error error);  // REQUIRES: mu_ not held
  void Post(OperationPtr op);
  // Whether `op`'s key admits it now: the key is known; for a data
  // operation (PushPull, Init, Pull, rows) its buffers match the key
  // (PushPull, Init: `in`; PushPull, Pull: `out`) and the key's data-op slot
  // is free, which it then takes. Returns the failure if not.
  Error AdmitLocked(Operation* op);  // REQUIRES: mu_ held
  // The failure of a `kind` operation on key `name`, which the hub no
  // longer has since the client reconnected.
  static Error KeyGone(OpKind kind, const std::string& name);

  // I/O thread.
  void Start(const internal::OperationPtr& op);
  void StartChunks(const internal::OperationPtr& op, net::Opcode opcode);
  void StartRows(const internal::OperationPtr& op, net::Opcode opcode);
  // Issues a PushPullRows / PullRows (caller thread): checks, builds the
  // per-chunk payloads (rows.cc).
  Ticket IssueRows(internal::OperationPtr op, std::span<const uint64_t> ids,
                   std::span<const float> grads, std::span<const uint64_t> want);
  void MaybeFinish(const internal::OperationPtr& op);
  void Finish(const internal::OperationPtr& op);
  void FailAll(ErrorCode code, const std::string& message);
  // Sends `op`'s frames (the part of Start after the timer).
  void Send(const internal::OperationPtr& op);
  // A data operation about to be (re)sent: the key's state may forbid it
  // (gone, or a PushPull on a key that needs a resync).
  Error KeyAllowsSend(const internal::Operation& op);
  // The final failure: every lane aborted, every ticket kConnectionLost.
  void Broken(const std::string& message);
  // Connect steps (connect.cc), on the connecting thread or (DialAll) the
  // reconnect thread.
  // HELLO payload of `lane`; with `shm_probe`, HELLO only asks the hub for
  // its shared-memory offer.
  std::string HelloPayload(uint32_t lane, bool shm_probe = false) const;
  // The hub's answer to HELLO checked: OK and *welcome_payload, or the error.
  Error CheckHelloReply(const std::string& where, const net::FrameHeader& reply, std::string body,
                        std::string* welcome_payload) const;
  // Parses lane `lane`'s WELCOME (lane 0: adopts the layout).
  Error AcceptWelcome(uint32_t lane, const std::string& payload);
  // Dials every lane over the transport the options choose (the test
  // dialer if one was installed at Connect; else shared memory, RDMA, TCP,
  // falling back as Options say), each answer checked with CheckHelloReply.
  Error DialAll(std::chrono::steady_clock::time_point deadline, const std::atomic<bool>* cancel,
                internal::DialedLanes* out);
  Error DialLanes(internal::Dialer& dialer, std::chrono::steady_clock::time_point deadline,
                  const std::atomic<bool>* cancel, internal::DialedLanes* out);
  // Makes the lanes of `dialed` (lane i at index i) on io_ and starts them
  // (the I/O thread, or the connecting thread before it runs).
  std::vector<std::unique_ptr<internal::Lane>> AdoptLanes(internal::DialedLanes dialed);
  // Reconnect (reconnect.cc). The loop runs on reconnect_thread_; Adopt and
  // GiveUp on the I/O thread.
  void ReconnectLoop(uint64_t generation);
  void AdoptReconnect(uint64_t generation, std::shared_ptr<internal::DialedLanes> dialed);
  void GiveUpReconnect(const std::string& why);
  void StopReconnectThread();
  void CloseOnIo();
  std::vector<internal::OperationPtr> UnfinishedOps();

  struct KeyState {
    KeyInfo info;
    bool busy = false;   // a PushPull/Init/Pull is pending
    bool gone = false;   // not in the hub's key table after a reconnect
    Error resync_error;  // what a PushPull gets while info.resync_needed
    std::shared_ptr<std::vector<uint16_t>> staging = std::make_shared<std::vector<uint16_t>>();
    // Top-k keys: error feedback on (as declared here), the residual
    // (allocated by the first PushPull), the packed payloads.
    bool error_feedback = true;
    std::shared_ptr<std::vector<float>> residual;
    std::shared_ptr<std::vector<std::byte>> packed = std::make_shared<std::vector<std::byte>>();
  };
  void ImportKey(const KeyInfo& info);  // REQUIRES: mu_ held
  // Marks the key "resync needed" (REQUIRES: mu_ held).
  void MarkResync(KeyState& k, Error error);

  const Options options_;
  // This client's session (Hello.session, docs/durability.md "Worker
  // generations"): random, non-zero, the same on every lane and reconnect.
  const uint64_t session_;
  // Welcome, fixed after Connect.
  std::atomic<uint32_t> tenant_handle_{0};  // may change on a reconnect
  uint32_t lane_count_ = 0;
  std::atomic<uint32_t> workers_{0};  // may change on a reconnect
  uint32_t chunk_elements_ = 0;
  std::atomic<uint32_t> straggler_timeout_ms_{0};  // may change on a reconnect
  // WELCOME.incarnation of the hub process connected to (0: the tenant does
  // not span racks); a reconnect to another one resyncs every key. Written on
  // the connect path and the io thread's AdoptReconnect, never at once.
  uint64_t hub_incarnation_ = 0;

  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::thread thread_;
  std::shared_ptr<internal::IoGate> io_gate_ = std::make_shared<internal::IoGate>();
  std::vector<std::unique_ptr<internal::Lane>> lanes_;  // I/O thread after Connect
  std::atomic<uint64_t> next_request_id_{1};
  uint64_t next_pace_pos_ = 0;  // I/O thread: OutFrame::pos of the next push
  bool pumping_lanes_ = false, pump_lanes_again_ = false;  // I/O thread
  bool closing_io_ = false;                          // I/O thread
  std::unique_ptr<asio::steady_timer> close_timer_;  // I/O thread
  // Operation deadlines (Options::op_timeout), I/O thread: one timer for all
  // of them instead of one per operation (a timer per operation re-armed the
  // reactor's timerfd twice per round trip). Every operation gets the same
  // op_timeout when it starts, so the deadlines are in start order: the
  // queue is sorted by construction and the timer waits for its front.
  struct Deadline {
    std::chrono::steady_clock::time_point at;
    std::weak_ptr<internal::Operation> op;
  };
  std::deque<Deadline> deadlines_;
  size_t deadlines_open_ = 0;  // entries whose operation is not finished yet
  std::unique_ptr<asio::steady_timer> deadline_timer_;
  bool deadline_armed_ = false;
  // Queues `op`'s deadline (Start) and drops the finished entries from the
  // queue's front (Finish); OnDeadline expires what is due and re-arms.
  void AddDeadline(const internal::OperationPtr& op);
  void DropFinishedDeadlines();
  void ArmDeadline();
  void OnDeadline();
  void Expire(const internal::OperationPtr& op);

  std::atomic<const char*> transport_{"tcp"};  // what the lanes use now
  // The largest frame payload the lanes carry now: kMaxDataPayload, or less
  // over shared memory (a frame is one record of the ring).
  std::atomic<uint64_t> max_frame_payload_{net::kMaxDataPayload};
  // The test dialer installed at Connect (internal::ThreadTestDialer), used
  // by reconnects too; null in production.
  std::shared_ptr<internal::Dialer> test_dialer_;
  // Reconnect: set by Connect once every lane is up.
  bool can_reconnect_ = false;
  bool reconnecting_ = false;                            // I/O thread
  uint64_t reconnect_generation_ = 0;                    // I/O thread
  std::string break_reason_;                             // I/O thread
  std::chrono::steady_clock::time_point break_time_;     // I/O thread
  std::unique_ptr<asio::steady_timer> reconnect_timer_;  // I/O thread
  // Lanes replaced by a reconnect; their aborted handlers may still run.
  std::vector<std::unique_ptr<internal::Lane>> retired_lanes_;  // I/O thread
  std::thread reconnect_thread_;  // started and joined on the I/O thread, or by Close
  std::mutex reconnect_mu_;
  std::condition_variable reconnect_cv_;
  bool reconnect_cancel_ = false;             // GUARDED_BY(reconnect_mu_)
  std::atomic<bool> reconnect_abort_{false};  // aborts the reconnect thread's handshakes
  std::string reconnect_error_;               // GUARDED_BY(reconnect_mu_): last attempt's failure
  std::atomic<uint64_t> reconnects_{0};

  mutable std::mutex mu_;
  State state_ = State::kOpen;                                  // GUARDED_BY(mu_)
  Error broken_;                                                // GUARDED_BY(mu_)
  std::unordered_map<KeyId, KeyState> keys_;                    // GUARDED_BY(mu_)
  std::unordered_map<std::string, KeyId> names_;                // GUARDED_BY(mu_)
  std::unordered_map<Ticket, internal::OperationPtr> tickets_;  // GUARDED_BY(mu_)
  Ticket next_ticket_ = 1;                                      // GUARDED_BY(mu_)
  std::mutex close_mu_;                                         // serializes Close()
};

}  // namespace rackhub::client
