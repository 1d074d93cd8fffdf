#include "params_reply.h"

namespace rackhub::server {

void SendParams(net::Connection& conn, const Chunk& c, uint64_t version, uint64_t request_id,
                ReplyBytes mode) {
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
  if (mode == ReplyBytes::kCopied) {
    conn.SendOwned(r, std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  } else {
    conn.SendBorrowed(r, bytes);
  }
}

void AnswerPushes(Chunk& c, uint64_t version) {
  for (const Waiter& w : c.pushes) {
    if (auto wc = w.conn.lock(); wc && wc->open()) {
      SendParams(*wc, c, version, w.request_id, ReplyBytes::kBorrowed);
    }
  }
  c.pushes.clear();
}

}  // namespace rackhub::server
