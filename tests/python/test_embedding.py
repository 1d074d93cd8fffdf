"""Embedding tables through rackhub.torch (DistributedOptimizer(embeddings=))
against a real hub (2 lanes) with 2 rank processes, compared bit for bit
with a single-process reference that computes what the hub promises:

  each rank's sparse rows (uncoalesced, duplicates in the order torch lists
  them) summed in order, then the ranks' partial rows in rank order; SGD
  (p - lr * sum, fp32) or row-wise AdaGrad (dlrm_model.rowwise_adagrad_)
  on the touched rows only; the dense Linear through the usual local path
  (rank-order sum, torch's optimizer).

Scenarios (a tenant each): "sgd-sum-prefetch" (op=Sum, each step's reply
brings the next batch's rows), "sgd-sum-pull" (the same without prefetch:
the forward pre-hooks pull; must give the same bits), "sgd-sum-uncoalesced"
(embedding_coalesce=False: duplicate ids go to the hub as they are; the
same bits again), "adagrad-mean" (op=Average, row-wise AdaGrad). In every
one: an nn.Embedding (300 samples x 3 ids per rank and step over 37 rows,
rows 0 and 1 ~150 times each, so the order of the sums shows: summing them
in torch's coalesce() order fails this test) and an
nn.EmbeddingBag(mode="sum", 2 ids per sample); at step 2 rank 1's batch is
empty and at step 4 rank 0 does not call the bag
at all (empty pushes); at step 3 the learning rate changes
(set_learning_rate: the tables' SetOptimizer). Rank 0 also checks: a
sparse=False embedding is refused with a ValueError naming it, the tables'
key names, that a table's initial rows equal table_init_'s, and the
translation of torch optimizers to table optimizers (SparseAdam -> adam,
SGD momentum, Adagrad row-wise; RMSprop and Adagrad's lr_decay refused).

    test_embedding.py        (RACKHUB_BIN_DIR: rackhubd/rackhubctl; PYTHONPATH: build/python)
"""
import os
import sys

import harness

harness.require_torch()
import numpy as np  # noqa: E402
import torch  # noqa: E402

import dlrm_model as dm  # noqa: E402

WORLD, STEPS, BATCH = 2, 6, 300
ROWS_E, ROWS_B, DIM = 37, 23, 4
LR, LR2 = 0.1, 0.05          # LR2 from step 3 on
# name: (optimizer, op, prefetch, embedding_coalesce)
SCENARIOS = {"sgd-sum-prefetch": ("sgd", "sum", True, True),
             "sgd-sum-pull": ("sgd", "sum", False, True),
             "sgd-sum-uncoalesced": ("sgd", "sum", True, False),
             "adagrad-mean": ("adagrad", "average", True, True)}
INIT = ("random", 0.5, 123)


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.emb = torch.nn.Embedding(ROWS_E, DIM, sparse=True)
        self.bag = torch.nn.EmbeddingBag(ROWS_B, DIM, mode="sum", sparse=True)
        self.fc = torch.nn.Linear(2 * DIM, 1)

    def forward(self, ids, bag_ids, skip_bag=False):
        b = torch.zeros(len(ids), DIM) if skip_bag else self.bag(bag_ids)
        return self.fc(torch.cat([self.emb(ids).sum(1), b], 1)).squeeze(1)


def data(rank, step):
    """(ids n x 3, bag ids n x 2, y n, skip_bag) of one rank's batch."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    n = 0 if (step == 2 and rank == 1) else BATCH
    ids = torch.randint(0, ROWS_E, (n, 3), generator=g)
    ids[:, 0] = ids[:, 0] % 2  # rows 0 and 1 several times per batch: the order of sums shows
    return (ids,
            torch.randint(0, ROWS_B, (n, 2), generator=g), torch.randn(n, generator=g),
            step == 4 and rank == 0)


def loss_of(model, batch):
    ids, bag_ids, y, skip = batch
    return 0.5 * ((model(ids, bag_ids, skip) - y) ** 2).sum() / BATCH  # 0 for an empty batch


def make_optimizer(kind, params):
    return (torch.optim.SGD if kind == "sgd" else torch.optim.Adagrad)(params, lr=LR)


def tables(model):
    return [model.emb, model.bag]


# -- rank process ----------------------------------------------------------------

def worker(argv):
    rank, hub, tenant, token, scenario, out = argv
    rank = int(rank)
    import rackhub.torch as rh
    torch.set_num_threads(1)
    rh.init(rank=rank, size=WORLD, hub=hub, tenant=tenant, token=token)
    kind, op, prefetch, coalesce = SCENARIOS[scenario]
    model = Tiny()
    checks = []
    if rank == 0:
        dense = torch.nn.Embedding(10, DIM)
        try:
            rh.DistributedOptimizer(torch.optim.SGD(dense.parameters(), lr=LR),
                                    named_parameters=[("dense_emb.weight", dense.weight)],
                                    embeddings=[dense])
            checks.append(("sparse=False refused", False, "no error"))
        except ValueError as e:
            checks.append(("sparse=False refused", "sparse=False" in str(e)
                           and "dense_emb.weight" in str(e), str(e)))
        checks += spec_checks(rh)
    opt = rh.DistributedOptimizer(make_optimizer(kind, model.parameters()),
                                  named_parameters=model.named_parameters(),
                                  op=rh.Sum if op == "sum" else rh.Average,
                                  embeddings=tables(model), embedding_init=INIT,
                                  embedding_coalesce=coalesce)
    if rank == 0:
        hub_type = "sgd" if kind == "sgd" else "adagrad"
        red = "sum" if op == "sum" else "mean"
        for n in ("emb.weight", "bag.weight"):
            name = f"{n}:table:{hub_type}:{red}"
            checks.append((f"key {name}", rh.client().find_key(name) is not None, ""))
        # Initial rows (before any step) equal table_init_'s.
        for i, m in enumerate(tables(model)):
            mode, scale, seed = opt.table_init_of(m)
            want = rh.table_init_(torch.empty(m.weight.shape), seed, scale)
            opt.pull_tables([m])
            checks.append((f"initial rows of table {i} = table_init_(seed {seed})",
                           torch.equal(m.weight.detach(), want) and seed == 123 + i * 2 ** 40,
                           ""))
    for step in range(STEPS):
        if step == 3:
            opt.set_learning_rate(LR2)
        opt.zero_grad()
        loss_of(model, data(rank, step)).backward()
        if prefetch and step + 1 < STEPS:
            ids, bag_ids, _, _ = data(rank, step + 1)
            opt.prefetch(model.emb, ids)
            opt.prefetch(model.bag, bag_ids)
        opt.step()
    pulled = sum(opt.table_stats().values())
    opt.pull_tables()
    torch.save({"weights": {n: p.detach().clone() for n, p in model.named_parameters()},
                "pulled": pulled}, out)
    for what, good, detail in checks:
        print(f"{'ok  ' if good else 'FAIL'} rank {rank}: {what} {detail if not good else ''}")
    rh.shutdown()
    return 0 if all(g for _, g, _ in checks) else 1


def spec_checks(rh):
    """The tables' hub optimizers translated from torch's (no hub needed)."""
    from rackhub.torch.embedding import table_spec_of_group
    w = [torch.nn.Parameter(torch.zeros(3, DIM))]
    out = []
    for opt, want in ((torch.optim.SparseAdam(w, lr=0.01), {"type": "adam", "lr": 0.01}),
                      (torch.optim.SGD(w, lr=0.1, momentum=0.9), {"type": "momentum"}),
                      (torch.optim.Adagrad(w, lr=0.1), {"type": "adagrad", "eps": 1e-10}),
                      (torch.optim.RMSprop(w), "RMSprop"),
                      (torch.optim.Adagrad(w, lr_decay=0.1), "lr_decay")):
        try:
            got = table_spec_of_group(opt, opt.param_groups[0])
            good = isinstance(want, dict) and all(got.get(k) == v for k, v in want.items())
        except ValueError as e:
            got, good = str(e), isinstance(want, str) and want in str(e)
        out.append((f"table optimizer of {type(opt).__name__}: {got}", good, ""))
    return out


# -- single-process reference -------------------------------------------------

def reference(kind, op):
    torch.set_num_threads(1)
    import rackhub.torch as rh
    model = Tiny()
    for i, m in enumerate(tables(model)):
        rh.table_init_(m.weight, INIT[2] + i * 2 ** 40, INIT[1])
    dense = [model.fc.weight, model.fc.bias]
    opt = make_optimizer(kind, dense)
    scale = 1.0 if op == "sum" else 1.0 / WORLD
    state = [np.zeros(m.weight.shape[0], np.float32) for m in tables(model)]
    for step in range(STEPS):
        lr = LR2 if step >= 3 else LR
        for g in opt.param_groups:
            g["lr"] = lr
        grads, rows = [], []
        for r in range(WORLD):
            model.zero_grad(set_to_none=True)
            loss_of(model, data(r, step)).backward()
            grads.append([p.grad.clone() for p in dense])
            rows.append([dm.sparse_rows(m.weight.grad) for m in tables(model)])
        for i, p in enumerate(dense):
            s = grads[0][i].clone()
            for r in range(1, WORLD):
                s += grads[r][i]
            p.grad = s if op == "sum" else s * torch.tensor(scale, dtype=torch.float32)
        for i, m in enumerate(tables(model)):
            m.weight.grad = None
            per_rank = [(ids, v.reshape(-1, DIM)) for ids, v in (rows[r][i] for r in range(WORLD))]
            touched, sums = dm.rank_order_row_sums(per_rank)
            w = m.weight.data.numpy()
            if kind == "sgd":
                d = sums * np.float32(scale)
                w[touched] = w[touched] - np.float32(lr) * d
            else:
                dm.rowwise_adagrad_(w, state[i], touched, sums, lr, opt.defaults["eps"], scale)
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# -- driver ----------------------------------------------------------------------

def main():
    hub = harness.Hub(lanes=2)
    ok = True
    finals = {}
    try:
        for scenario, (kind, op, _, _) in SCENARIOS.items():
            token = hub.create_tenant(scenario, WORLD)
            outs = [os.path.join(hub.dir, f"{scenario}.{r}.pt") for r in range(WORLD)]
            procs = [harness.spawn([os.path.abspath(__file__), "--worker", str(r), hub.data,
                                    scenario, token, scenario, outs[r]]) for r in range(WORLD)]
            results = harness.collect(procs, 120)
            for r, (code, out) in enumerate(results):
                print(f"--- {scenario} rank {r} (exit {code})\n{out}", end="")
            if any(code != 0 for code, _ in results):
                print(f"FAIL {scenario}: a rank failed\n--- rackhubd log\n" + hub.log_text())
                ok = False
                continue
            ranks = [torch.load(o) for o in outs]
            ref = reference(kind, op)
            w = [x["weights"] for x in ranks]
            same = all(torch.equal(w[0][n], w[r][n]) for r in range(1, WORLD) for n in ref)
            exact = all(torch.equal(w[0][n], ref[n]) for n in ref)
            diff = max((w[0][n] - ref[n]).abs().max().item() for n in ref)
            good = same and exact
            print(f"{'ok  ' if good else 'FAIL'} {scenario}: ranks bit-identical: {same}; "
                  f"bit-identical to the reference: {exact} (max |diff| {diff:.3g}); rows "
                  f"pulled by forward pre-hooks per rank: {[x['pulled'] for x in ranks]}")
            ok &= good
            finals[scenario] = w[0]
        for other, what in (("sgd-sum-pull", "prefetch and pull paths"),
                            ("sgd-sum-uncoalesced", "coalesced and uncoalesced pushes")):
            if "sgd-sum-prefetch" in finals and other in finals:
                a, b = finals["sgd-sum-prefetch"], finals[other]
                same = all(torch.equal(a[n], b[n]) for n in a)
                print(f"{'ok  ' if same else 'FAIL'} {what} give the same bits")
                ok &= same
    finally:
        hub.stop()
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.exit(worker(sys.argv[2:]))
    sys.exit(main())
