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


def main():
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
            _context.size = lambda: size  # noqa: B023 (the case's membership)
            _context.rank = lambda: rank  # noqa: B023
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
    for f in failures[:20]:
        print(f"FAIL: {f}")
    print(f"300 cases, {len(failures)} failure(s): {'PASSED' if not failures else 'FAILED'}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
