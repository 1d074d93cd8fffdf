#include "rackhub/net/rdma/channel.h"

#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <algorithm>
#include <cstring>

#include "channel_internal.h"

// The data path of a Channel: completion handling, the ring protocol and
// credits (see channel.h); set-up and teardown are in channel_setup.cc.
namespace rackhub::net::rdma {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using internal::Errno;

namespace {

// Bit 31 of an immediate marks a credit report; frames use bits 0..30 for the
// slot index (so a ring has at most 2^31 slots; kMaxRingBytes keeps far below).
constexpr uint32_t kCreditFlag = 1u << 31;
constexpr uint32_t kCreditMask = kCreditFlag - 1;
// Completions taken per ibv_poll_cq(3) call.
constexpr int kPollBatch = 32;
// ibv_ack_cq_events(3) takes a mutex: acknowledge CQ events in batches.
constexpr uint32_t kCqEventAckBatch = 64;
// Busy polling keeps spinning this long after the last completion, then
// backs off to completion events.
constexpr auto kBusyPollWindow = std::chrono::microseconds(200);

uint32_t SlotsFor(size_t bytes) {
  return static_cast<uint32_t>((bytes + kSlotBytes - 1) / kSlotBytes);
}

}  // namespace

void Channel::Attach(asio::io_context& io, Callbacks callbacks) {
  SetAttached(io, std::move(callbacks));
  cq_fd_ = std::make_unique<asio::posix::stream_descriptor>(io, comp_->fd);
  cm_fd_ = std::make_unique<asio::posix::stream_descriptor>(io, cm_channel_->fd);
  auto keep = shared_from_this();
  std::vector<ibv_wc> backlog;
  backlog.swap(backlog_);
  for (size_t i = 0; i < backlog.size(); ++i) {
    if (io_ != &io) {  // detached again inside a callback
      backlog_.insert(backlog_.end(), backlog.begin() + static_cast<ptrdiff_t>(i), backlog.end());
      return;
    }
    Handle(backlog[i]);
  }
  if (io_ != &io) return;
  ArmAndDrain();
  if (io_ != &io) return;
  WatchCq();
  WatchCm();
}

// Completions not yet handled are kept for the next Attach.
void Channel::OnDetach() {
  if (cq_fd_) cq_fd_->release();  // cancels the pending wait; the fd stays open
  if (cm_fd_) cm_fd_->release();
  cq_fd_.reset();
  cm_fd_.reset();
}

void Channel::WatchCq() {
  if (!cq_fd_ || closed_) return;
  WatchReadable(*cq_fd_, &Channel::OnCqReadable);
}

void Channel::WatchCm() {
  if (!cm_fd_) return;
  WatchReadable(*cm_fd_, &Channel::OnCmReadable);
}

void Channel::OnCqReadable() {
  // ibv_get_cq_event(3) on the non-blocking channel: take every pending event.
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  while (ibv_get_cq_event(comp_, &cq, &context) == 0) ++cq_events_unacked_;
  if (cq_events_unacked_ >= kCqEventAckBatch) {
    ibv_ack_cq_events(cq_, cq_events_unacked_);
    cq_events_unacked_ = 0;
  }
  const uint64_t gen = attach_gen_;
  if (options_.poll == PollMode::kBusy) {
    last_activity_ = Clock::now();
    if (!busy_scheduled_) PollRound();
  } else {
    ArmAndDrain();
  }
  if (gen == attach_gen_) WatchCq();
}

void Channel::ArmAndDrain() {
  // Arm first, then poll: a completion that lands in between still raises an
  // event (ibv_req_notify_cq(3)).
  if (!closed_) ibv_req_notify_cq(cq_, 0);
  Drain();
}

void Channel::PollRound() {
  busy_scheduled_ = false;
  if (!io_ || closed_) return;
  if (Drain() > 0) last_activity_ = Clock::now();
  if (!io_ || closed_) return;
  if (Clock::now() - last_activity_ < kBusyPollWindow) {
    busy_scheduled_ = true;
    asio::post(*io_, [self = self(), gen = attach_gen_] {
      if (gen == self->attach_gen_) self->PollRound();
      else self->busy_scheduled_ = false;
    });
  } else {
    ArmAndDrain();  // back off: sleep on the completion channel
  }
}

size_t Channel::Drain() {
  auto keep = shared_from_this();  // callbacks may drop the owner's reference
  asio::io_context* io = io_;
  size_t total = 0;
  ibv_wc wc[kPollBatch];
  while (io_ == io && io) {
    const int n = ibv_poll_cq(cq_, kPollBatch, wc);
    if (n < 0) {
      Close("ibv_poll_cq failed");
      break;
    }
    if (n == 0) break;
    total += static_cast<size_t>(n);
    for (int i = 0; i < n; ++i) {
      if (io_ != io) {  // detached by a callback: keep the rest for the next owner
        backlog_.insert(backlog_.end(), wc + i, wc + n);
        break;
      }
      Handle(wc[i]);
    }
  }
  if (io_ == io && io) {
    PumpSends();
    MaybeReportCredit();
  }
  return total;
}

void Channel::Handle(const ibv_wc& wc) {
  if (closed_) return;  // flushed work requests after Close
  if (wc.status != IBV_WC_SUCCESS) {
    Close(std::string("RDMA completion failed: ") + ibv_wc_status_str(wc.status) +
          (wc.opcode & IBV_WC_RECV ? " (receive)" : " (send)"));
    return;
  }
  if (wc.opcode & IBV_WC_RECV) {
    if (!PostRecv(1)) {
      Close(Errno("ibv_post_recv"));
      return;
    }
    const uint32_t imm = ntohl(wc.imm_data);
    if (!(wc.wc_flags & IBV_WC_WITH_IMM)) {
      Violation("a receive without an immediate");
    } else if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && !(imm & kCreditFlag)) {
      OnFrameWritten(imm);
    } else if (wc.opcode == IBV_WC_RECV && (imm & kCreditFlag)) {
      OnCredit(imm & kCreditMask);
    } else {
      Violation("unexpected immediate 0x" + std::to_string(imm));
    }
    return;
  }
  // Send side: RC completes work requests in posting order (ibv_poll_cq(3)).
  if (sent_.empty()) return;
  const SentRecord rec = sent_.front();
  sent_.pop_front();
  --sq_outstanding_;
  stage_tail_ = rec.stage_end;
  if (rec.credit) {
    credit_in_flight_ = false;
  } else if (cb_.on_sent) {
    cb_.on_sent(rec.bytes);
  }
  if (rec.close_after) Close("closed after a fatal error");
}

void Channel::OnFrameWritten(uint32_t slot) {
  if (violated_) return;
  if (slot >= slots_) {
    return Violation("immediate names slot " + std::to_string(slot) + " of a " +
                     std::to_string(slots_) + "-slot ring");
  }
  uint32_t skipped = 0;
  if (slot != rx_next_) {
    if (slot != 0) {
      return Violation("frame at slot " + std::to_string(slot) + ", expected slot " +
                       std::to_string(rx_next_) + " (frames are written in ring order)");
    }
    skipped = slots_ - rx_next_;  // the sender skipped the tail
    rx_next_ = 0;
  }
  const std::byte* base = rx_.get() + size_t{slot} * kSlotBytes;
  const FrameHeader h = DecodeHeader(std::span<const std::byte, kHeaderBytes>(base, kHeaderBytes));
  const uint64_t room = uint64_t{slots_ - slot} * kSlotBytes;
  if (uint64_t{h.payload_bytes} + kHeaderBytes > room) {
    return Violation("a frame of " + std::to_string(h.payload_bytes) + " payload bytes at slot " +
                     std::to_string(slot) + " overruns the ring (" + std::to_string(room) +
                     " bytes left)");
  }
  const uint32_t n = SlotsFor(kHeaderBytes + size_t{h.payload_bytes});
  rx_next_ = slot + n == slots_ ? 0 : slot + n;
  if (delivery_paused_ || !held_.empty()) {
    held_.push_back({slot, skipped + n, h});  // stays in the ring, unconsumed
    return;
  }
  Deliver(slot, skipped + n, h);
}

void Channel::Deliver(uint32_t slot, uint32_t consume, const FrameHeader& h) {
  const std::byte* base = rx_.get() + size_t{slot} * kSlotBytes;
  // A copy: the callback may detach or close the channel, which clears cb_.
  if (auto on_frame = cb_.on_frame) {
    on_frame(h, std::span<const std::byte>(base + kHeaderBytes, h.payload_bytes));
  }
  // Consumed: the handler copied or used the payload during the call.
  rx_consumed_ += consume;
}

void Channel::PauseDelivery(bool on) {
  delivery_paused_ = on;
  if (on || held_.empty() || deliver_posted_ || !io_) return;
  deliver_posted_ = true;
  asio::post(*io_, [self = self(), gen = attach_gen_] {
    self->deliver_posted_ = false;
    if (gen == self->attach_gen_) self->DeliverHeld();
  });
}

void Channel::DeliverHeld() {
  while (!held_.empty() && !delivery_paused_ && !closed_ && !violated_ && io_) {
    const HeldFrame f = held_.front();
    held_.pop_front();
    Deliver(f.slot, f.consume, f.header);
  }
  if (io_ && !closed_) {
    PumpSends();
    MaybeReportCredit();
  }
}

void Channel::OnCredit(uint32_t value) {
  const uint64_t delta = (value - (peer_consumed_ & kCreditMask)) & kCreditMask;
  if (peer_consumed_ + delta > tx_head_) {
    return Violation("credit report beyond the slots written");
  }
  peer_consumed_ += delta;
}

void Channel::MaybeReportCredit() {
  if (closed_ || credit_in_flight_ || rx_consumed_ == rx_reported_ ||
      sq_outstanding_ >= sq_depth_) {
    return;
  }
  // Zero-length SEND WITH IMM: consumes one posted receive at the peer and
  // carries the consumed count in the immediate (ibv_post_send(3)).
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.num_sge = 0;
  wr.imm_data = htonl(kCreditFlag | static_cast<uint32_t>(rx_consumed_ & kCreditMask));
  if (ibv_post_send(id_->qp, &wr, &bad) != 0) {
    Close(Errno("ibv_post_send(credit)"));
    return;
  }
  ++sq_outstanding_;
  sent_.push_back({stage_head_, 0, false, true});
  rx_reported_ = rx_consumed_;
  credit_in_flight_ = true;
}

void Channel::PumpSends() {
  while (OutgoingFrame* f = NextToSend()) {
    if (!TryPost(*f)) break;
    // A frame that cannot fit, or a failed post, closed the channel, and
    // closing emptied the queue: nothing is left to pop.
    if (closed_) return;
    queue_.pop_front();
  }
}

bool Channel::TryPost(OutgoingFrame& f) {
  const std::span<const std::byte> payload =
      f.owned.empty() ? f.borrowed
                      : std::span<const std::byte>(reinterpret_cast<const std::byte*>(f.owned.data()),
                                                   f.owned.size());
  const size_t total = kHeaderBytes + payload.size();
  const uint32_t n = SlotsFor(total);
  if (n > peer_.slots || n > slots_) {
    // Close releases every queued frame's buffer, this one's too.
    Close("a frame of " + std::to_string(total) + " bytes does not fit the RDMA ring (" +
          std::to_string(uint64_t{std::min(peer_.slots, slots_)} * kSlotBytes) +
          " bytes); raise the RDMA ring size");
    return true;
  }
  // One send WR stays free for the credit report.
  if (sq_outstanding_ + 1 >= sq_depth_) return false;
  const uint32_t ridx = static_cast<uint32_t>(tx_head_ % peer_.slots);
  const uint32_t rskip = ridx + n > peer_.slots ? peer_.slots - ridx : 0;
  if (tx_head_ + rskip + n - peer_consumed_ > peer_.slots) return false;  // no credit
  const uint32_t sidx = static_cast<uint32_t>(stage_head_ % slots_);
  const uint32_t sskip = sidx + n > slots_ ? slots_ - sidx : 0;
  if (stage_head_ + sskip + n - stage_tail_ > slots_) return false;  // staging full
  const uint32_t rslot = rskip ? 0 : ridx;
  std::byte* dst = tx_.get() + size_t{sskip ? 0 : sidx} * kSlotBytes;
  std::memcpy(dst, f.header.data(), kHeaderBytes);
  if (!payload.empty()) std::memcpy(dst + kHeaderBytes, payload.data(), payload.size());
  f.owner.reset();  // the payload is staged: its owner may let it go
  if (f.release) {
    f.release();  // the payload is staged: the caller's buffer is free again
    f.release = nullptr;
  }
  ibv_sge sge{reinterpret_cast<uint64_t>(dst), static_cast<uint32_t>(total), tx_mr_->lkey};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.imm_data = htonl(fault_imm_ == kNoFault ? rslot : fault_imm_);
  wr.wr.rdma.remote_addr = peer_.addr + uint64_t{rslot} * kSlotBytes + fault_offset_add_;
  wr.wr.rdma.rkey = peer_.rkey ^ fault_rkey_xor_;
  fault_offset_add_ = 0;
  fault_rkey_xor_ = 0;
  fault_imm_ = kNoFault;
  if (ibv_post_send(id_->qp, &wr, &bad) != 0) {
    Close(Errno("ibv_post_send"));
    return true;
  }
  tx_head_ += rskip + n;
  stage_head_ += sskip + n;
  ++sq_outstanding_;
  sent_.push_back({stage_head_, total, f.close_after, false});
  return true;
}

void Channel::OnCmReadable() {
  auto keep = shared_from_this();
  const uint64_t gen = attach_gen_;
  rdma_cm_event* ev = nullptr;
  while (rdma_get_cm_event(cm_channel_, &ev) == 0) {
    const rdma_cm_event_type type = ev->event;
    rdma_ack_cm_event(ev);  // before anything that might destroy the id
    switch (type) {
      case RDMA_CM_EVENT_DISCONNECTED:
        Close("the peer disconnected (rdma_cm DISCONNECTED)");
        break;
      case RDMA_CM_EVENT_DEVICE_REMOVAL:
        Close("the RDMA device was removed");
        break;
      case RDMA_CM_EVENT_CONNECT_ERROR:
      case RDMA_CM_EVENT_UNREACHABLE:
        Close(std::string("rdma_cm: ") + rdma_event_str(type));
        break;
      default:  // ESTABLISHED, TIMEWAIT_EXIT: nothing to do
        break;
    }
  }
  if (gen == attach_gen_) WatchCm();
}

void Channel::OnClose() {
  held_.clear();
  // rdma_disconnect(3): moves the QP to the error state (outstanding work
  // requests flush) and tells the peer (its DISCONNECTED event).
  if (id_) rdma_disconnect(id_);
}

}  // namespace rackhub::net::rdma
