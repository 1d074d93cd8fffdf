#include "rows_reply.h"

#include <cstring>
#include <string>

#include "element_type.h"

namespace rackhub::server {

void SendTableRows(net::Connection& conn, const LaneTenant& t, const Chunk& c,
                   const std::vector<uint64_t>& ids, uint64_t request_id) {
  const aggregation::RowShard& r = *c.rows;
  net::FrameHeader h = c.Header(net::Opcode::kRows, t.info.handle, r.version());
  h.request_id = request_id;
  std::string payload(net::kRowsPrefixBytes + ids.size() * r.dim() * net::DTypeBytes(c.dtype),
                      '\0');
  const uint32_t count = static_cast<uint32_t>(ids.size());
  std::memcpy(payload.data(), &count, 4);
  r.ReadRows(ids, payload.data() + net::kRowsPrefixBytes, ElementTypeOf(c.dtype));
  conn.SendOwned(h, std::move(payload));
}

void AnswerRowPushes(const LaneTenant& t, Chunk& c) {
  std::vector<Waiter> waiters;
  waiters.swap(c.pushes);
  for (const Waiter& w : waiters) {
    const auto wc = w.conn.lock();
    if (wc && wc->open()) SendTableRows(*wc, t, c, w.want, w.request_id);
  }
}

void AnswerRowPulls(const LaneTenant& t, Chunk& c) {
  std::vector<Waiter> pulls;
  pulls.swap(c.pulls);
  for (const Waiter& w : pulls) {
    if (auto wc = w.conn.lock(); wc && wc->open()) {
      wc->Unreserve(w.reserved);
      SendTableRows(*wc, t, c, w.want, w.request_id);
    }
  }
}

}  // namespace rackhub::server
