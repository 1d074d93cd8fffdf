"""The model, data and single-process reference of the elastic tests
(elastic_worker.py, test_elastic.py): what a step does, computed the same
way in a rank and in the reference, so the reference's parameters equal
the ranks' bit for bit (CPU, one thread, the same ops in the same order).

The hub's mean over the members of a step: the fp32 sum of their
gradients in rank order (hub ranks ascending), times float32(1 / count)
(docs/elastic.md); plain SGD then adds -lr times it.
"""
import base64
import hashlib

import torch

IN, OUT, ROWS = 16, 4, 8
LR = 0.05
MOMENTUM = 0.9  # the hub_optimizer=True variant: momentum SGD on the hub


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


def values(m):
    """The parameters' bytes (float32, in order), base64: what a rank of the
    hub_optimizer=True variant prints in place of the digest."""
    return base64.b64encode(b"".join(p.detach().contiguous().numpy().tobytes()
                                     for p in m.parameters())).decode()


def from_values(text):
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.float32)


def flat(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def _mean_grads(m, step, members):
    """Every member's loss, and the hub's mean of their gradients: the fp32
    sum in rank order times float32(1 / count)."""
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
    means = []
    for i, p in enumerate(m.parameters()):
        total = torch.zeros_like(p)
        for g in grads:
            total = total + g[i]
        means.append(total * scale)
    return losses, means


def reference_step_hub(m, velocity, step, members):
    """One step of the hub_optimizer=True variant on `m`: the hub's momentum
    SGD (v = mu * v + mean; p = p - lr * v, float32) with `velocity` (a list
    of tensors, updated in place). Returns the members' losses."""
    losses, means = _mean_grads(m, step, members)
    mu = torch.tensor(MOMENTUM, dtype=torch.float32)
    lr = torch.tensor(LR, dtype=torch.float32)
    with torch.no_grad():
        for p, v, d in zip(m.parameters(), velocity, means):
            v.copy_(mu * v + d)
            p.copy_(p - lr * v)
    return losses


def reference_step(m, step, members):
    """One step of the job on the single-process model `m` with the hub
    ranks `members`: returns the members' losses (rank order)."""
    losses, means = _mean_grads(m, step, members)
    with torch.no_grad():
        for p, d in zip(m.parameters(), means):
            p.grad = d
    torch.optim.SGD(m.parameters(), lr=LR).step()  # what the ranks' wrapped SGD does
    return losses
