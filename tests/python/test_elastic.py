"""rackhub.torch.elastic end to end (docs/elastic.md, "Python"): rackhub-run
--min-np 2 --max-np 8 starts 4 ranks of elastic_worker.py (a commit after
every step) on a hub it starts (straggler timeout 60 s) over TCP or shared
memory (argv[1]). The test kills rank 2 with SIGKILL while the job trains,
waits for the survivors' first step with members 0,1,3, then asks the
launcher for two more ranks (rackhub-run --add 2: they take hub ranks 2 and
4), waits for a step with 5 members and lets the job end.

Checks: the launcher exits 0; every step 0..N-1 was committed once, with
one membership and one parameter digest on every rank that printed it;
the membership goes 0-3, then 0,1,3, then 0-4; the parameters after every
step equal, bit for bit, those of a single-process reference that applied
the same steps with the same members (elastic_model.reference_step: the
mean of the members' gradients in rank order, then SGD), and every printed
loss is the reference's; the loss at the end is below the loss at step 0.
The workers run with --collectives (elastic_checks.py: reducescatter,
grouped_reducescatter, alltoall, sparse_allreduce and signed-zero sums by
member, each step against references from the members; check_objects) and
--samples 1800 (an ElasticSampler in the TorchState: check_samples, every
epoch that ended holds every index exactly once, the kill inside one).

Every wait is for a line of the job's output, bounded by 50 s (below the
straggler timeout): a survivor that waited for the straggler timeout
instead of going on fails the test as a timeout, not a timing assert.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import harness

harness.require_torch()

import elastic_model  # noqa: E402
import torch  # noqa: E402

EVENT_TIMEOUT = 50.0
STEP = re.compile(r"^\[(\d+)\] STEP (\d+) gen (\d+) members ([\d,]+) loss (\S+) params (\S+) "
                  r"at (\S+)$")


class Job:
    def __init__(self, transport, n=4, extra=(), worker_args=(), max_np=8):
        self.dir = tempfile.mkdtemp(prefix="rackhub-elastic-test.")
        self.job = os.path.join(self.dir, "job")
        self.run = os.path.join(os.environ["RACKHUB_BIN_DIR"], "rackhub-run")
        env = dict(os.environ, RACKHUB_TRANSPORT=transport)
        worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_worker.py")
        self.p = subprocess.Popen(
            [self.run, "-n", str(n), "--min-np", "2", "--max-np", str(max_np), "--lanes", "2",
             "--job-dir", self.job, "--max-restarts", "0",
             "--hub-arg=--straggler-timeout-ms", "--hub-arg=60000"] + list(extra)
            + ["python3", worker] + list(worker_args), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
            env=env)
        self.lines = []
        self.cv = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            with self.cv:
                self.lines.append(line.rstrip("\n"))
                self.cv.notify_all()
        with self.cv:
            self.lines.append(None)  # end of output
            self.cv.notify_all()

    def wait_for(self, pred, what):
        """The first line for which pred(line) is true (an event)."""
        return self.lines[self.wait_index(pred, what)]

    def wait_index(self, pred, what, start=0):
        """The index of the first line from `start` for which pred(line)."""
        deadline = time.monotonic() + EVENT_TIMEOUT
        seen = start
        with self.cv:
            while True:
                for i, line in enumerate(self.lines[seen:], seen):
                    if line is None:
                        raise AssertionError(f"the job ended before {what}")
                    if pred(line):
                        return i
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {what} within {EVENT_TIMEOUT:g} s")
                self.cv.wait(left)

    def steps(self):
        with self.cv:
            return [m for m in (STEP.match(x) for x in self.lines if x) if m]

    def stop_after(self, extra):
        last = max(int(m.group(2)) for m in self.steps())
        with open(os.path.join(self.job, ".stop"), "w") as f:
            f.write(f"{last + extra}\n")
        os.replace(os.path.join(self.job, ".stop"), os.path.join(self.job, "stop-at"))
        return last + extra

    def finish(self):
        try:
            self.p.wait(EVENT_TIMEOUT * 2)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            raise AssertionError("the job did not end")
        self.reader.join(10)
        return self.p.returncode

    def kill(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def step_with(members, after=0):
    def pred(line):
        m = STEP.match(line)
        return bool(m) and m.group(4) == members and int(m.group(2)) >= after
    return pred


# The hub_optimizer=True variant (--hub-optimizer): the hub's momentum SGD
# and the reference's torch ops round alike but not always bit for bit (the
# hub's vector kernels may fuse a multiply-add), so the values are compared
# within a float tolerance: a few float32 ulps per step, compounded over the
# run, stay below it; a step applied twice, or half applied, moves the
# parameters by about lr * |v| (1e-3 and more), far above it.
HUB_RTOL, HUB_ATOL = 1e-4, 2e-5


def check_against_reference(steps, stop, hub=False):
    """Every step committed once with one membership and digest; equal to
    the single-process reference (bit for bit; with `hub`, the values within
    HUB_RTOL/HUB_ATOL of the momentum reference). Returns [(step, members)]
    and the losses (with `hub` also the largest difference seen, last)."""
    by_step = {}
    for m in steps:
        slot, t, members, loss, digest = (int(m.group(1)), int(m.group(2)), m.group(4),
                                          m.group(5), m.group(6))
        entry = by_step.setdefault(t, (members, digest, {}))
        assert entry[0] == members and entry[1] == digest, (
            f"step {t}: ranks disagree: {entry[:2]} vs {(members, digest)} (rank {slot})")
        assert str(slot) in members.split(","), f"step {t}: rank {slot} not in {members}"
        entry[2][slot] = loss
    assert sorted(by_step) == list(range(stop)), (
        f"steps committed: {sorted(by_step)[:5]}...{sorted(by_step)[-5:]}, expected 0..{stop - 1}")
    ref = elastic_model.model()
    velocity = [torch.zeros_like(p) for p in ref.parameters()]
    sequence = []
    first_loss = last_loss = None
    worst = 0.0
    for t in range(stop):
        members, digest, losses = by_step[t]
        ranks = [int(x) for x in members.split(",")]
        if hub:
            ref_losses = elastic_model.reference_step_hub(ref, velocity, t, ranks)
            got, want = elastic_model.from_values(digest), elastic_model.flat(ref)
            diff = (got - want).abs()
            worst = max(worst, diff.max().item())
            assert torch.allclose(got, want, rtol=HUB_RTOL, atol=HUB_ATOL), (
                f"step {t} (members {members}): the ranks' parameters differ from the "
                f"reference by up to {diff.max().item():.3g} (tolerance rtol {HUB_RTOL}, "
                f"atol {HUB_ATOL})")
        else:
            ref_losses = elastic_model.reference_step(ref, t, ranks)
            got = elastic_model.digest(ref)
            assert got == digest, f"step {t} (members {members}): ranks {digest}, reference {got}"
        for slot, loss in losses.items():
            want = ref_losses[ranks.index(slot)]
            close = abs(float(loss) - want) <= HUB_RTOL * abs(want) + 1e-6 if hub else \
                loss == f"{want:.6f}"
            assert close, f"step {t}: rank {slot} loss {loss}, reference {want:.6f}"
        if not sequence or sequence[-1][1] != members:
            sequence.append((t, members))
        mean = sum(ref_losses) / len(ref_losses)
        first_loss = mean if first_loss is None else first_loss
        last_loss = mean
    if hub:
        return sequence, first_loss, last_loss, worst
    return sequence, first_loss, last_loss


def check_objects(lines):
    """Every committed step of a rank was preceded by its OBJECTS line for
    that step and those members saying ok (allgather_object, broadcast_object
    from the last member and allgather's gradient, right by member whatever
    slots have left). An attempt that a membership change failed may say BAD
    (its members were the old ones); it is redone, not committed. Returns
    the number of steps checked."""
    last, n = {}, 0
    for x in lines:
        m = re.match(r"^\[(\d+)\] OBJECTS (\d+) members (\S+) (.*)$", x or "")
        if m:
            last[m.group(1)] = (int(m.group(2)), m.group(3), m.group(4))
            continue
        s = re.match(r"^\[(\d+)\] STEP (\d+) gen \d+ members (\S+) ", x or "")
        if s:
            got = last.get(s.group(1))
            want = (int(s.group(2)), s.group(3), "ok")
            assert got == want, f"rank {s.group(1)} step {s.group(2)}: objects {got}"
            n += 1
    return n


def check_samples(lines, steps, samples, kill_inside=True):
    """The ElasticSampler's indices of the committed steps (each member's
    SAMPLES line for the step and its members, printed before the step's
    first round: a member killed after its last round is in the step): every epoch that ended holds every index of
    range(samples) exactly once, the last one no index twice; with
    kill_inside, the kill of rank 2 landed inside an epoch that ended.
    Returns [(epoch, memberships in it)]."""
    printed = {}
    for x in lines:
        m = re.match(r"^\[(\d+)\] SAMPLES (\d+) epoch (\d+) members (\S+) (\S+)$", x or "")
        if m:
            idx = [] if m.group(5) == "-" else [int(i) for i in m.group(5).split(",")]
            printed[(int(m.group(1)), int(m.group(2)), m.group(4))] = (int(m.group(3)), idx)
    committed = {}
    for m in steps:
        committed[int(m.group(2))] = m.group(4)
    epochs = []  # [epoch, [indices], [memberships]]
    for t in sorted(committed):
        members = committed[t]
        got = [printed.get((int(s), t, members)) for s in members.split(",")]
        assert all(g is not None for g in got), f"step {t}: a member's SAMPLES line is missing"
        assert len({g[0] for g in got}) == 1, f"step {t}: the members' epochs differ: {got}"
        if not epochs or epochs[-1][0] != got[0][0]:
            epochs.append([got[0][0], [], []])
        for g in got:
            epochs[-1][1].extend(g[1])
        if members not in epochs[-1][2]:
            epochs[-1][2].append(members)
    for e, idx, _ in epochs[:-1]:
        assert sorted(idx) == list(range(samples)), (
            f"epoch {e}: {len(idx)} indices, {len(set(idx))} distinct, missing "
            f"{sorted(set(range(samples)) - set(idx))[:10]}")
    assert len(epochs[-1][1]) == len(set(epochs[-1][1])), f"epoch {epochs[-1][0]}: an index twice"
    assert len(epochs) >= 2, f"no epoch ended: {[(e[0], e[2]) for e in epochs]}"
    assert not kill_inside or any("0,1,2,3" in e[2] and "0,1,3" in e[2] for e in epochs[:-1]), (
        f"the kill did not land inside an epoch that ended: {[(e[0], e[2]) for e in epochs]}")
    return [(e[0], e[2]) for e in epochs]


SAMPLES = 1800  # 30 steps of 4 x 15, 40 of 3 x 15, 24 of 5 x 15: no padding


class Verdict:
    """`with Verdict(job) as v:` around a scenario's checks: an
    AssertionError ends it as FAIL (named), the job is killed either way
    (then `cleanup`), the log's tail is printed unless it passed, and
    v.code is the test's exit code (0 PASSED, 1 FAILED)."""

    def __init__(self, job, cleanup=None):
        self.job, self.cleanup, self.code = job, cleanup, 1

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        ok = kind is None
        if kind is AssertionError:
            print(f"FAIL: {error}")
        self.job.kill()
        if self.cleanup:
            self.cleanup()
        if not ok:
            text = "\n".join(x for x in self.job.lines if x is not None)
            path = os.path.join(self.job.dir, "output.log")  # the whole of it
            with open(path, "w") as f:
                f.write(text + "\n")
            print(text[-20000:])
            print(f"(the job's whole output: {path})")
        print("PASSED" if ok else "FAILED")
        self.code = 0 if ok else 1
        return kind is AssertionError


def main():
    hub = "--hub-optimizer" in sys.argv  # momentum SGD on the hub (check_against_reference)
    argv = [x for x in sys.argv if x != "--hub-optimizer"]
    transport = argv[1] if len(argv) > 1 else "tcp"
    job = Job(transport, worker_args=("--collectives", "--samples", str(SAMPLES))
              + (("--hub-optimizer",) if hub else ()))
    with Verdict(job) as verdict:
        job.wait_for(step_with("0,1,2,3", after=5), "step 5 with members 0,1,2,3")
        pid_line = job.wait_for(lambda x: x.startswith("[2] PID 2 "), "rank 2's pid")
        victim = int(pid_line.split()[3])
        os.kill(victim, signal.SIGKILL)
        print(f"killed rank 2 (pid {victim}) with SIGKILL", flush=True)
        job.wait_for(step_with("0,1,3"), "a step of the survivors 0,1,3")
        r = subprocess.run([job.run, "--add", "2", "--job", job.job], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, f"rackhub-run --add: {r.returncode} {r.stderr}"
        job.wait_for(step_with("0,1,2,3,4"), "a step with members 0,1,2,3,4")
        stop = job.stop_after(20)
        code = job.finish()
        out = "\n".join(x for x in job.lines if x is not None)
        assert code == 0, f"rackhub-run exited with {code}"
        sequence, first, last = check_against_reference(job.steps(), stop, hub=hub)[:3]
        print(f"object helpers, allgather's gradient, reducescatter, sparse_allreduce, "
              f"alltoall and signed zeros right on {check_objects(job.lines)} committed steps")
        print(f"ElasticSampler epochs (epoch, memberships): "
              f"{check_samples(job.lines, job.steps(), SAMPLES)}")
        errors = [x for x in job.lines if x and " SAMPLER-ERRORS " in x]
        assert len(errors) == 6 and all(x.endswith(" ok") for x in errors), errors
        print(f"memberships (first step, members): {sequence}")
        print(f"mean loss: step 0 {first:.6f}, step {stop - 1} {last:.6f}")
        assert [s[1] for s in sequence] == ["0,1,2,3", "0,1,3", "0,1,2,3,4"], sequence
        assert last < first, "the loss did not go down"
        dones = re.findall(r"^\[(\d+)\] DONE \d+ step (\d+) params (\S+)$", out, re.M)
        assert sorted(int(d[0]) for d in dones) == [0, 1, 2, 3, 4], dones
        assert {(int(d[1]), d[2]) for d in dones} == {(stop, last_digest(job, stop))}, dones
    return verdict.code


def last_digest(job, stop):
    """The digest every rank printed for the last step."""
    return [m.group(6) for m in job.steps() if int(m.group(2)) == stop - 1][0]


if __name__ == "__main__":
    sys.exit(main())
