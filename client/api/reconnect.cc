// Client::Impl: reconnecting every lane after a break (client.h,
// "Reconnect"), over whatever transport the options choose, as Connect does.
// The dialing runs on reconnect_thread_ (the same DialAll as Connect, its
// handshakes blocking there); the handshaken lanes are handed to the I/O
// thread, where AdoptReconnect compares the new WELCOME with what the client
// knew, marks the keys whose version moved ("resync needed"), adopts the
// lanes and re-sends the pending tickets.
#include <algorithm>
#include <unordered_map>
#include <utility>

#include "client_impl.h"
#include "dialer.h"
#include "lane.h"
#include "rackhub/data/v1/control.pb.h"
#include "wire.h"

namespace rackhub::client {

using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kFirstBackoff = std::chrono::milliseconds(50);
constexpr auto kMaxBackoff = std::chrono::milliseconds(1000);
// One attempt's handshakes (all lanes) get at most this long.
constexpr auto kMaxAttempt = std::chrono::milliseconds(5000);

}  // namespace

void Client::Impl::ReconnectLoop(uint64_t generation) {
  auto backoff = std::chrono::duration_cast<Clock::duration>(kFirstBackoff);
  for (;;) {
    {
      std::lock_guard lock(reconnect_mu_);
      if (reconnect_cancel_) return;
    }
    const auto deadline =
        Clock::now() + std::min<Clock::duration>(options_.connect_timeout, kMaxAttempt);
    auto dialed = std::make_shared<internal::DialedLanes>();
    const Error e = DialAll(deadline, &reconnect_abort_, dialed.get());
    if (e.ok()) {
      asio::post(io_, [this, generation, dialed = std::move(dialed)]() mutable {
        AdoptReconnect(generation, std::move(dialed));
      });
      return;
    }
    if (e.code == ErrorCode::kUnauthenticated) {
      // The hub is up and does not know the tenant or token (deleted, or a
      // restarted in-memory hub): retrying cannot help.
      asio::post(io_, [this, generation, why = e.message] {
        if (generation == reconnect_generation_) GiveUpReconnect("the hub refused us: " + why);
      });
      return;
    }
    std::unique_lock lock(reconnect_mu_);
    reconnect_error_ = e.message;
    if (reconnect_cv_.wait_for(lock, backoff, [&] { return reconnect_cancel_; })) return;
    backoff = std::min<Clock::duration>(backoff * 2, kMaxBackoff);
  }
}

void Client::Impl::StopReconnectThread() {
  if (!reconnect_thread_.joinable()) return;
  {
    std::lock_guard lock(reconnect_mu_);
    reconnect_cancel_ = true;
  }
  reconnect_abort_ = true;
  reconnect_cv_.notify_all();
  reconnect_thread_.join();
}

void Client::Impl::GiveUpReconnect(const std::string& why) {
  if (!reconnecting_) return;
  reconnecting_ = false;
  if (reconnect_timer_) reconnect_timer_->cancel();
  std::string last;
  {
    std::lock_guard lock(reconnect_mu_);
    reconnect_cancel_ = true;
    last = reconnect_error_;
  }
  reconnect_abort_ = true;
  reconnect_cv_.notify_all();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - break_time_);
  Broken("connection to the hub lost: " + break_reason_ + "; reconnecting failed (" + why +
         ", gave up after " + std::to_string(ms.count()) + " ms)" +
         (last.empty() ? std::string() : ": " + last));
}

void Client::Impl::AdoptReconnect(uint64_t generation,
                                  std::shared_ptr<internal::DialedLanes> dialed) {
  // Dropping `dialed` without adopting closes its links.
  if (!reconnecting_ || generation != reconnect_generation_ || closing_io_) return;
  StopReconnectThread();  // it returned right after posting this
  const auto fail = [&](const std::string& why) { GiveUpReconnect(why); };
  std::vector<data::v1::Welcome> parsed(dialed->lanes.size());
  for (size_t i = 0; i < parsed.size(); ++i) {
    if (!parsed[i].ParseFromString(dialed->lanes[i].body)) return fail("a WELCOME does not parse");
  }
  const data::v1::Welcome& w0 = parsed[0];
  if (w0.lanes() != lane_count_ || w0.chunk_elements() != chunk_elements_) {
    return fail("the hub came back with " + std::to_string(w0.lanes()) + " lanes and " +
                std::to_string(w0.chunk_elements()) + " elements per chunk, the client had " +
                std::to_string(lane_count_) + " and " + std::to_string(chunk_elements_));
  }
  for (const auto& w : parsed) {
    if (w.tenant_handle() != w0.tenant_handle() || w.lanes() != w0.lanes() ||
        w.chunk_elements() != w0.chunk_elements()) {
      return fail("the lanes' WELCOMEs disagree (tenant handle, lanes or chunk size)");
    }
  }
  tenant_handle_ = w0.tenant_handle();
  workers_ = w0.workers();
  straggler_timeout_ms_ = w0.straggler_timeout_ms();
  // A tenant spanning racks whose hub restarted: its keys' values at a
  // version may differ from what this client had at that version (a cluster
  // checkpoint restored, then a skipped step): every key is Pulled again.
  const bool restarted = hub_incarnation_ != 0 && w0.incarnation() != hub_incarnation_;
  hub_incarnation_ = w0.incarnation();

  {
    std::lock_guard lock(mu_);
    std::unordered_map<std::string, KeyInfo> hub_keys;
    for (const auto& entry : w0.keys()) {
      Result<KeyInfo> info = internal::ToKeyInfo(entry, chunk_elements_);
      if (info.ok()) hub_keys.emplace(info->name, *info);
    }
    for (auto& [id, k] : keys_) {
      const auto it = hub_keys.find(k.info.name);
      if (it == hub_keys.end() || it->second.id != id || it->second.elements != k.info.elements ||
          it->second.dtype != k.info.dtype || it->second.first_chunk != k.info.first_chunk ||
          it->second.chunk_count != k.info.chunk_count) {
        k.gone = true;
        continue;
      }
      const uint64_t hub_version = it->second.version;
      const uint64_t was = k.info.next_iteration;
      k.info.version = hub_version;
      if (hub_version != was || restarted) {
        Error e = MakeError(
            ErrorCode::kRolledBack,
            hub_version < was
                ? "hub restarted: key '" + k.info.name + "' rolled back to iteration " +
                      std::to_string(hub_version) + " (was " + std::to_string(was) + ")"
            : hub_version > was
                ? "hub reconnected: key '" + k.info.name + "' is at iteration " +
                      std::to_string(hub_version) + " (was " + std::to_string(was) + ")"
                : "hub restarted: key '" + k.info.name + "' is at iteration " +
                      std::to_string(hub_version) +
                      " again, perhaps with other values (a cluster checkpoint restored): Pull it");
        e.iteration = hub_version;
        k.info.next_iteration = hub_version;
        MarkResync(k, std::move(e));
      }
    }
    for (const auto& [name, info] : hub_keys) {
      if (keys_.find(info.id) == keys_.end()) ImportKey(info);
    }
  }

  // The new lanes replace the old ones (kept: their aborted handlers may
  // still be queued).
  std::vector<std::unique_ptr<internal::Lane>> lanes = AdoptLanes(std::move(*dialed));
  if (lanes.empty()) return fail("adopting a reconnected lane failed");
  for (auto& lane : lanes_) retired_lanes_.push_back(std::move(lane));
  lanes_ = std::move(lanes);
  reconnecting_ = false;
  if (reconnect_timer_) reconnect_timer_->cancel();
  ++reconnects_;

  // Re-send what was pending (in ticket order); a PushPull on a key that
  // moved fails with kRolledBack instead.
  for (const OperationPtr& op : UnfinishedOps()) {
    if (!op->started || op->failed || op->finished) continue;
    if (Error e = KeyAllowsSend(*op); !e.ok()) {
      FailOp(op, std::move(e));
      continue;
    }
    Send(op);
  }
}

}  // namespace rackhub::client
