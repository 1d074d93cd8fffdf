"""The model, data and single-process reference of the elastic tests
(elastic_worker.py, test_elastic.py): what a step does, computed the same
way in a rank and in the reference, so the reference's parameters equal
the ranks' bit for bit (CPU, one thread, the same ops in the same order).

The hub's mean over the members of a step: the fp32 sum of their
gradients in rank order (hub ranks ascending), times float32(1 / count)
(docs/elastic.md); plain SGD then adds -lr times it.
"""
import hashlib

import torch

IN, OUT, ROWS = 16, 4, 8
LR = 0.05


def model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(IN, 8), torch.nn.Tanh(), torch.nn.Linear(8, OUT))


_TRUE = torch.Generator().manual_seed(99)
_W = torch.randn(IN, OUT, generator=_TRUE)


def batch(step, slot):
    g = torch.Generator().manual_seed(step * 1009 + slot)
    x = torch.randn(ROWS, IN, generator=g)
    return x, x @ _W


def loss(m, x, y):
    return torch.nn.functional.mse_loss(m(x), y)


def digest(m):
    h = hashlib.sha256()
    for p in m.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def reference_step(m, step, members):
    """One step of the job on the single-process model `m` with the hub
    ranks `members`: returns the loss of the first member's batch (what
    that rank printed)."""
    grads = []
    losses = []
    for s in sorted(members):
        m.zero_grad()
        x, y = batch(step, s)
        l = loss(m, x, y)
        l.backward()
        losses.append(l.item())
        grads.append([p.grad.detach().clone() for p in m.parameters()])
    scale = torch.tensor(1.0 / len(members), dtype=torch.float32)
    with torch.no_grad():
        for i, p in enumerate(m.parameters()):
            total = torch.zeros_like(p)
            for g in grads:
                total = total + g[i]
            p.grad = total * scale
    torch.optim.SGD(m.parameters(), lr=LR).step()  # what the ranks' wrapped SGD does
    return losses
