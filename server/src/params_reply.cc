#include "params_reply.h"

namespace rackhub::server {

void SendParams(net::Connection& conn, const Chunk& c, uint64_t version, uint64_t request_id) {
  const auto bytes = c.reply_bytes(version);
  net::FrameHeader r;
  r.opcode = net::Opcode::kParams;
  r.tenant = conn.id().tenant_handle;
  r.key = c.key_id;
  r.chunk = c.index_in_key;
  r.dtype = c.dtype;
  r.iteration = version;
  r.request_id = request_id;
  r.payload_bytes = static_cast<uint32_t>(bytes.size());
  conn.SendShared(r, bytes, c.reply_owner(version));
}

void AnswerPushes(Chunk& c, uint64_t version) {
  for (const Waiter& w : c.pushes) {
    if (auto wc = w.conn.lock(); wc && wc->open()) {
      SendParams(*wc, c, version, w.request_id);
    }
  }
  c.pushes.clear();
}

void AnswerPulls(Chunk& c, uint64_t version) {
  std::vector<Waiter> pulls;
  pulls.swap(c.pulls);
  for (const Waiter& w : pulls) {
    if (auto wc = w.conn.lock(); wc && wc->open()) {
      wc->Unreserve(w.reserved);
      SendParams(*wc, c, version, w.request_id);
    }
  }
}

}  // namespace rackhub::server
