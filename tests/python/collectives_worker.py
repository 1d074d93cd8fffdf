"""One rank of test_collectives.py (run by rackhub-run with 3 ranks): every
collective and client option of rackhub.torch from Python, checked on every
rank. Prints `CHECK ok|FAIL name detail` per check and `CHECKS n failed k`;
exits 1 if any failed."""
import os

import numpy as np
import torch

import rackhub
import rackhub.torch as hvd
from checks import check, raises, summary


def values_of(seed):
    """The tensors a rank would broadcast (deterministic by seed): every
    dtype that has a pitfall (-0.0, a NaN payload, int64 counters, bf16, bool,
    an empty tensor)."""
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(1000, generator=g)
    f[0] = -0.0
    f[1:2].view(torch.int32).fill_(0x7FC01234)  # a NaN with a payload
    # "odd" first: 3 floats put the int64 tensor at a byte offset that is not
    # a multiple of 8 (a BatchNorm's num_batches_tracked after odd weights).
    return {"odd": torch.randn(3, generator=g), "w": f,
            "steps": torch.tensor([seed * 1_000_003, -5], dtype=torch.int64),
            "half": torch.randn(3, 7, generator=g).to(torch.bfloat16),
            "mask": torch.rand(17, generator=g) > 0.5, "empty": torch.empty(0, 4)}


def same_bytes(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and \
        torch.equal(a.contiguous().view(-1).view(torch.uint8),
                    b.contiguous().view(-1).view(torch.uint8))


def collectives(rank, size):
    # broadcast_parameters from every root, every dtype, bit for bit.
    for root in range(size):
        mine = values_of(100 + rank)
        hvd.broadcast_parameters(mine, root_rank=root)
        want = values_of(100 + root)
        check(f"broadcast_parameters root {root}", all(same_bytes(mine[k], want[k]) for k in want))
    # A mismatch is an error on every rank, and the channel stays usable.
    extra = {"a": torch.zeros(3)} if rank != 1 else {"a": torch.zeros(3), "b": torch.zeros(2)}
    ok, detail = raises(lambda: hvd.broadcast_parameters(extra, root_rank=0), ValueError,
                        "the ranks pass different tensors")
    check("broadcast_parameters mismatch", ok, detail)
    t = torch.full((5,), float(rank))
    check("broadcast (new tensor)", torch.equal(hvd.broadcast(t, 2), torch.full((5,), 2.0))
          and t[0].item() == rank)
    hvd.broadcast_(t, 1)
    check("broadcast_ (in place)", torch.equal(t, torch.full((5,), 1.0)))
    obj = {"epoch": 7, "name": "x" * 20000, "t": torch.arange(5)} if rank == 1 else None
    got = hvd.broadcast_object(obj, root_rank=1)
    check("broadcast_object (20 KB)", got["epoch"] == 7 and len(got["name"]) == 20000
          and torch.equal(got["t"], torch.arange(5)))
    big = torch.arange(300_000, dtype=torch.float64) * (rank + 1)  # 2.4 MB: several rounds
    hvd.broadcast_(big, 2)
    check("broadcast_ 2.4 MB", torch.equal(big, torch.arange(300_000, dtype=torch.float64) * 3))
    ok, detail = raises(lambda: hvd.broadcast(t, size), ValueError, "root_rank")
    check("broadcast bad root", ok, detail)
    ok, detail = raises(lambda: hvd.broadcast(t, 0 if rank else 1), ValueError,
                        "different roots")
    check("broadcast roots disagree", ok, detail)
    ok, detail = raises(lambda: hvd.broadcast_object(lambda: 0, root_rank=2), ValueError,
                        "cannot pickle" if rank == 2 else "rank(s) [2] could not take part")
    check("broadcast_object unpicklable on the root: every rank raises", ok, detail)
    # allreduce: mean, sum, dtypes, in place.
    x = torch.full((1000,), float(rank + 1))
    check("allreduce Average", torch.equal(hvd.allreduce(x, name="x"),
                                           torch.full((1000,), (1 + 2 + 3) / 3.0)))
    check("allreduce Sum", torch.equal(hvd.allreduce(x, op=hvd.Sum), torch.full((1000,), 6.0)))
    check("allreduce average=False", torch.equal(hvd.allreduce(x, average=False),
                                                 torch.full((1000,), 6.0)))
    i = torch.tensor([rank, 10 * rank], dtype=torch.int32)
    r = hvd.allreduce(i, op=hvd.Sum)
    check("allreduce int32", r.dtype == torch.int32 and r.tolist() == [3, 30], str(r))
    h = hvd.allreduce(torch.full((4, 4), 0.5 * (rank + 1), dtype=torch.float16))
    check("allreduce fp16 tensor", h.dtype == torch.float16 and h.shape == (4, 4)
          and torch.all(h == 1.0).item(), str(h.flatten()[:3]))
    c = hvd.allreduce(torch.full((64,), 1.0 / 3), compression=hvd.Compression.bf16, op=hvd.Sum)
    check("allreduce bf16 compression", abs(c[0].item() - 1.0) < 1e-2, str(c[0].item()))
    y = torch.full((3,), float(rank))
    hvd.allreduce_(y, op=hvd.Sum)
    check("allreduce_", torch.equal(y, torch.full((3,), 3.0)))
    ok, detail = raises(lambda: hvd.allreduce(x, op=hvd.Adasum), ValueError, "Adasum")
    check("allreduce Adasum refused", ok, detail)

    # allgather: the first dimension differs by rank.
    mine = torch.arange((rank + 1) * 3, dtype=torch.int64).view(rank + 1, 3) + 100 * rank
    g = hvd.allgather(mine)
    want = torch.cat([torch.arange((r + 1) * 3, dtype=torch.int64).view(r + 1, 3) + 100 * r
                      for r in range(size)])
    check("allgather", torch.equal(g, want), str(g.shape))
    check("allgather_object", hvd.allgather_object({"r": rank}) == [{"r": r} for r in range(size)])
    bad = torch.zeros(2, 3 + (rank == 2))
    ok, detail = raises(lambda: hvd.allgather(bad), ValueError, "differ beyond dimension 0")
    check("allgather shape mismatch", ok, detail)


def binding(rank):
    """The binding takes buffers, checks them, and names the problem."""
    c = hvd.client()
    key = c.declare_key("__test/binding", 8, "fp32", {"type": "sum-only"}, False)
    good = np.zeros(8, dtype=np.float32)
    ok, detail = raises(lambda: c.push_pull(key, np.zeros(8), good), TypeError, "float32")
    check("binding float64 refused", ok, detail)
    ok, detail = raises(lambda: c.push_pull(key, np.zeros((8, 2), np.float32)[:, 0], good),
                        ValueError, "C-contiguous")
    check("binding strided refused", ok, detail)
    ro = np.zeros(8, dtype=np.float32)
    ro.setflags(write=False)
    ok, detail = raises(lambda: c.push_pull(key, good, ro), ValueError, "read-only")
    check("binding read-only out refused", ok, detail)
    ok, detail = raises(lambda: c.wait(c.push_pull(key, np.zeros(7, np.float32), good)),
                        rackhub.RackhubError, "")
    check("binding wrong size refused", ok, detail)
    out = np.zeros(8, dtype=np.float32)
    c.wait(c.push_pull(key, np.full(8, rank + 1.0, dtype=np.float32), out))
    check("binding numpy push_pull", np.all(out == 2.0), str(out[:2]))  # mean of 1, 2, 3


def optimizers(rank):
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    ok, detail = raises(lambda: hvd.DistributedOptimizer(
        torch.optim.RMSprop(model.parameters()), model.named_parameters(), hub_optimizer=True),
        ValueError, "RMSprop")
    check("hub_optimizer RMSprop refused", ok, detail)
    ok, detail = raises(lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.1),
        model.named_parameters(), hub_optimizer=True), ValueError, "dampening")
    check("hub_optimizer dampening refused", ok, detail)
    ok, detail = raises(lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), op=hvd.Adasum),
        ValueError, "Adasum")
    check("op Adasum refused", ok, detail)

    # bf16 parameters, local optimizer; gradient clipping between
    # synchronize() and step() (Horovod's skip_synchronize pattern).
    m16 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                              torch.nn.Linear(16, 2)).to(torch.bfloat16)
    hvd.broadcast_parameters(m16.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m16.parameters(), lr=0.1),
                                   named_parameters=m16.named_parameters(), prefix="bf16/")
    for step in range(3):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank * 10 + step))
        opt.zero_grad()
        m16(x.to(torch.bfloat16)).float().pow(2).mean().backward()
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(m16.parameters(), 1.0)
        with opt.skip_synchronize():
            opt.step()
    flat = torch.cat([p.detach().float().view(-1) for p in m16.parameters()])
    every = hvd.allgather(flat.view(1, -1))
    check("bf16 parameters stay equal on every rank",
          all(torch.equal(every[0], every[r]) for r in range(every.shape[0]))
          and m16[0].weight.dtype == torch.bfloat16)

    # fp16 on the wire, hub-side Adam; the hub's values reach every rank.
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16, hub_optimizer=True,
                                   prefix="fp16/")
    before = model[0].weight.detach().clone()
    for step in range(3):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank * 10 + step))
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    w = model[0].weight.detach().view(1, -1)
    every = hvd.allgather(w)
    moved = (w.view(before.shape) - before).abs().max().item()
    check("fp16 wire, hub-side Adam", all(torch.equal(every[0], every[r])
                                          for r in range(every.shape[0])) and moved > 1e-3,
          f"moved {moved:.3g}")
    # One tenant, the same parameter names, three optimizers in turn (hub-side
    # SGD, then local with op=Sum, then op=Average): each gets its own keys,
    # and a dropped optimizer's hooks are gone.
    lin = torch.nn.Linear(4, 1, bias=False)
    torch.nn.init.constant_(lin.weight, 0.5)
    x = torch.full((1, 4), float(rank + 1))
    for mode, want in (("hub", None), ("sum", 6.0), ("average", 2.0)):
        o = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1),
                                     named_parameters=lin.named_parameters(), prefix="reuse/",
                                     op=hvd.Sum if mode == "sum" else hvd.Average,
                                     hub_optimizer=mode == "hub")
        o.zero_grad()
        lin(x).sum().backward()  # gradient = x
        o.synchronize()
        if want is not None:
            check(f"a later job's local optimizer with op={mode} gets its own keys",
                  torch.equal(lin.weight.grad, torch.full((1, 4), want)), str(lin.weight.grad))
        with o.skip_synchronize():
            o.step()
        del o
    if torch.cuda.is_available():
        mc = torch.nn.Linear(4, 2).cuda()
        optc = hvd.DistributedOptimizer(torch.optim.SGD(mc.parameters(), lr=0.1),
                                        named_parameters=mc.named_parameters(), prefix="cuda/")
        optc.zero_grad()
        mc(torch.ones(2, 4, device="cuda")).sum().backward()
        optc.step()
        check("CUDA parameters staged through pinned memory", mc.weight.is_cuda)
    else:
        print("CHECK skip CUDA parameters: torch has no CUDA device here (staging through "
              "pinned host memory is untested on this machine)", flush=True)


def options(rank, size):
    """Transport and rack from Python; local rank/size from host names."""
    for transport in ("tcp", "shm", "auto"):
        hvd.init(transport=transport)
        want = "shm" if transport == "auto" else transport
        check(f"transport {transport}", hvd.client().transport == want, hvd.client().transport)
        hvd.shutdown()
    ok, detail = raises(lambda: hvd.init(transport="rdma", connect_timeout=5),
                        rackhub.RackhubError, "")
    check("transport rdma without a device fails init", ok and not hvd.is_initialized(), detail)
    ok, detail = raises(lambda: hvd.init(transport="carrier-pigeon"), ValueError, "transport")
    check("unknown transport refused", ok, detail)
    ok, detail = raises(lambda: hvd.init(rack=3, racks=4, connect_timeout=5),
                        rackhub.RackhubError, "rack")
    check("rack 3 on a one-rack hub refused", ok and not hvd.is_initialized(), detail)
    ok, detail = raises(lambda: hvd.init(rack=3), ValueError, "rack")
    check("rack 3 of 1 refused", ok, detail)
    for v in ("RACKHUB_LOCAL_RANK", "RACKHUB_LOCAL_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(v, None)
    hvd.init()  # collective: the ranks compare host names
    check("local rank/size from host names",
          (hvd.local_rank(), hvd.local_size()) == (rank, size),
          f"{hvd.local_rank()} of {hvd.local_size()}")
    hvd.shutdown()
    # torchrun's variables in place of rackhub-run's.
    host, port = os.environ.pop("RACKHUB_HUB").rsplit(":", 1)
    for v in ("RACKHUB_RANK", "RACKHUB_WORLD_SIZE"):
        os.environ.pop(v)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(size), MASTER_ADDR=host, RACKHUB_PORT=port)
    hvd.init()
    got = (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())
    check("torchrun's RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_ADDR",
          got == (rank, size, rank, size), str(got))


def main():
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    check("rank/size/local from rackhub-run",
          (hvd.local_rank(), hvd.local_size(), size) == (rank, 3, 3),
          f"{rank} {size} {hvd.local_rank()} {hvd.local_size()}")
    collectives(rank, size)
    binding(rank)
    optimizers(rank)
    hvd.shutdown()
    options(rank, size)
    hvd.shutdown()
    return summary()


if __name__ == "__main__":
    raise SystemExit(main())
