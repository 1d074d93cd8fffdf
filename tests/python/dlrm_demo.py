"""A DLRM-style click model on synthetic data with a known ground truth,
data-parallel through rackhub: embedding tables as row-sparse hub keys.

    build/bin/rackhub-run -n 2 python3 tests/python/dlrm_demo.py     # the demo (deploy/demo-dlrm.sh)
    /usr/bin/python3 tests/python/dlrm_demo.py --single [--ranks 2]  # one process, no rackhub

Data, model and the single-process reference are in dlrm_model.py (4
Zipf-distributed categorical features over tables of 1,000-20,000 rows, one
of them a bag of 3 ids; 4 dense features; labels drawn from a hidden logit
model, so the Bayes-optimal held-out AUC is known).

Every rank holds the whole model. Each step takes the next BATCH samples of
the epoch's shuffled order (the same in every process); rank r trains on
its slice r of it. DistributedOptimizer(torch.optim.Adagrad, embeddings=the
4 tables): the dense parameters' gradients are averaged by the hub in rank
order and each rank's torch Adagrad steps; the tables' sparse gradients are
pushed as (row ids, rows) and the hub applies row-wise AdaGrad to the
touched rows only. With prefetch (default) each step's reply also brings
the rows of the rank's next batch, so forward never waits for the hub;
--no-prefetch makes the forward pre-hooks pull them instead.

Rank 0 prints one row per epoch (training loss averaged over the ranks,
held-out AUC, seconds), then trains the same model in one process
(dlrm_model.Reference: the same initial values, the same global batches and
shards, the hub's rank-order sums and row-wise AdaGrad written out in fp32)
and prints both final AUCs, the Bayes-optimal AUC and the largest difference
between the two runs' weights. Stated result (test_dlrm_demo.py): both AUCs
>= MIN_AUC and within AUC_TOLERANCE of each other.
"""
import argparse
import sys
import time

try:
    import torch
except ImportError as e:
    sys.exit(f"dlrm_demo.py: PyTorch is not installed for {sys.executable} ({e}): "
             f"apt-get install python3-torch")

import dlrm_model as dm

MIN_AUC = 0.75        # held-out AUC both runs reach (Bayes-optimal: ~0.826)
AUC_TOLERANCE = 0.01  # |rackhub - one process|


def batches(rank, world):
    """(epoch, step, this rank's sample indices, the next step's or None)."""
    steps = dm.N_TRAIN // dm.BATCH
    seq = [(e, s) for e in range(dm.EPOCHS) for s in range(steps)]
    orders = {}

    def idx(e, s):
        if e not in orders:
            orders.clear()
            orders[e] = dm.epoch_order(e)
        return dm.shard(orders[e][s * dm.BATCH:(s + 1) * dm.BATCH], rank, world)

    for i, (e, s) in enumerate(seq):
        cur = idx(e, s)
        nxt = idx(*seq[i + 1]) if i + 1 < len(seq) else None
        yield e, s, cur, nxt


def prefetch(opt, model, batch):
    _, cats, tags, _ = batch
    for i, e in enumerate(model.emb):
        opt.prefetch(e, cats[:, i])
    opt.prefetch(model.bag, tags)


def header(who):
    print(f"{who}: epoch  train loss  held-out AUC  seconds", flush=True)


def row(epoch, loss, auc, secs):
    print(f"{epoch:12d}  {loss:10.4f}  {auc:12.4f}  {secs:7.2f}", flush=True)


def train_distributed(args, data):
    import rackhub.torch as rh
    rh.init()
    torch.set_num_threads(1)
    rank, world = rh.rank(), rh.size()
    if dm.BATCH % world:
        sys.exit(f"dlrm_demo.py: the global batch {dm.BATCH} is not a multiple of {world} ranks")
    model = dm.DLRM()
    tables = model.tables()
    table_ids = {id(m.weight) for m in tables}
    # The dense parameters start equal on every rank (the tables start on the hub).
    rh.broadcast_parameters({n: p for n, p in model.named_parameters()
                             if id(p) not in table_ids}, root_rank=0)
    opt = torch.optim.Adagrad(model.parameters(), lr=dm.LR)
    opt = rh.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  embeddings=tables,
                                  embedding_init=("random", dm.INIT_SCALE, dm.TABLE_SEED))
    train, test = data["train"], data["test"]
    if rank == 0:
        print(f"{world} workers through rackhub (transport {opt.transport}), global batch "
              f"{dm.BATCH}, {dm.N_TRAIN} training / {dm.N_TEST} held-out samples, tables "
              + ", ".join(f"{n} {r}x{dm.DIM}" for n, r in dm.TABLES), flush=True)
        header("rackhub")
    t_start = t0 = time.monotonic()
    losses = []
    curves = []
    for epoch, step, idx, nxt in batches(rank, world):
        opt.zero_grad()
        loss = dm.loss_of(model, dm.take(train, idx))
        loss.backward()
        losses.append(loss.item())
        if nxt is not None and not args.no_prefetch:
            prefetch(opt, model, dm.take(train, nxt))
        opt.step()
        if step == dm.N_TRAIN // dm.BATCH - 1:
            mean = rh.allreduce(torch.tensor(sum(losses) / len(losses)), name="loss").item()
            losses = []
            if rank == 0:
                auc = dm.auc(model, test)
                curves.append((mean, auc))
                row(epoch + 1, mean, auc, time.monotonic() - t0)
            t0 = time.monotonic()
    secs = time.monotonic() - t_start
    pulled = sum(opt.table_stats().values())
    rh.allreduce(torch.zeros(1), name="done")  # every rank finished its last step
    if rank == 0:
        print(f"{world} workers through rackhub: {dm.EPOCHS} epochs in {secs:.1f} s; rows "
              f"pulled by forward pre-hooks on rank 0: {pulled} "
              f"{'(prefetch off)' if args.no_prefetch else '(first batch, held-out AUCs)'}",
              flush=True)
        opt.pull_tables()  # every row, to compare with the reference
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    rh.shutdown()
    if rank == 0:
        return curves, weights, world
    return None, None, world


def train_single(world, data, verbose=True):
    import rackhub.torch as rh  # table_init_: the hub's initial table values
    ref = dm.Reference(world, rh.table_init_)
    if verbose:
        header("one process")
    train, test = data["train"], data["test"]
    t_start = t0 = time.monotonic()
    losses, curves = [], []
    steps = dm.N_TRAIN // dm.BATCH
    for epoch in range(dm.EPOCHS):
        order = dm.epoch_order(epoch)
        for s in range(steps):
            losses.append(ref.step(train, order[s * dm.BATCH:(s + 1) * dm.BATCH]))
        auc = dm.auc(ref.model, test)
        curves.append((sum(losses) / len(losses), auc))
        losses = []
        if verbose:
            row(epoch + 1, curves[-1][0], auc, time.monotonic() - t0)
        t0 = time.monotonic()
    secs = time.monotonic() - t_start
    return curves, {n: p.detach().clone() for n, p in ref.model.named_parameters()}, secs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--single", action="store_true", help="only the one-process reference")
    ap.add_argument("--ranks", type=int, default=2, help="with --single: the run it mirrors")
    ap.add_argument("--no-prefetch", action="store_true",
                    help="forward pre-hooks pull every batch's rows instead")
    args = ap.parse_args()
    data = dm.make_data()
    bayes = dm.bayes_auc(data)
    if args.single:
        curves, _, secs = train_single(args.ranks, data)
        print(f"one process (mirroring {args.ranks} ranks): {dm.EPOCHS} epochs in {secs:.1f} s; "
              f"held-out AUC {curves[-1][1]:.4f} (Bayes-optimal {bayes:.4f})")
        return 0
    __import__("rackhub.torch")  # fails here, before any work, if the binding is missing
    curves, weights, world = train_distributed(args, data)
    if curves is None:
        return 0
    ref_curves, ref_weights, secs = train_single(world, data)
    diff = max((weights[n] - ref_weights[n]).abs().max().item() for n in weights)
    dist_auc, single_auc = curves[-1][1], ref_curves[-1][1]
    print(f"one process: {dm.EPOCHS} epochs in {secs:.1f} s; largest difference between its "
          f"weights and rank 0's: {diff:.3g}")
    print(f"held-out AUC: {world} workers through rackhub {dist_auc:.4f} | one process "
          f"{single_auc:.4f} | Bayes-optimal {bayes:.4f} (stated: both >= {MIN_AUC}, "
          f"within {AUC_TOLERANCE})")
    ok = (dist_auc >= MIN_AUC and single_auc >= MIN_AUC
          and abs(dist_auc - single_auc) <= AUC_TOLERANCE)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
