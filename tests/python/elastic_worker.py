"""One rank of the elastic tests (test_elastic.py, the demo and the bench):
a small linear model trained with rackhub.torch.elastic (TorchState, a
DistributedOptimizer over plain SGD, a commit after every step). Rank slot
s's batch of step t is a function of (t, s) only (elastic_model.batch), so
a single process can recompute every step from the members it had.

Prints, per committed step: `STEP t gen G members a,b,c loss L params HEX`
(HEX: a digest of the parameters' bytes after the step) and the wall time
it was committed (`at T`); `PID slot pid` at start, `RESET n` after each
reset; `OBJECTS t members ... ok|BAD ...` per step attempt (allgather_object,
broadcast_object from the last member, allgather's gradient and, with
--collectives, elastic_checks.py's reducescatter, sparse_allreduce_async,
alltoall and signed-zero sums, each checked against the members); with
--samples, `SAMPLES t epoch e members ... i,j,...` per step attempt (this
member's ElasticSampler indices of the step, printed before the step's
first round).
Stops after --steps steps or at the step in the file
RACKHUB_ELASTIC_DIR/stop-at (read every step; the test writes it well
ahead of the ranks, which move in lock step).
"""
import argparse
import os
import sys
import time

import torch

import elastic_checks
import elastic_model
import rackhub.torch as hvd


def sampler_errors(sampler, n):
    """The ElasticSampler's bad inputs each raise the documented error: "ok"
    or what went wrong."""
    cases = [(lambda: hvd.elastic.ElasticSampler(object()), TypeError,
              "ElasticSampler: dataset: an object with len(), got object"),
             (lambda: sampler.record_indices([n]), ValueError,
              f"ElasticSampler.record_indices: [{n}] not in [0, {n})"),
             (lambda: sampler.get_indices(-1, 2), ValueError,
              "ElasticSampler: batch_idx: a non-negative int, got -1"),
             (lambda: sampler.set_epoch("1"), TypeError,
              "ElasticSampler.set_epoch: an int, got '1'")]
    for call, kind, text in cases:
        try:
            call()
            return f"no error for {text!r}"
        except kind as e:
            if str(e) != text:
                return f"{e!r} instead of {text!r}"
    return "ok" if not sampler.processed_indices else "a bad record changed the sampler"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1 << 30)
    ap.add_argument("--quiet", action="store_true", help="print every 50th step only")
    ap.add_argument("--collectives", action="store_true",
                    help="check elastic_checks.py's collectives on every step attempt")
    ap.add_argument("--samples", type=int, default=0,
                    help="an ElasticSampler over this many indices (in the TorchState), "
                         "--batch of them per member and step, printed as SAMPLES")
    ap.add_argument("--batch", type=int, default=15)
    ap.add_argument("--hub-optimizer", action="store_true",
                    help="momentum SGD on the hub (hub_optimizer=True); STEP lines carry the "
                         "parameters' values (elastic_model.values) in place of the digest")
    a = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    slot = hvd.elastic.slot()
    print(f"PID {slot} {os.getpid()}", flush=True)
    stop_file = os.path.join(os.environ.get("RACKHUB_ELASTIC_DIR", "."), "stop-at")
    model = elastic_model.model()
    if a.hub_optimizer:
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=elastic_model.LR,
                            momentum=elastic_model.MOMENTUM),
            named_parameters=model.named_parameters(), hub_optimizer=True)
    else:
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=elastic_model.LR),
                                       named_parameters=model.named_parameters())
    digest = elastic_model.values if a.hub_optimizer else elastic_model.digest

    def on_reset():
        print(f"RESET {hvd.elastic.resets()} members {hvd.elastic.members()} "
              f"rank {hvd.rank()} size {hvd.size()}", flush=True)

    sampler = hvd.elastic.ElasticSampler(range(a.samples), seed=5) if a.samples else None
    if sampler is not None:
        print(f"SAMPLER-ERRORS {sampler_errors(sampler, a.samples)}", flush=True)
    extra = {"sampler": sampler} if sampler is not None else {}
    state = hvd.elastic.TorchState(model, opt, step=0, **extra)
    state.register_reset_callbacks([on_reset])

    def stop_at():
        try:
            with open(stop_file) as f:
                return int(f.read().strip())
        except (FileNotFoundError, ValueError):
            return a.steps

    @hvd.elastic.run
    def train(state):
        batch_idx = 0  # of the sampler's split since the last reset
        while state.step < min(a.steps, stop_at()):
            t = state.step
            if sampler is not None and batch_idx * a.batch >= len(sampler):
                sampler.set_epoch(sampler.epoch + 1)  # this epoch's indices are done
                batch_idx = 0
            members = hvd.elastic.members()
            if sampler is not None:
                # This member's indices of the step (what it would train on),
                # printed before the step's first round: a member killed right
                # after its last round is in the committed step (its gradient
                # is), so its line must be out by then.
                print(f"SAMPLES {t} epoch {sampler.epoch} members "
                      f"{','.join(map(str, members))} "
                      f"{','.join(map(str, sampler.get_indices(batch_idx, a.batch))) or '-'}",
                      flush=True)
            x, y = elastic_model.batch(t, slot)
            opt.zero_grad()
            loss = elastic_model.loss(model, x, y)
            loss.backward()
            opt.step()
            # Object helpers and allgather's gradient by member (dense rank):
            # right whatever slots have left.
            seen = hvd.allgather_object(slot)
            root = hvd.broadcast_object(slot, root_rank=hvd.size() - 1)
            x = torch.full((1, 2), float(slot), requires_grad=True)
            g = hvd.allgather(x)  # (a membership change meanwhile: other rows, BAD below)
            w = torch.arange(float(g.numel())).view_as(g)
            (g * w).sum().backward()
            good = (seen == members and root == members[-1] and g.shape[0] == len(members) and
                    torch.equal(x.grad, len(members) * w[hvd.rank():hvd.rank() + 1]))
            # reducescatter, sparse_allreduce, alltoall, signed zeros by member.
            failed = elastic_checks.run(t, slot, members) if a.collectives else []
            verdict = "ok" if good and not failed else \
                f"BAD {seen} {root} {x.grad.tolist()} {failed}"
            print(f"OBJECTS {t} members {','.join(map(str, members))} {verdict}", flush=True)
            if sampler is not None:  # recorded before the commit that keeps it
                sampler.record_batch(batch_idx, a.batch)
                batch_idx += 1
            state.step = t + 1
            line = (f"STEP {t} gen {hvd.elastic.generation()} members "
                    f"{','.join(map(str, hvd.elastic.members()))} loss {loss.item():.6f} "
                    f"params {digest(model)}")
            try:
                state.commit()
            except hvd.HostsUpdatedInterrupt:
                print(f"{line} at {time.time():.6f}", flush=True)  # saved, then interrupted
                raise
            if not a.quiet or t % 50 == 0:
                print(f"{line} at {time.time():.6f}", flush=True)

    train(state)
    print(f"DONE {slot} step {state.step} params {digest(model)}", flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
