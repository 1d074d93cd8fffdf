"""A small CNN on real handwritten digits, data-parallel through a rackhub hub.

    build/bin/rackhub-run -n 3 python3 client/examples/digits_cnn.py     # the demo
    /usr/bin/python3 client/examples/digits_cnn.py --single              # one process, no rackhub

The data are the 1797 8x8 grey-scale digit images scikit-learn ships in its
Debian package (python3-sklearn; sklearn.datasets.load_digits, no download),
pixel values scaled from 0..16 to [0, 1], split once (fixed seed, stratified)
into 1347 training and 450 held-out images.

Horovod style (rackhub.torch): every rank holds the whole model; each epoch
all ranks draw the same shuffled order of the training set (one seeded
torch.Generator) and rank r trains on positions r, r+N, r+2N, ... of it,
--batch images per step. The hub averages the ranks' gradients (in rank
order) and each rank's own torch.optim.SGD (momentum) steps, so every step
sees --batch * N images and the replicas stay identical. Rank 0 prints one
line per epoch: training loss (averaged over the ranks), held-out accuracy
(each rank scores its share of the held-out images, the counts are summed),
learning rate and seconds.

Afterwards rank 0 trains the same model in one process, without rackhub and
with the same hyperparameters (global batch --batch * N, same initial weights,
same data order, so each step sees the same images), and prints both held-out
accuracies side by side and how far its weights are from rank 0's. The two
runs differ only in the rounding of the gradient average (mean of the ranks'
means, in rank order, against one mean over the global batch); training
amplifies that in its fast phase (epochs 2-4), to ~1e-5 with 3 ranks here
but ~0.3 with 2, about as much as running the reference with 2 threads
instead of 1 does. --single runs only that reference (--ranks N picks the
run it mirrors).
"""
import argparse
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    sys.exit(f"digits_cnn.py: PyTorch is not installed for {sys.executable} ({e}): "
             f"apt-get install python3-torch")

SEED = 0          # model initialisation, data order
SPLIT_SEED = 42   # the train/held-out split
TEST_IMAGES = 450


def load_digits():
    """(x_train, y_train, x_test, y_test): float32 N x 1 x 8 x 8 in [0, 1], int64 labels."""
    try:
        from sklearn.datasets import load_digits as sk_load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as e:
        sys.exit(f"digits_cnn.py: scikit-learn is not installed for {sys.executable} ({e}); "
                 f"its digits images are this example's data (no download): "
                 f"apt-get install python3-sklearn")
    digits = sk_load_digits()
    x = (digits.images / 16.0).astype("float32")
    x_tr, x_te, y_tr, y_te = train_test_split(x, digits.target, test_size=TEST_IMAGES,
                                              random_state=SPLIT_SEED, stratify=digits.target)

    def images(a):
        return torch.from_numpy(a).unsqueeze(1)

    def labels(a):
        return torch.from_numpy(a).long()

    return images(x_tr), labels(y_tr), images(x_te), labels(y_te)


def make_model():
    torch.manual_seed(SEED)
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),                                   # 32 x 4 x 4
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 64), nn.ReLU(),
        nn.Linear(64, 10))


class Local:
    """One process, no communication: the reference run."""
    rank, size = 0, 1

    def allreduce(self, t, name, average):
        return t


class Hub:
    """The ranks of a rackhub-run job (rackhub.torch, Horovod-style API)."""

    def __init__(self):
        try:
            import rackhub.torch as hvd
        except ImportError as e:
            sys.exit(f"digits_cnn.py: cannot import rackhub.torch ({e}); run it through the "
                     f"launcher, build/bin/rackhub-run -n 3 python3 {sys.argv[0]}, or "
                     f"without rackhub: --single")
        self.hvd = hvd
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()

    def allreduce(self, t, name, average):
        hvd = self.hvd
        return hvd.allreduce(t, name=name, op=hvd.Average if average else hvd.Sum)


def train(comm, data, a, ranks, log):
    """Trains for a.epochs; returns (model, held-out accuracy in %, seconds).

    comm.size ranks each take a.batch images per step; a Local comm takes
    a.batch * ranks images per step instead, the same images as `ranks` ranks
    would together (positions s*B*ranks .. (s+1)*B*ranks-1 of the epoch's
    order are exactly what the ranks' strided shares hold at step s)."""
    x_tr, y_tr, x_te, y_te = data
    rank, size = comm.rank, comm.size
    batch = a.batch * ranks // size
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    if isinstance(comm, Hub):
        hvd = comm.hvd
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=a.lr_step, gamma=0.1)

    order = torch.Generator().manual_seed(SEED)
    n = len(x_tr) - len(x_tr) % ranks          # every rank gets the same number of images
    steps = n // ranks // a.batch              # the last incomplete batch is dropped
    x_mine, y_mine = x_te[rank::size], y_te[rank::size]
    log(f"{'epoch':>5}  {'train loss':>10}  {'held-out acc':>12}  {'lr':>7}  {'seconds':>7}")
    t_start = time.perf_counter()
    acc = 0.0
    for epoch in range(1, a.epochs + 1):
        t0 = time.perf_counter()
        lr = opt.param_groups[0]["lr"]
        perm = torch.randperm(len(x_tr), generator=order)[:n]
        mine = perm[rank::size]
        model.train()
        loss_sum = 0.0
        for s in range(steps):
            idx = mine[s * batch:(s + 1) * batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(x_tr[idx]), y_tr[idx])
            loss.backward()
            opt.step()
            loss_sum += loss.item()
        sched.step()

        model.eval()
        with torch.no_grad():
            correct = (model(x_mine).argmax(dim=1) == y_mine).sum().item()
        loss = comm.allreduce(torch.tensor([loss_sum / steps]), "train_loss", average=True)
        counts = comm.allreduce(torch.tensor([float(correct), float(len(y_mine))]),
                                "held_out_correct", average=False)
        acc = 100.0 * counts[0].item() / counts[1].item()
        log(f"{epoch:>5}  {loss.item():>10.4f}  {acc:>10.1f} %  {lr:>7.4f}  "
            f"{time.perf_counter() - t0:>7.2f}")
    return model, acc, time.perf_counter() - t_start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (momentum 0.9)")
    ap.add_argument("--lr-step", type=int, default=10,
                    help="epochs between learning-rate drops (x0.1, StepLR)")
    ap.add_argument("--batch", type=int, default=32, help="images per rank and step")
    ap.add_argument("--single", action="store_true",
                    help="only the one-process reference: plain torch, no rackhub")
    ap.add_argument("--ranks", type=int, default=3,
                    help="--single: mirror a run of this many ranks (global batch --batch * N)")
    ap.add_argument("--no-reference", action="store_true",
                    help="do not train the one-process reference after the distributed run")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    data = load_digits()
    x_tr, _, x_te, _ = data
    model_params = sum(p.numel() for p in make_model().parameters())

    if a.single:
        print(f"digits CNN ({model_params} parameters), one process, no rackhub: "
              f"{len(x_tr)} training / {len(x_te)} held-out 8x8 images, "
              f"batch {a.batch * a.ranks} (as {a.ranks} ranks x {a.batch}), "
              f"SGD lr {a.lr} momentum 0.9, lr x0.1 every {a.lr_step} epochs", flush=True)
        _, acc, secs = train(Local(), data, a, a.ranks, lambda s: print(s, flush=True))
        print(f"held-out accuracy: one process {acc:.1f} % ({a.epochs} epochs, {secs:.1f} s)")
        return 0

    comm = Hub()
    rank, size = comm.rank, comm.size
    log = (lambda s: print(s, flush=True)) if rank == 0 else (lambda s: None)
    workers = f"{size} worker" + ("s" if size != 1 else "")
    log(f"digits CNN ({model_params} parameters), {workers} through rackhub: "
        f"{len(x_tr)} training / {len(x_te)} held-out 8x8 images, "
        f"batch {a.batch} per worker ({a.batch * size} per step), "
        f"SGD lr {a.lr} momentum 0.9, lr x0.1 every {a.lr_step} epochs")
    model, acc, secs = train(comm, data, a, size, log)
    comm.hvd.shutdown()
    if rank != 0:
        return 0
    log(f"{workers} through rackhub: {a.epochs} epochs in {secs:.1f} s")
    if a.no_reference:
        log(f"held-out accuracy: {workers} through rackhub {acc:.1f} %")
        return 0
    log(f"the same model in one process (no rackhub, batch {a.batch * size}, "
        f"same initial weights and data order):")
    ref, ref_acc, ref_secs = train(Local(), data, a, size, log)
    diff = max((p - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))
    log(f"one process: {a.epochs} epochs in {ref_secs:.1f} s; largest difference between "
        f"its weights and rank 0's: {diff:.2g}")
    log(f"held-out accuracy: {workers} through rackhub {acc:.1f} % | "
        f"one process {ref_acc:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
