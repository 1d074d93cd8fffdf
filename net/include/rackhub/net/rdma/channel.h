// One RDMA connection's verbs resources and its frame ring
// (docs/wire-protocol.md, section 9): the layer under rdma::RdmaConnection
// (hub) and the client's RDMA lane.
//
// Resources (all owned, destroyed in reverse order by the destructor):
//   rdma_cm event channel + cm id (rdma_cm(7)), protection domain, completion
//   channel + completion queue, RC queue pair (rdma_create_qp(3)), and two
//   memory regions (ibv_reg_mr(3)): the receive ring (remote-writable) and the
//   send staging ring (local only).
//
// Ring protocol. Each side owns a receive ring of `slots` fixed-size slots of
// kSlotBytes. A frame (net/frame.h header + payload) occupies the consecutive
// slots ceil((kHeaderBytes + payload) / kSlotBytes), never wrapping: a frame
// that does not fit before the end starts at slot 0 and the tail slots are
// skipped. The sender copies the frame into its staging ring and moves it with
// one RDMA WRITE WITH IMMEDIATE (ibv_post_send(3), IBV_WR_RDMA_WRITE_WITH_IMM)
// straight into the peer's ring; the immediate is the first slot's index. The
// receiver learns of it from a receive completion (ibv_poll_cq(3),
// IBV_WC_RECV_RDMA_WITH_IMM), hands the frame over in place and then counts
// its slots as consumed.
//
// Flow control (credits). The sender never writes a slot the receiver has not
// consumed: it tracks slots written (tx_head_) and slots the peer reported
// consumed (peer_consumed_) and waits while tx_head_ + skip + n - peer_consumed_
// would exceed the ring. The receiver reports its consumed count with a
// zero-length SEND WITH IMMEDIATE whose immediate is kCreditFlag | (consumed mod
// 2^31); at most one such report is in flight. Reports ride the same RC queue
// pair, so they never overtake frames (RC ordering, ibv_post_send(3)).
//
// Every write-with-imm and credit report consumes one posted receive
// (ibv_post_recv(3)); the receive queue holds 2 * slots + kSpareRecvs, enough
// for a full ring of one-slot frames plus one credit report per frame.
//
// Choices (differing from the first sketch in the issue, on purpose):
//  - Slots are a fixed 1 KiB granule and a frame takes as many as it needs,
//    rather than one slot sized "header + the tenant's max chunk": the ring
//    is created at connect time, before HELLO names the tenant, and the same
//    ring carries control frames of any size (a WELCOME of thousands of keys).
//    The immediate still names the (first) slot.
//  - One protection domain and one completion queue per connection, not per
//    tenant / per lane: the PD must exist before the QP, i.e. before HELLO
//    names the tenant, and a per-connection PD is strictly narrower (an rkey
//    reaches only its own connection's ring). A per-connection CQ (sized for
//    exactly its QP, so no peer can overrun a CQ others share) is polled by
//    the lane's own thread through its completion channel fd, so the lane
//    thread still handles all of its connections' completions.
//  - The hub writes replies into the client's registered receive ring (one
//    memcpy there into the caller's `out`), not into `out` itself: that
//    would need the client to register every `out` span (or an MR cache).
//
// Threading: a Channel is driven by one thread at a time: the io_context it is
// attached to (its completion-channel fd and cm event fd are watched there
// with posix::stream_descriptor, so a hub lane handles its completions on its
// own thread). Detach() + Attach() move it to another io_context (the hub's
// listener authenticates HELLO, then hands the channel to the lane). Sending
// is allowed whenever the owning thread holds it, attached or not.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "rackhub/common/status.h"
#include "rackhub/net/asio.h"
#include "rackhub/net/endpoint.h"
#include "rackhub/net/frame.h"
#include "rackhub/net/frame_channel.h"
#include "rackhub/net/outgoing_frame.h"

struct rdma_cm_id;
struct rdma_event_channel;
struct ibv_pd;
struct ibv_cq;
struct ibv_comp_channel;
struct ibv_mr;
struct ibv_wc;

namespace rackhub::net::rdma {

// rdma_cm port a hub listens on when the config names none (TCP data plane
// 7700, admin 7701).
inline constexpr uint16_t kDefaultRdmaPort = 7702;

// Ring granularity. 1 KiB keeps the padding of a default 32 KiB chunk frame
// (32 KiB + 40 B header -> 33 slots) under 3 %.
inline constexpr uint32_t kSlotBytes = 1024;
// Default receive ring (and send staging ring) per connection: room for a
// full WELCOME of a few thousand keys and ~120 default-size chunk frames.
inline constexpr uint32_t kDefaultRingBytes = 4u << 20;
// Smallest and largest ring accepted (the slot index must fit the 31 bits of
// the immediate left by kCreditFlag).
inline constexpr uint32_t kMinRingBytes = 64u * 1024;
inline constexpr uint32_t kMaxRingBytes = 1u << 30;

enum class PollMode {
  kEvents,  // arm the CQ (ibv_req_notify_cq(3)) and sleep on the completion channel
  kBusy,    // keep polling while completions keep coming, back off to events when idle
};
const char* PollModeName(PollMode mode);

struct ChannelOptions {
  uint32_t ring_bytes = kDefaultRingBytes;  // our receive ring; rounded down to slots
  PollMode poll = PollMode::kEvents;
  std::string device;  // required verbs device name; "" = whichever the address routes to
  uint8_t port = 0;    // required port; 0 = any
};

// What one side tells the other in rdma_cm private data (rdma_connect(3),
// rdma_accept(3)); 24 bytes, within the 56 bytes RC connect requests carry.
struct RingDescriptor {
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint32_t slots = 0;
  uint32_t lane = 0;  // client -> hub: the lane this connection is for
};
inline constexpr size_t kPrivateDataBytes = 24;
void EncodeDescriptor(const RingDescriptor& d, std::array<std::byte, kPrivateDataBytes>* out);
// The descriptor in `data`, or INVALID_ARGUMENT if it is not a rackhub ring
// descriptor.
Result<RingDescriptor> DecodeDescriptor(const void* data, size_t bytes);

// Frames to send (net/outgoing_frame.h).
using net::OutgoingFrame;

// "device rxe0 port 1 gid[1] ::ffff:10.0.2.15" for a bound or connected cm
// id; *gid_index (if given) gets the GID table index rdma_cm chose, or -1.
std::string DescribeCmId(rdma_cm_id* id, int* gid_index = nullptr);

// Callbacks, Detach, Send, DropQueued, Close, open(): FrameChannel
// (net/frame_channel.h). Close disconnects (rdma_disconnect(3)).
class Channel final : public FrameChannel {
 public:
  ~Channel() override;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Client side: resolves `hub` (rdma_resolve_addr(3)/rdma_resolve_route(3)),
  // creates the resources and connects (rdma_connect(3)) for `lane`, all by
  // `deadline`. UNAVAILABLE when the hub cannot be reached, refuses or times
  // out, INVALID_ARGUMENT for a bad descriptor from the hub, INTERNAL when the
  // verbs resources cannot be created.
  static Result<std::shared_ptr<Channel>> Connect(const Endpoint& hub, uint32_t lane,
                                                  const ChannelOptions& options,
                                                  std::chrono::steady_clock::time_point deadline);
  // Hub side: takes over `id` of a CONNECT_REQUEST (already acknowledged),
  // migrates it to its own event channel (rdma_migrate_id(3)), creates the
  // resources and accepts (rdma_accept(3)). On failure rejects and returns the
  // error (INTERNAL for verbs / rdma_cm failures).
  static Result<std::shared_ptr<Channel>> Accept(rdma_cm_id* id, const RingDescriptor& peer,
                                                 const ChannelOptions& options);

  // Bytes a connection registers with these options (memlock accounting).
  static uint64_t RegisteredBytes(const ChannelOptions& options);

  // Starts watching the completion and cm fds on `io` (the calling thread must
  // be the one running `io`, or `io` must not be running yet). Completions
  // polled while detached are handled first.
  void Attach(boost::asio::io_context& io, Callbacks callbacks);
  // Backpressure: while paused, frames that arrive are held in the ring
  // (not delivered, not consumed, so no credit goes back and the peer stops
  // once the ring is full); resuming delivers them, in order, on a fresh
  // stack of the attached io_context.
  void PauseDelivery(bool on);

  const RingDescriptor& peer() const { return peer_; }
  std::string peer_address() const;  // "ip:port" of the other end
  // "device rxe0 port 1 gid[1] ::ffff:10.0.2.15" for logs.
  std::string DescribeLocal() const;

  // Runs once from the destructor, after the memory was deregistered (the
  // hub's locked-memory accounting).
  void SetReleaseHook(std::function<void()> hook) { release_hook_ = std::move(hook); }

  // Testing only (fault injection): the next frame is written with this rkey
  // xor-ed in and this many bytes added to its remote offset. Lets tests play a
  // client with a bogus rkey / offset; never set in production code.
  // `imm` (if not kNoFault) replaces the immediate (a bogus slot index).
  static constexpr uint32_t kNoFault = UINT32_MAX;
  void InjectFaultForTesting(uint32_t rkey_xor, uint64_t offset_add, uint32_t imm = kNoFault) {
    fault_rkey_xor_ = rkey_xor;
    fault_offset_add_ = offset_add;
    fault_imm_ = imm;
  }

 private:
  struct SentRecord {
    uint64_t stage_end;  // staging ring head after this WR (monotonic slots)
    size_t bytes;
    bool close_after;
    bool credit;
  };
  explicit Channel(const ChannelOptions& options);
  std::shared_ptr<Channel> self() { return std::static_pointer_cast<Channel>(shared_from_this()); }
  Status CreateResources(rdma_cm_id* id);
  void WatchCq();
  void WatchCm();
  void OnCqReadable();
  void OnCmReadable();
  void PollRound();
  void ArmAndDrain();
  // Polls until the CQ is empty; returns the completions handled.
  size_t Drain();
  void Handle(const ibv_wc& wc);
  void OnFrameWritten(uint32_t slot);
  // Hands the frame at `slot` (header `h`, checked on arrival) to on_frame,
  // then counts `consume` slots (its own and a skipped tail before it) as
  // consumed.
  void Deliver(uint32_t slot, uint32_t consume, const FrameHeader& h);
  void DeliverHeld();
  void OnCredit(uint32_t value);
  void PumpSends() override;
  void OnDetach() override;
  void OnClose() override;
  bool TryPost(OutgoingFrame& frame);
  void MaybeReportCredit();
  bool PostRecv(size_t count);

  const ChannelOptions options_;
  rdma_event_channel* cm_channel_ = nullptr;
  rdma_cm_id* id_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* comp_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_mr* rx_mr_ = nullptr;
  ibv_mr* tx_mr_ = nullptr;
  std::unique_ptr<std::byte, void (*)(void*)> rx_;  // receive ring (page aligned)
  std::unique_ptr<std::byte, void (*)(void*)> tx_;  // send staging ring
  uint32_t slots_ = 0;       // of our rings
  uint32_t sq_depth_ = 0;
  uint32_t rq_depth_ = 0;
  uint32_t cq_events_unacked_ = 0;
  RingDescriptor peer_;

  std::unique_ptr<boost::asio::posix::stream_descriptor> cq_fd_;
  std::unique_ptr<boost::asio::posix::stream_descriptor> cm_fd_;
  std::vector<ibv_wc> backlog_;  // polled while detaching, handled on Attach
  bool busy_scheduled_ = false;
  std::chrono::steady_clock::time_point last_activity_;

  // Receive side.
  uint32_t rx_next_ = 0;       // slot the next frame should start at
  uint64_t rx_consumed_ = 0;   // slots consumed (including skipped tails)
  uint64_t rx_reported_ = 0;   // last consumed count sent to the peer
  bool credit_in_flight_ = false;
  bool delivery_paused_ = false;
  bool deliver_posted_ = false;
  struct HeldFrame {
    uint32_t slot;
    uint32_t consume;
    FrameHeader header;  // as checked on arrival (the ring is peer-writable)
  };
  std::deque<HeldFrame> held_;  // arrived while paused, in ring order
  // Send side.
  uint64_t tx_head_ = 0;         // peer-ring slots written or skipped
  uint64_t peer_consumed_ = 0;   // as last reported by the peer
  uint64_t stage_head_ = 0;      // staging slots used
  uint64_t stage_tail_ = 0;      // staging slots free again
  uint32_t sq_outstanding_ = 0;
  std::deque<SentRecord> sent_;
  std::function<void()> release_hook_;
  uint32_t fault_rkey_xor_ = 0;
  uint64_t fault_offset_add_ = 0;
  uint32_t fault_imm_ = kNoFault;
};

}  // namespace rackhub::net::rdma
