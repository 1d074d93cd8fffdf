"""horovod_script.py (a Horovod script using async allreduces, a grouped
allreduce, join with uneven data, SyncBatchNorm and a process set) on W ranks under
rackhub-run; each rank's final parameters and BatchNorm statistics must
equal a single-process reference within 1e-5, and join() must return W - 1
everywhere.

The reference: one model, one torch.nn.BatchNorm1d in place of the
SyncBatchNorm (same initial values); at step k the batches of the ranks
that still have data (k < BASE + r) go through the model concatenated (so
BatchNorm sees the whole batch of those ranks), the loss is the sum of each
rank's mean-squared error on its slice, the gradient divided by W (a joined
rank counts as zeros in the average), SGD with momentum. Rank r's final
state is the reference's after its BASE + r steps.
Usage: test_horovod_script.py W"""
import os
import subprocess
import sys
import tempfile

import harness

harness.require_torch()
import torch  # noqa: E402

import horovod_script as hs  # noqa: E402


def reference(world):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(hs.IN, hs.HIDDEN), torch.nn.BatchNorm1d(hs.HIDDEN),
                                torch.nn.Tanh(), torch.nn.Linear(hs.HIDDEN, hs.OUT))
    opt = torch.optim.SGD(model.parameters(), lr=hs.LR, momentum=0.9)
    states = []
    for step in range(hs.BASE + world - 1):
        active = [r for r in range(world) if step < hs.BASE + r]
        xs, ys = zip(*[hs.batch(r, step) for r in active])
        out = model(torch.cat(xs))
        opt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(out[i * hs.BATCH:(i + 1) * hs.BATCH], y)
                   for i, y in enumerate(ys))
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.grad /= world
        opt.step()
        states.append({k: v.clone() for k, v in model.state_dict().items()})
    return states


def main():
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    run = os.path.join(os.environ["RACKHUB_BIN_DIR"], "rackhub-run")
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as out:
        r = subprocess.run([run, "-n", str(world), "--lanes", "2", "python3",
                            os.path.join(here, "horovod_script.py"), out],
                           capture_output=True, text=True, timeout=300, cwd=here)
        print(r.stdout + r.stderr)
        if r.returncode != 0:
            print(f"FAILED: rackhub-run exited {r.returncode}")
            return 1
        got = [torch.load(os.path.join(out, f"rank{k}.pt")) for k in range(world)]
    ref = reference(world)
    ok = True
    for k in range(world):
        want = ref[hs.BASE + k - 1]
        diff = max((got[k]["state"][n].double() - want[n].double()).abs().max().item()
                   for n in want)
        good = diff <= 1e-5 and got[k]["last"] == world - 1
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} rank {k}: after {hs.BASE + k} steps, max |diff| "
              f"vs the reference {diff:.3g} (parameters, running mean/var, batches tracked); "
              f"join() returned {got[k]['last']}")
    # The process set {0, 1}: the average of the two ranks' final first-layer
    # weights, on those two ranks only.
    want = (ref[hs.BASE - 1]["0.weight"].double() + ref[hs.BASE]["0.weight"].double()) / 2
    for k in range(world):
        got_mean = got[k]["pair_mean"]
        good = (got_mean is None) == (k > 1) and (
            got_mean is None or (got_mean.double() - want).abs().max().item() <= 1e-5)
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} rank {k}: process set [0, 1] average "
              f"{'absent (not a member)' if got_mean is None else 'vs the reference'}")
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
