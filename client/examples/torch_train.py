"""Data-parallel training of a small MLP through a rackhub hub (rackhub.torch).

    build/bin/rackhub-run -n 2 python3 client/examples/torch_train.py
    build/bin/rackhub-run -n 4 python3 client/examples/torch_train.py --optimizer local-adam

The data set is synthetic and learnable: inputs x ~ N(0, I) in 64 dimensions,
labels = argmax of a fixed random "teacher" network (10 classes). Each rank
draws its own batches on the fly (seeded by rank and step); a held-out set
measures accuracy. Rank 0 prints the loss averaged over all ranks, the
accuracy and the throughput (samples/s over all ranks).
"""
import argparse
import time

import torch

import rackhub.torch as rh

IN, CLASSES = 64, 10


def teacher():
    g = torch.Generator().manual_seed(1234)
    w1 = torch.randn(IN, 128, generator=g) / IN ** 0.5
    w2 = torch.randn(128, CLASSES, generator=g) / 128 ** 0.5
    return lambda x: (torch.tanh(x @ w1) @ w2).argmax(dim=1)


def batch(label, seed, n):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, IN, generator=g)
    return x, label(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64, help="per rank")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--optimizer", default="momentum",
                    choices=["momentum", "adam", "local-sgd", "local-adam"],
                    help="momentum/adam run on the hub; local-* = sum-only + torch.optim")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    rh.init()
    rank, size = rh.rank(), rh.size()
    torch.manual_seed(100 + rank)  # different on purpose: broadcast makes them equal
    model = torch.nn.Sequential(
        torch.nn.Linear(IN, a.hidden), torch.nn.ReLU(),
        torch.nn.Linear(a.hidden, a.hidden), torch.nn.ReLU(),
        torch.nn.Linear(a.hidden, CLASSES))
    rh.broadcast_parameters(model)

    if a.optimizer == "momentum":
        opt = rh.DistributedOptimizer(rh.SGD(lr=a.lr or 0.05, momentum=0.9),
                                      named_parameters=model.named_parameters())
    elif a.optimizer == "adam":
        opt = rh.DistributedOptimizer(rh.Adam(lr=a.lr or 2e-3),
                                      named_parameters=model.named_parameters())
    elif a.optimizer == "local-sgd":
        opt = rh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=a.lr or 0.05,
                                                      momentum=0.9),
                                      named_parameters=model.named_parameters())
    else:
        opt = rh.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=a.lr or 2e-3),
                                      named_parameters=model.named_parameters())

    label = teacher()
    x_test, y_test = batch(label, 999_999, 2048)
    loss_fn = torch.nn.CrossEntropyLoss()
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"{size} ranks, MLP {IN}-{a.hidden}-{a.hidden}-{CLASSES} ({n} parameters), "
              f"optimizer {a.optimizer}, batch {a.batch}/rank", flush=True)
    t0 = time.perf_counter()
    window = 0.0
    for step in range(1, a.steps + 1):
        x, y = batch(label, 1_000_003 * rank + step, a.batch)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        window += loss.item()
        if step % a.log_every == 0 or step == a.steps:
            k = a.log_every if step % a.log_every == 0 else step % a.log_every
            mean_loss = rh.allreduce(torch.tensor([window / k]), name="loss").item()
            window = 0.0
            dt = time.perf_counter() - t0
            if rank == 0:
                with torch.no_grad():
                    acc = (model(x_test).argmax(1) == y_test).float().mean().item()
                print(f"step {step:5d}  loss {mean_loss:.4f}  test acc {acc:.3f}  "
                      f"{step * a.batch * size / dt:8.0f} samples/s  "
                      f"{1000 * dt / step:.2f} ms/step", flush=True)
    # Every rank holds the same parameters.
    digest = torch.cat([p.detach().view(-1) for p in model.parameters()]).sum().item()
    print(f"rank {rank}: done, parameter checksum {digest:.6f}", flush=True)
    rh.shutdown()


if __name__ == "__main__":
    main()
