#include "intake_pacer.h"

#include <algorithm>
#include <utility>

namespace rackhub::server {

void IntakeAccount::Add(size_t bytes) {
  bytes_ += bytes;
  if (holding_ || exempt_ || bytes_ <= lead_bytes_) return;
  auto conn = conn_.lock();
  if (!conn || !conn->open()) return;
  holding_ = true;
  progress_at_ = std::chrono::steady_clock::now();
  held_since_ = progress_at_;
  progressed_ = false;  // answers before the hold are not its progress
  conn->HoldIntake(true);
}

void IntakeAccount::Sub(size_t bytes) {
  bytes_ -= std::min(bytes, bytes_);
  if (bytes_ > lead_bytes_ / 2) {
    progressed_ = true;  // catching up
    return;
  }
  exempt_ = false;
  if (holding_) Release(false);
}

void IntakeAccount::Release(bool exempt) {
  exempt_ = exempt_ || exempt;
  if (!holding_) return;
  holding_ = false;
  if (auto conn = conn_.lock()) conn->HoldIntake(false);
}

void IntakeAccount::Detach() {
  holding_ = false;
  conn_.reset();
}

IntakeCharge::IntakeCharge(std::shared_ptr<IntakeAccount> account, size_t bytes)
    : account_(std::move(account)), bytes_(bytes) {
  if (account_) account_->Add(bytes_);
}

IntakeCharge& IntakeCharge::operator=(IntakeCharge&& other) noexcept {
  if (this != &other) {
    Drop();
    account_ = std::move(other.account_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void IntakeCharge::Drop() {
  if (account_) account_->Sub(bytes_);
  account_.reset();
  bytes_ = 0;
}

IntakePacer::~IntakePacer() {
  for (auto& [conn, account] : accounts_) account->Detach();
}

IntakeCharge IntakePacer::Charge(net::Connection& conn, size_t bytes, size_t min_lead) {
  if (lead_bytes_ == 0 || !conn.can_hold_intake()) return {};
  auto& account = accounts_[&conn];
  // (A connection at the address of a closed one that was never forgotten
  // gets an account of its own.)
  if (!account || account->conn_.lock().get() != &conn) {
    account = std::make_shared<IntakeAccount>(conn.weak_from_this(),
                                              std::max(lead_bytes_, min_lead));
  }
  return IntakeCharge(account, bytes);
}

bool IntakePacer::holding(const net::Connection& conn) const {
  const auto it = accounts_.find(&conn);
  return it != accounts_.end() && it->second->holding();
}

bool IntakePacer::any_holding() const {
  return std::any_of(accounts_.begin(), accounts_.end(),
                     [](const auto& a) { return a.second->holding(); });
}

void IntakePacer::ReleaseStale(std::chrono::steady_clock::time_point now) {
  for (auto& [conn, account] : accounts_) {
    if (!account->holding()) continue;
    if (std::exchange(account->progressed_, false)) account->progress_at_ = now;
    if (now - account->held_since_ >= max_age_ || now - account->progress_at_ >= max_hold_) {
      account->Release(true);
    }
  }
}

void IntakePacer::Forget(const net::Connection& conn) {
  const auto it = accounts_.find(&conn);
  if (it == accounts_.end()) return;
  it->second->Detach();  // the connection is gone: nothing to release
  accounts_.erase(it);
}

}  // namespace rackhub::server
