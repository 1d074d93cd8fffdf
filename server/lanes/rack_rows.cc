// RackExchange, part 3: row-sparse tables spanning racks (docs/
// architecture.md, "Hierarchical rack exchange"; docs/wire-protocol.md
// section 7). A table's chunk (a range of whole rows) has its home where a
// dense chunk of the same tenant-wide index would: rack (g / lanes) % R.
// Each hub sums its rack's PUSH_ROWS per row in rank order (a RowSums per
// rack served here); a non-home hub sends the touched rows' fp32 sums to the
// home (RACK_SUM, row payload); the home adds the racks' sums per row in
// rack order (RowShard with the racks as contributors, the mean over every
// rack's workers), applies the optimizer to the touched rows and sends their
// new fp32 values to every other rack (RACK_PARAMS, row payload), which
// writes them into its copy of the rows: every hub's rows stay in step with
// the home's, so PULL_ROWS is answered where it arrives. Flat mode does the
// same additions on one hub: the same bits.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "rack_exchange.h"
#include "rackhub/common/number.h"
#include "rows_reply.h"
#include "wire_names.h"

namespace rackhub::server {

std::shared_ptr<std::string> RackExchange::EncodeRackRowsPayload(std::span<const uint64_t> ids,
                                                                 const float* rows, uint32_t dim) {
  const size_t row_bytes = ids.size() * dim * sizeof(float);
  auto out = std::make_shared<std::string>(
      net::EncodeRowsRequest(ids, std::span<const uint64_t>()));
  out->resize(out->size() + row_bytes);
  if (row_bytes > 0) std::memcpy(out->data() + out->size() - row_bytes, rows, row_bytes);
  return out;
}

std::span<const std::byte> RackExchange::RackRowsSpan(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

Status RackExchange::ParseRackRows(const aggregation::RowShard& r,
                                   std::span<const std::byte> payload, net::RowsPayload* out) {
  Result<net::RowsPayload> rows =
      net::ParseRowsPayload(Opcode::kPushRows, payload, r.dim(), net::DType::kFp32);
  if (!rows.ok()) return rows.status();
  if (!rows->want.empty()) return InvalidArgument("want: must be 0 on a hub link");
  if (Status s = r.CheckRows(rows->ids); !s.ok()) return s;
  for (size_t i = 1; i < rows->ids.size(); ++i) {
    if (rows->ids[i] <= rows->ids[i - 1]) {
      return InvalidArgument("ids: row " + Num(rows->ids[i]) + " follows row " +
                             Num(rows->ids[i - 1]) +
                             "; a hub link's row ids are strictly ascending");
    }
  }
  *out = *std::move(rows);
  return Status::Ok();
}

void RackExchange::OnRackRows(LaneTenant& t, LaneKey& key, Chunk& c, uint32_t rack) {
  std::vector<float> sums;
  const std::vector<uint64_t> ids = c.RowStage(rack).Take(&sums);
  c.row_stages->taken_for[rack] = c.rows->version() + 1;  // RowContributed until it completes
  if (c.home == topology_.rack || !table_->exchange()) {
    AddRackRows(t, key, c, rack, ids, sums.data());
    return;
  }
  auto payload = EncodeRackRowsPayload(ids, sums.data(), c.rows->dim());
  if (payload->size() > net::kMaxDataPayload) {
    table_->FailPending(t, WireError::kInvalidArgument,
                        "rows: rack " + Num(rack) + "'s sums of " + Num(ids.size()) +
                            " distinct rows of table '" + key.info.name + "' chunk " +
                            Num(c.index_in_key) + " make a hub-link frame of " +
                            Num(payload->size()) + " bytes, above " +
                            Num(net::kMaxDataPayload) + "; push fewer distinct rows at once");
    return;
  }
  net::FrameHeader h = c.Header(Opcode::kRackSum, t.info.handle, c.rows->version());
  h.dtype = net::DType::kFp32;  // rack sums are fp32 whatever the key's dtype
  const auto bytes = RackRowsSpan(*payload);
  SendToPeer(c.home, t, key, h, bytes, std::move(payload));
}

void RackExchange::AddRackRows(LaneTenant& t, LaneKey& key, Chunk& c, uint32_t rack,
                               std::span<const uint64_t> ids, const float* rows) {
  aggregation::RowShard& r = *c.rows;
  table_->MarkPending(t, c);
  r.Contribute(rack, ids, rows, aggregation::ElementType::kFp32);
  if (!r.ready()) return;
  if (table_->exchange()) {
    // The new values of every touched row go out in one RACK_PARAMS: an
    // update whose union does not fit one hub-link frame is failed before
    // it is applied (after it, the other racks could never catch up).
    const uint64_t touched_rows = r.sums().touched_rows();
    const uint64_t bytes =
        net::kRowsPrefixBytes + touched_rows * (sizeof(uint64_t) + uint64_t{r.dim()} * 4);
    if (bytes > net::kMaxDataPayload) {
      table_->FailPending(t, WireError::kInvalidArgument,
                          "rows: the racks' pushes touch " + Num(touched_rows) +
                              " distinct rows of table '" + key.info.name + "' chunk " +
                              Num(c.index_in_key) + ", whose new values make a hub-link frame "
                              "of " + Num(bytes) + " bytes, above " +
                              Num(net::kMaxDataPayload) + "; push fewer distinct rows at once");
      return;
    }
  }
  const std::vector<uint64_t> touched = r.Update();
  const uint64_t v = r.version();
  table_->Completed(t, key, c, v);
  if (table_->exchange()) {
    std::vector<float> values(touched.size() * r.dim());
    r.ReadRows(touched, values.data(), aggregation::ElementType::kFp32);
    auto payload = EncodeRackRowsPayload(touched, values.data(), r.dim());
    net::FrameHeader h = c.Header(Opcode::kRackParams, t.info.handle, v);
    h.dtype = net::DType::kFp32;  // the master values, so every hub holds the same bits
    const auto bytes = RackRowsSpan(*payload);
    for (uint32_t peer = 0; peer < table_->racks(); ++peer) {
      if (peer != topology_.rack) SendToPeer(peer, t, key, h, bytes, payload);
    }
  }
  AnswerRowPushes(t, c);
}

Verdict RackExchange::CheckRowData(net::Connection& conn, const LaneKey& key, const Chunk& c,
                                   const FrameHeader& h) {
  const uint64_t rid = h.request_id;
  const bool sum = h.opcode == Opcode::kRackSum;
  const std::string what = std::string(sum ? "RACK_SUM" : "RACK_PARAMS") + " of table '" +
                           key.info.name + "' chunk " + Num(h.chunk);
  if (h.dtype != net::DType::kFp32) {
    return Reject(conn, WireError::kBadDType,
                  "dtype: " + what + " must carry fp32 rows, got " + net::DTypeName(h.dtype),
                  rid);
  }
  if (sum != (c.home == topology_.rack) || (!sum && conn.id().rack != c.home)) {
    return Reject(conn, WireError::kInvalidArgument,
                  what + (sum ? " sent to" : " sent by") + " a hub that is not the rows' home",
                  rid);
  }
  const uint32_t peer = conn.id().rack;
  const uint64_t expected = sum ? c.rows->version() : c.rows->version() + 1;
  // Stale: sent before a recovery round moved the rows past it (its agreed
  // version, the key's floor, is past every update before it).
  const uint64_t agreed = key.runtime->floor.load(std::memory_order_acquire);
  if (h.iteration < expected || (!sum && h.iteration < agreed)) return Verdict::kDiscard;
  if (h.iteration != expected || (sum && c.rows->contributed(peer))) {
    SendPeerError(conn, h.tenant,
                  "iteration: " + Num(h.iteration) + " of " + what + ", expected " +
                      Num(expected) + (sum && h.iteration == expected ? " once per rack" : ""));
    return Verdict::kDiscard;
  }
  return Verdict::kAccept;
}

void RackExchange::OnRowData(net::Connection& conn, LaneTenant& t, LaneKey& key, Chunk& c,
                             const FrameHeader& h, std::span<const std::byte> payload) {
  aggregation::RowShard& r = *c.rows;
  const bool sum = h.opcode == Opcode::kRackSum;
  net::RowsPayload parsed;
  const Status s = ParseRackRows(r, payload, &parsed);
  const net::RowsPayload* rows = &parsed;
  if (!s.ok()) {
    Reject(conn, WireError::kInvalidArgument,
           std::string(sum ? "RACK_SUM" : "RACK_PARAMS") + " of table '" + key.info.name +
               "' chunk " + Num(h.chunk) + ": " + s.message(),
           h.request_id);  // fatal: the link closes, the updates waiting on it fail
    return;
  }
  // (fp32 rows straight from the frame: memcpy'd, never read unaligned.)
  std::vector<float> values(rows->ids.size() * r.dim());
  if (!values.empty()) std::memcpy(values.data(), rows->rows, rows->row_bytes);
  if (sum) {
    AddRackRows(t, key, c, conn.id().rack, rows->ids, values.data());
    return;
  }
  // RACK_PARAMS from the home: its new values of the rows it touched.
  r.WriteRows(rows->ids, values.data(), aggregation::ElementType::kFp32);
  r.set_version(h.iteration);
  table_->Completed(t, key, c, h.iteration);
  AnswerRowPushes(t, c);
}

}  // namespace rackhub::server
