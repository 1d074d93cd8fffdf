// hub_lane_fuzz's input encoding: one operation per 8 bytes, decoded by
// DecodeOp into an Op that Session::Play (hub_link.h) carries out.
//
//   b0  what: 0..17 a frame with that opcode (0 is not an opcode: MALFORMED),
//       18..21 PUSH, 22 PULL, 23 INIT, 24 delete a key (admin),
//       25 set a key's optimizer (admin), 26 close the link abruptly (a lost
//       worker), 27 sync (HEARTBEAT round trip on every link), 28..31 BYE
//   b1  bit 0: rank; bit 1: lane chosen by the chunk's owner (else bit 2);
//       bits 3-4: the header's tenant: 0-1 this tenant, 2 the victim, 3 b7
//   b2  bits 0-1: key (k0, k1, the key last declared, b7 as an id);
//       bits 2-3: chunk
//   b3  < 128: iteration relative to the rank's next one for the chunk
//       (b3 % 3 - 1); >= 128: absolute (b3 - 128)
//   b4  bits 0-1: dtype (0: the key's own); bits 2-3: payload size (0-1 the
//       chunk's exact size in that dtype, 2 none, 3 b5 bytes); bit 4: a
//       control payload (DECLARE, SET_OPTIMIZER, ...) of b5 raw bytes instead
//       of a well-formed message
//   b5  a length, or a DECLARE's element count (1 + 37 * b5)
//   b6  fill byte of the payload; DECLARE's name, init and optimizer;
//       SET_OPTIMIZER's type
//   b7  the request id's low byte, or the raw tenant / key id
// Pure functions; any thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "rackhub/aggregation/optimizer_config.h"
#include "rackhub/net/frame.h"

namespace rackhub::fuzz {

inline constexpr size_t kOpBytes = 8;

struct Op {
  enum class Kind { kFrame, kDeleteKey, kSetOptimizer, kClose, kSync };
  Kind kind = Kind::kFrame;
  net::Opcode opcode = net::Opcode::kHeartbeat;
  uint32_t rank = 0;
  bool owner_lane = true;
  uint32_t lane = 0;
  enum class TenantField { kOwn, kVictim, kRaw } tenant = TenantField::kOwn;
  uint32_t key_slot = 0;  // 0: k0, 1: k1, 2: last declared, 3: raw
  uint32_t chunk = 0;
  bool relative_iteration = true;
  int iteration = 0;      // relative: -1, 0, +1; else absolute
  uint8_t dtype = 0;      // 0: the key's own
  enum class Size { kExact, kNone, kLength } size = Size::kExact;
  bool raw_control = false;
  uint8_t length = 0;
  uint8_t fill = 0;
  uint8_t raw = 0;
};

inline Op DecodeOp(const uint8_t* b) {
  Op op;
  const uint8_t what = b[0] % 32;
  if (what <= 17) {
    op.opcode = static_cast<net::Opcode>(what);
  } else if (what <= 21) {
    op.opcode = net::Opcode::kPush;
  } else if (what == 22) {
    op.opcode = net::Opcode::kPull;
  } else if (what == 23) {
    op.opcode = net::Opcode::kInit;
  } else if (what == 24) {
    op.kind = Op::Kind::kDeleteKey;
  } else if (what == 25) {
    op.kind = Op::Kind::kSetOptimizer;
  } else if (what == 26) {
    op.kind = Op::Kind::kClose;
  } else if (what == 27) {
    op.kind = Op::Kind::kSync;
  } else {
    op.opcode = net::Opcode::kBye;
  }
  op.rank = b[1] & 1;
  op.owner_lane = (b[1] & 2) != 0;
  op.lane = (b[1] >> 2) & 1;
  const uint8_t t = (b[1] >> 3) & 3;
  op.tenant = t < 2 ? Op::TenantField::kOwn : t == 2 ? Op::TenantField::kVictim
                                                     : Op::TenantField::kRaw;
  op.key_slot = b[2] & 3;
  op.chunk = (b[2] >> 2) & 3;
  op.relative_iteration = b[3] < 128;
  op.iteration = op.relative_iteration ? b[3] % 3 - 1 : b[3] - 128;
  op.dtype = b[4] & 3;
  const uint8_t size = (b[4] >> 2) & 3;
  op.size = size < 2 ? Op::Size::kExact : size == 2 ? Op::Size::kNone : Op::Size::kLength;
  op.raw_control = (b[4] & 16) != 0;
  op.length = b[5];
  op.fill = b[6];
  op.raw = b[7];
  return op;
}

// The tenant each input creates.
struct TenantShape {
  uint32_t workers = 1;
  aggregation::OptimizerConfig optimizer;
};

inline TenantShape ShapeOf(uint8_t b) {
  TenantShape s;
  s.workers = 1 + (b & 1);
  s.optimizer.type = static_cast<aggregation::OptimizerType>(1 + (b >> 1) % 7);
  const bool sum_only = s.optimizer.type == aggregation::OptimizerType::kSumOnly;
  s.optimizer.learning_rate = sum_only ? 0 : 0.1;  // sum-only applies no update
  if (sum_only) s.optimizer.reduction = aggregation::Reduction::kSum;
  const bool momentum = s.optimizer.type == aggregation::OptimizerType::kMomentum ||
                        s.optimizer.type == aggregation::OptimizerType::kNesterov;
  s.optimizer.momentum = momentum ? 0.9 : 0;
  return s;
}

}  // namespace rackhub::fuzz
