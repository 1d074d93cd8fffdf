"""ElasticSampler's partition and record_batch against an independent
reference (rackhub/torch/elastic/sampler.py; docs/elastic.md,
"ElasticSampler"), for every member of random memberships, processed sets,
dataset sizes (fewer remaining indices than members included) and batches.
The sampler reads the membership from rackhub.torch's context; this test
sets it per case (size(), rank()) without a hub: the partition is local
arithmetic, the collectives that keep members agreeing are tested by
test_elastic.py.

Reference: Horovod's rule written out with lists: the remaining indices of
the epoch's order, repeated whole until there are at least size() *
ceil(len / size()) of them, cut there; member r takes every size()-th from
position r; record_batch(b, s) marks slice [b*s, b*s+s) of every member's
share.

Walks (walk()): members that train epoch after epoch through membership
changes, as TorchState drives the sampler: a commit saves every member's
state_dict(); a kill fails the step in progress (every survivor restores
its last commit); a sync gives joiners the owner's state and every member
the union of the members' processed indices of the epoch, and re-splits.
Each committed step's batch of each member must be the reference's batch
of the epoch's order minus the indices the committed steps trained (so
nothing trained is redone and nothing lost), every epoch that ended holds
every index, exactly once when no split of it needed padding, and the same
seed gives the same batches (another seed another order).
"""
import math
import random
import sys

import harness

harness.require_torch()

from rackhub.torch import _context  # noqa: E402
from rackhub.torch.elastic import ElasticSampler  # noqa: E402


def reference_shares(order, processed, size):
    rem = [i for i in order if i not in processed]
    total = size * math.ceil(len(rem) / size)
    padded = []
    while len(padded) < total:
        padded += rem
    padded = padded[:total]
    return [padded[r::size] for r in range(size)]


def as_member(rank, size):
    """The membership the sampler reads (rackhub.torch's rank()/size())."""
    _context.size = lambda: size
    _context.rank = lambda: rank


def epoch_order(length, seed, epoch):
    order = list(range(length))
    random.Random(seed + epoch).shuffle(order)
    return order


class Walk:
    """Members (hub slots, ascending) with one ElasticSampler each, stepping
    together, and the independent reference: the indices the committed
    steps trained this epoch."""

    def __init__(self, length, batch, seed, slots, by_indices):
        self.length, self.batch, self.seed, self.by_indices = length, batch, seed, by_indices
        self.samplers, self.saved = {}, {}
        self.epoch, self.trained, self.epochs = 0, [], []  # epochs: (epoch, indices, padded)
        self.padded = False
        self.log = []  # every committed step: (epoch, [batch of each member])
        self.problems = []
        self._resplit(slots, {s: None for s in slots})

    def _resplit(self, slots, joiners):
        """A sync: joiners take the owner's (first survivor's) saved state,
        every member the union of the processed sets of the epoch."""
        owner = next((s for s in slots if s not in joiners), None)
        union = set()
        for s in slots:
            if s not in joiners:
                union |= self.samplers[s].processed_indices
        for r, s in enumerate(slots):
            as_member(r, len(slots))
            if s in joiners:
                self.samplers[s] = ElasticSampler(range(self.length), seed=self.seed)
                if owner is not None:
                    self.samplers[s].load_state_dict(self.saved[owner])
            st = self.samplers[s].state_dict()
            st["processed_indices"] = st["processed_indices"] | union
            self.samplers[s].load_state_dict(st)
            self.saved[s] = self.samplers[s].state_dict()
        self.slots, self.batch_idx = list(slots), 0
        rem = [i for i in epoch_order(self.length, self.seed, self.epoch)
               if i not in set(self.trained)]
        self.want = reference_shares(epoch_order(self.length, self.seed, self.epoch),
                                     set(self.trained), len(slots))
        self.padded |= len(rem) % len(slots) != 0

    def step(self, commit=True):
        """One step of every member (the worker's loop: set_epoch once the
        share is used up); commit=False: it fails before its commit."""
        boundary = self.batch_idx * self.batch >= len(self.samplers[self.slots[0]])
        b, k = (0 if boundary else self.batch_idx), self.batch
        got = []
        for r, s in enumerate(self.slots):
            as_member(r, len(self.slots))
            if boundary:
                self.samplers[s].set_epoch(self.samplers[s].epoch + 1)
            got.append(self.samplers[s].get_indices(b, k))
            if self.by_indices:
                self.samplers[s].record_indices(got[-1])
            else:
                self.samplers[s].record_batch(b, k)
        if not commit:
            return
        if boundary:  # the reference's next epoch
            self.epochs.append((self.epoch, self.trained, self.padded))
            self.epoch, self.trained = self.epoch + 1, []
            self.want = reference_shares(epoch_order(self.length, self.seed, self.epoch),
                                         set(), len(self.slots))
            self.padded = self.length % len(self.slots) != 0
        want = [share[b * k:(b + 1) * k] for share in self.want]
        if got != want:
            self.problems.append(f"epoch {self.epoch} step {b} members {self.slots}: {got} "
                                 f"!= reference {want}")
        for s in self.slots:
            self.saved[s] = self.samplers[s].state_dict()
        self.trained += [i for mine in got for i in mine]
        self.log.append((self.epoch, got))
        self.batch_idx = b + 1

    def change(self, slots, kill):
        """A membership change to `slots`: with kill, the step in progress
        fails and every survivor restores its last commit first."""
        if kill:
            self.step(commit=False)
            for r, s in enumerate(self.slots):
                as_member(r, len(self.slots))
                self.samplers[s].load_state_dict(self.saved[s])
        for s in self.slots:  # a slot that left is a new process if it comes back
            if s not in slots:
                del self.samplers[s], self.saved[s]
        self._resplit(sorted(slots), {s for s in slots if s not in self.slots})

    def check(self):
        for epoch, trained, padded in self.epochs:
            if set(trained) != set(range(self.length)) or (
                    not padded and len(trained) != self.length):
                self.problems.append(
                    f"epoch {epoch}: {len(trained)} trained, {len(set(trained))} distinct of "
                    f"{self.length} (padding {'allowed' if padded else 'not allowed'})")
        return self.problems


def walk(length, batch, seed, plan, by_indices=False):
    """Runs `plan` ([("steps", n) | ("members", slots, kill)]) from the
    members of its first entry; returns the Walk."""
    w = Walk(length, batch, seed, plan[0][1], by_indices)
    for event in plan[1:]:
        if event[0] == "steps":
            for _ in range(event[1]):
                w.step()
        else:
            w.change(event[1], event[2])
    return w


def walk_cases():
    failures = []
    # 180 indices, 5 per member and step. record_batch: 3 steps of 4 (60),
    # rank 2 killed in step 4 (redone by 3 members: 40 each), after 4 steps
    # of 3 (120 in all) ranks 2 and 4 join (60 left: 12 each, 3 steps);
    # record_indices (which reach the others at a sync: joins only): 4 steps
    # of 3 (60), ranks 2 and 4 join (120 left: 24 each, 5 steps). Then a
    # whole epoch of 5 (8 steps) and the first step of the next. No split
    # pads, so every index exactly once.
    plans = {False: [("members", [0, 1, 2, 3]), ("steps", 3), ("members", [0, 1, 3], True),
                     ("steps", 4), ("members", [0, 1, 2, 3, 4], False), ("steps", 3 + 8 + 1)],
             True: [("members", [0, 1, 3]), ("steps", 4), ("members", [0, 1, 2, 3, 4], False),
                    ("steps", 5 + 8 + 1)]}
    for by_indices, plan in plans.items():
        w = walk(180, 5, 7, plan, by_indices)
        what = f"walk 180/5 ({'record_indices' if by_indices else 'record_batch'})"
        failures += [f"{what}: {p}" for p in w.check()]
        if [e[0] for e in w.epochs] != [0, 1] or any(e[2] for e in w.epochs):
            failures.append(f"{what}: epochs {[(e[0], e[2]) for e in w.epochs]}")
        again = walk(180, 5, 7, plan, by_indices)
        if again.log != w.log:
            failures.append(f"{what}: the same seed gave other batches")
        other = walk(180, 5, 8, plan, by_indices)
        if [i for _, got in other.log[:3] for i in got] == [i for _, got in w.log[:3] for i in got]:
            failures.append(f"{what}: seed 8 gave the batches of seed 7")
    # Random walks: kills (record_batch) or joins at random steps, sizes
    # that pad, fewer indices left than members.
    rng = random.Random(4721)
    for case in range(60):
        length, batch = rng.choice([7, 30, 61, 100]), rng.randint(1, 7)
        slots = sorted(rng.sample(range(8), rng.randint(1, 4)))
        plan, by_indices = [("members", slots)], case % 3 == 0
        for _ in range(rng.randint(1, 6)):
            plan.append(("steps", rng.randint(0, 6)))
            alive = [s for s in slots if rng.random() < 0.7 or by_indices] or slots[:1]
            free = [s for s in range(8) if s not in alive]
            slots = sorted(alive + rng.sample(free, rng.randint(0, min(3, len(free)))))
            plan.append(("members", slots, not by_indices and rng.random() < 0.7))
        plan.append(("steps", 2 * length))
        w = walk(length, batch, case, plan, by_indices)
        failures += [f"random walk {case} {plan}: {p}" for p in w.check()]
        if not w.epochs:
            failures.append(f"random walk {case}: no epoch ended")
    return failures


def partition_cases():
    rng = random.Random(2911)
    failures = []
    for case in range(300):
        length = rng.choice([1, 2, 3, 5, 7, 16, 100, 257])
        size = rng.randint(1, 9)
        shuffle = rng.random() < 0.5
        seed, epoch = rng.randint(0, 99), rng.randint(0, 5)
        processed = set(rng.sample(range(length), rng.randint(0, length - 1)))
        order = list(range(length))
        if shuffle:
            random.Random(seed + epoch).shuffle(order)
        want = reference_shares(order, processed, size)
        batch_size = rng.randint(1, 6)
        batch_idx = rng.randint(0, max(0, len(want[0]) // batch_size))
        marked = set(processed)
        for share in want:
            marked.update(share[batch_idx * batch_size:(batch_idx + 1) * batch_size])
        for rank in range(size):
            as_member(rank, size)
            s = ElasticSampler(list(range(length)), shuffle=shuffle, seed=seed)
            s.load_state_dict({"epoch": epoch, "processed_indices": processed})
            what = (f"case {case}: {length} indices, {len(processed)} processed, size {size}, "
                    f"rank {rank}, shuffle {shuffle}")
            if list(s) != want[rank] or len(s) != len(want[rank]):
                failures.append(f"{what}: share {list(s)} != {want[rank]}")
                continue
            got = s.get_indices(batch_idx, batch_size)
            if got != want[rank][batch_idx * batch_size:(batch_idx + 1) * batch_size]:
                failures.append(f"{what}: get_indices({batch_idx}, {batch_size}) = {got}")
            s.record_batch(batch_idx, batch_size)
            if s.processed_indices != marked:
                failures.append(f"{what}: record_batch({batch_idx}, {batch_size}) marked "
                                f"{sorted(s.processed_indices - marked)} extra, "
                                f"{sorted(marked - s.processed_indices)} missing")
    return failures


def main():
    failures = []
    for name, cases in (("300 partitions", partition_cases), ("62 walks", walk_cases)):
        got = cases()
        print(f"{name}: {len(got)} failure(s)")
        failures += got
    for f in failures[:20]:
        print(f"FAIL: {f}")
    print("PASSED" if not failures else "FAILED")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
