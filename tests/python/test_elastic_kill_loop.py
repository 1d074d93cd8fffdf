"""rackhub.torch.elastic under repeated kill -9 at random points
(docs/elastic.md, "Python"): rackhub-run -n 4 --min-np 2 --max-np 8 runs
elastic_worker.py --collectives --samples 432 --batch 12; KILLS times, the
test waits for a committed step of ranks 0-3, kills a random rank of 1..3
with SIGKILL 0-150 ms later (during the next step's rounds, its commit, or
between steps), waits for a step of the survivors, asks for one more rank
(rackhub-run --add 1: it takes the victim's hub rank) and waits for a step
of 0-3 again. Then the job stops and must exit 0.

Checks (test_elastic.py): every committed step bit for bit against the
single-process reference of its members; the collectives checked by every
rank on every committed step (reducescatter, alltoall, sparse_allreduce,
signed zeros, the object helpers); the ElasticSampler's indices: every
epoch that ended holds every index exactly once (432 divides by 4 x 12
and 3 x 12, and every step takes a multiple of 12, so no padding applies).
argv: transport, kills (default 5), seed (default: from the clock, printed);
`--hub-optimizer` anywhere: the workers' DistributedOptimizer runs momentum
SGD on the hub (hub_optimizer=True: TorchState commits on the hub and rolls
back after a failure, docs/elastic.md "Hub optimizers"), and every
committed step is compared with the momentum reference within
test_elastic.HUB_RTOL/HUB_ATOL.
"""
import os
import random
import signal
import subprocess
import sys
import time

import harness

harness.require_torch()

from test_elastic import (STEP, Job, Verdict, check_against_reference,  # noqa: E402
                          check_objects, check_samples)

SAMPLES, BATCH = 432, 12


def step_of(members):
    def pred(line):
        m = STEP.match(line)
        return bool(m) and m.group(4) == members
    return pred


def main():
    hub = "--hub-optimizer" in sys.argv
    argv = [x for x in sys.argv if x != "--hub-optimizer"]
    transport = argv[1] if len(argv) > 1 else "tcp"
    kills = int(argv[2]) if len(argv) > 2 else 5
    seed = int(argv[3]) if len(argv) > 3 else time.time_ns() % 1000003
    print(f"seed {seed} (rerun: test_elastic_kill_loop.py {transport} {kills} {seed}"
          f"{' --hub-optimizer' if hub else ''})", flush=True)
    rng = random.Random(seed)
    job = Job(transport, worker_args=("--collectives", "--samples", str(SAMPLES),
                                      "--batch", str(BATCH))
              + (("--hub-optimizer",) if hub else ()))
    with Verdict(job) as verdict:
        i = job.wait_index(step_of("0,1,2,3"), "a step of ranks 0-3")
        for k in range(kills):
            victim = rng.choice([1, 2, 3])
            delay = rng.uniform(0.0, 0.15)
            i = job.wait_index(step_of("0,1,2,3"), f"a step of ranks 0-3 before kill {k}", i)
            with open(os.path.join(job.job, f"pid-{victim}")) as f:
                pid = int(f.read())
            time.sleep(delay)  # the random point of the kill, not a synchronization
            os.kill(pid, signal.SIGKILL)
            print(f"kill {k}: rank {victim} (pid {pid}) {delay * 1000:.0f} ms after a step",
                  flush=True)
            survivors = ",".join(str(s) for s in range(4) if s != victim)
            i = job.wait_index(step_of(survivors), f"a step of the survivors {survivors}", i)
            r = subprocess.run([job.run, "--add", "1", "--job", job.job], capture_output=True,
                               text=True, timeout=30)
            assert r.returncode == 0, f"rackhub-run --add: {r.returncode} {r.stderr}"
            i = job.wait_index(step_of("0,1,2,3"), f"a step of ranks 0-3 after kill {k}", i)
        stop = job.stop_after(5)
        code = job.finish()
        assert code == 0, f"rackhub-run exited with {code}"
        checked = check_against_reference(job.steps(), stop, hub=hub)
        sequence = checked[0]
        if hub:
            print(f"parameters within the tolerance of the reference on every committed step "
                  f"(largest difference {checked[3]:.3g})")
        print(f"collectives right on {check_objects(job.lines)} committed steps")
        print(f"ElasticSampler epochs (epoch, memberships): "
              f"{check_samples(job.lines, job.steps(), SAMPLES, kill_inside=False)}")
        print(f"memberships (first step, members): {sequence}")
        assert len(sequence) == 2 * kills + 1, sequence
    return verdict.code


if __name__ == "__main__":
    sys.exit(main())
