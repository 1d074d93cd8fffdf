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
// the link's share goes to the others) while that is above `lead_bytes`,
// until it is down to half of it.
//
// A hold never lasts without progress: a connection whose hold is older
// than kMaxHold (pushes in different orders, a worker that stopped), or
// whose tenant has every connection of this lane held at once (each waits
// for another rack, or for a chunk the others push later), is released and
// exempt until its bytes are down to half of `lead_bytes` (then an update
// it waited for was answered: the workers are in step again).
//
// Ownership: the lane's WorkerProtocol owns it; Charges share their
// account (a Waiter may outlive its connection).
// Threading: the lane thread only.
#pragma once

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

  std::weak_ptr<net::Connection> conn_;
  const size_t lead_bytes_;
  size_t bytes_ = 0;
  bool holding_ = false;
  bool exempt_ = false;  // released without progress: no hold until half
  std::chrono::steady_clock::time_point held_since_;
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
  // A hold older than this is released (and the connection exempt).
  static constexpr auto kMaxHold = std::chrono::milliseconds(100);

  // lead_bytes 0: never holds (Charge returns empty charges).
  explicit IntakePacer(size_t lead_bytes) : lead_bytes_(lead_bytes) {}

  // `bytes` of `conn`'s push wait for an update; may hold its intake.
  IntakeCharge Charge(net::Connection& conn, size_t bytes);
  // After a Charge of `conn`: if it holds and so does every connection of
  // `peers` (its tenant's connections on this lane, by member), releases
  // them all (exempt).
  template <typename Conns>
  void ReleaseIfAllHeld(const net::Connection& conn, const Conns& peers) {
    const auto self = accounts_.find(&conn);
    if (self == accounts_.end() || !self->second->holding()) return;
    for (const auto& [member, conn] : peers) {
      const auto it = accounts_.find(conn.get());
      if (it == accounts_.end() || !it->second->holding()) return;
    }
    for (const auto& [member, conn] : peers) accounts_.at(conn.get())->Release(true);
  }
  // From the lane's periodic check: releases holds older than kMaxHold.
  void ReleaseStale(std::chrono::steady_clock::time_point now);
  // The connection closed: its account leaves (charges still held by
  // waiters keep it until they go; it holds nothing any more).
  void Forget(const net::Connection& conn);

 private:
  const size_t lead_bytes_;
  std::map<const net::Connection*, std::shared_ptr<IntakeAccount>> accounts_;
};

}  // namespace rackhub::server
