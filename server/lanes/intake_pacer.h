// IntakePacer: keeps one lane's worker connections in step on the hub's side
// (docs/architecture.md, "Workers in step"). A synchronous chunk completes
// only when every worker pushed it, so a worker whose pushes the lane reads
// ahead of the others gains nothing: its pushes only wait, while the link
// they share (the hub's, or a switch's) is taken from the workers the
// update waits for. The pacer counts, per connection, the payload bytes of
// its pushes counted in updates still under way here (a Charge held by the
// push's Waiter: released when the update is answered or fails, whatever
// the path), and holds the connection's intake (net::Connection::
// HoldIntake: TCP stops reading, the worker's flow control slows it, and
// the link's share goes to the others) while that is above its lead, until
// it is down to half of it. Connections that cannot hold (shared memory,
// RDMA: a ring bounds them already) are not counted.
//
// A hold never lasts without progress. A hold whose updates keep being
// answered stays: the others are catching up, which is what it is for. A
// connection held for max_hold without any of the updates it waits for
// being answered (the worker they wait for stalled: its TCP flow paused,
// its process descheduled, or it died, or the workers push in different
// orders), or held for max_age (<= half the straggler timeout, so a
// worker is never held into a straggler), or whose tenant has every
// connection of this lane held at once (each waits for another rack, or
// for a chunk the others push later), is released and exempt until its
// bytes are down to half of its lead (then the workers are in step again).
// (Exempt until half, not only until the next answer. That was tried: a
// worker that did not read its replies was held again at the first answer,
// its send backlog's pause (net::SendLimits) came on top, and the pushes it
// still had in its socket, which the others' updates waited for, were
// never read: reply_queue_test.)
//
// Ownership: the lane's WorkerProtocol owns it; Charges share their
// account (a Waiter may outlive its connection and the pacer: a charge
// dropped after the pacer is gone touches nothing but its account).
// Threading: the lane thread only.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <map>
#include <memory>

#include "rackhub/net/transport.h"

namespace rackhub::server {

class IntakePacer;

// One connection's bytes counted in updates under way (lane thread).
class IntakeAccount {
 public:
  IntakeAccount(std::weak_ptr<net::Connection> conn, size_t lead_bytes)
      : conn_(std::move(conn)), lead_bytes_(lead_bytes) {}
  size_t bytes() const { return bytes_; }
  bool holding() const { return holding_; }

 private:
  friend class IntakePacer;
  friend class IntakeCharge;
  void Add(size_t bytes);
  void Sub(size_t bytes);
  void Release(bool exempt);
  void Detach();

  std::weak_ptr<net::Connection> conn_;
  const size_t lead_bytes_;
  size_t bytes_ = 0;
  bool holding_ = false;
  bool exempt_ = false;  // released without progress: no hold until half
  std::chrono::steady_clock::time_point held_since_;
  // When the hold last made progress (an update it waited for answered), as
  // seen by ReleaseStale's checks: the hold's start, or the check that saw
  // it (so a hold without progress goes after max_hold to max_hold * 5/4).
  std::chrono::steady_clock::time_point progress_at_;
  bool progressed_ = false;  // an answer since the last check
};

// A push's bytes in its connection's account, for as long as it waits
// (a Waiter member). Move-only; empty (no account) when not paced.
class IntakeCharge {
 public:
  IntakeCharge() = default;
  IntakeCharge(std::shared_ptr<IntakeAccount> account, size_t bytes);
  IntakeCharge(IntakeCharge&& other) noexcept { *this = std::move(other); }
  IntakeCharge& operator=(IntakeCharge&& other) noexcept;
  ~IntakeCharge() { Drop(); }

 private:
  void Drop();
  std::shared_ptr<IntakeAccount> account_;
  size_t bytes_ = 0;
};

class IntakePacer {
 public:
  // A hold without progress (no update it waits for answered) for this
  // long is released (and exempt until half); a hold is released after
  // kMaxAge whatever happens. Less with a short straggler timeout (a
  // quarter and a half of it), so that a worker is never held into a
  // straggler.
  static constexpr auto kMaxHold = std::chrono::milliseconds(100);
  static constexpr auto kMaxAge = std::chrono::milliseconds(1000);

  // lead_bytes 0: never holds (Charge returns empty charges).
  IntakePacer(size_t lead_bytes, std::chrono::milliseconds straggler_timeout)
      : lead_bytes_(lead_bytes),
        max_hold_(std::min<std::chrono::milliseconds>(kMaxHold, straggler_timeout / 4)),
        max_age_(std::min<std::chrono::milliseconds>(kMaxAge, straggler_timeout / 2)) {}
  ~IntakePacer();
  IntakePacer(const IntakePacer&) = delete;
  IntakePacer& operator=(const IntakePacer&) = delete;

  // `bytes` of `conn`'s push wait for an update; may hold its intake. The
  // connection's lead is the setting, at least `min_lead` (a few of its
  // tenant's chunks: one push must not hold it on its own).
  IntakeCharge Charge(net::Connection& conn, size_t bytes, size_t min_lead);
  bool holding(const net::Connection& conn) const;
  bool any_holding() const;
  // If every connection of `peers` (one tenant's connections on this lane,
  // by member; at least one) is held, releases them all (exempt until
  // half): none of them can be what the others wait for.
  template <typename Conns>
  void ReleaseIfAllHeld(const Conns& peers) {
    if (peers.empty()) return;
    for (const auto& [member, conn] : peers) {
      if (!holding(*conn)) return;
    }
    for (const auto& [member, conn] : peers) accounts_.at(conn.get())->Release(true);
  }
  // Releases the holds without progress for max_hold and those older than
  // max_age (call every max_hold / 4 while any_holding()).
  void ReleaseStale(std::chrono::steady_clock::time_point now);
  std::chrono::milliseconds max_hold() const { return max_hold_; }
  std::chrono::milliseconds max_age() const { return max_age_; }
  // The connection closed: its account leaves (charges still held by
  // waiters keep it until they go; it holds nothing any more).
  void Forget(const net::Connection& conn);

 private:
  const size_t lead_bytes_;
  const std::chrono::milliseconds max_hold_;
  const std::chrono::milliseconds max_age_;
  std::map<const net::Connection*, std::shared_ptr<IntakeAccount>> accounts_;
};

}  // namespace rackhub::server
