// ChunkTable: an elastic tenant's committed membership (docs/elastic.md)
// as a lane reads it, and applied to a chunk's next update. On one hub the
// chunk sums the members' pushes; across racks (docs/elastic.md, "Across
// racks") the chunk's stage of this hub's rack sums this rack's members and
// the home's cross-rack stage adds the sums of the racks with members,
// dividing a mean by the cluster's total. Memberships are committed only at
// the end of a recovery (nothing pending anywhere, no push accepted), so an
// update never mixes two.
#include <string>

#include "chunk_table.h"
#include "rackhub/common/number.h"

namespace rackhub::server {

const Membership& ChunkTable::MembershipOf(LaneTenant& t) {
  const uint64_t commit = t.runtime->membership_commits.load(std::memory_order_acquire);
  if (!t.membership || t.membership_commit != commit) {
    t.membership = t.runtime->membership();
    t.membership_commit = commit;
  }
  return *t.membership;
}

Status ChunkTable::ApplyMembership(LaneTenant& t, Chunk& c) {
  const Membership& m = MembershipOf(t);
  ElasticForming& forming = t.forming[ChunkId(c.key_id, c.index_in_key)];
  if (forming.commit == t.membership_commit) return Status::Ok();
  aggregation::ChunkState* local =
      c.multi_rack() && self_rack_ < c.stages.size() ? c.stages[self_rack_].get() : nullptr;
  if (c.state.contributions() != 0 || (local && local->contributions() != 0)) {
    // Cannot happen (see above); if it did, this update would mix two
    // memberships: the caller aborts it.
    return FailedPrecondition("membership: chunk " + Num(c.index_in_key) + " of key id " +
                              Num(c.key_id) + " has contributions of an older membership");
  }
  bool applied = true;
  if (c.multi_rack()) {
    // A rack without members sends no sum (and its stage takes no push).
    if (local && m.count > 0) applied = local->SetMembers(m.member);
    if (applied && m.total > 0) {
      applied = c.state.SetMembers(m.racks);
      c.state.set_mean_divisor(m.total);
    }
  } else {
    applied = c.state.SetMembers(m.member);
  }
  if (!applied) {
    return Internal("membership: generation " + Num(m.generation) + " (" + Num(m.total) +
                    " member(s)) could not be applied to chunk " + Num(c.index_in_key) +
                    " of key id " + Num(c.key_id));
  }
  forming.commit = t.membership_commit;
  forming.generation = m.generation;
  forming.total = m.total;
  return Status::Ok();
}

}  // namespace rackhub::server
