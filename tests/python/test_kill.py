"""A rank killed (SIGKILL) in the middle of a step, during backward after some
of its gradients were pushed: every other rank must get a Python exception
(rackhub.RackhubError) from step() within a bounded time instead of hanging.
Bound checked: 10 s after the kill (the hub fails the tenant's pending pushes
with WORKER_LOST as soon as the victim's connections close)."""
import json
import os
import sys
import time

import harness

harness.require_torch()

WORLD, VICTIM, KILL_STEP, BOUND_S = 3, 1, 3, 10.0


def main():
    hub = harness.Hub(lanes=2)
    ok = True
    try:
        sc = {"name": "kill", "kind": "kill", "tenant": "kill", "steps": 50, "seed": 7,
              "token": hub.create_tenant("kill", WORLD), "victim": VICTIM,
              "kill_step": KILL_STEP, "out": os.path.join(hub.dir, "kill")}
        spec = os.path.join(hub.dir, "scenarios.json")
        with open(spec, "w") as f:
            json.dump([sc], f)
        here = os.path.dirname(os.path.abspath(__file__))
        t0 = time.monotonic()
        procs = [harness.spawn([os.path.join(here, "worker.py"), spec, str(r), str(WORLD),
                                hub.data]) for r in range(WORLD)]
        results = harness.collect(procs, timeout=90)
        print(f"all ranks ended after {time.monotonic() - t0:.1f} s")
        try:
            killed_at = float(open(sc["out"] + ".killed").read())
        except FileNotFoundError:
            print("FAIL: the victim did not reach the kill point")
            killed_at = None
            ok = False
        for r, (code, out) in enumerate(results):
            print(f"--- rank {r} (exit {code})\n{out.rstrip()}")
            if r == VICTIM:
                ok &= code == -9
                continue
            res = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
            if not res or killed_at is None:
                print(f"FAIL: rank {r} raised no rackhub.RackhubError")
                ok = False
                continue
            after = res[0]["time"] - killed_at
            good = (code == 0 and res[0]["raised"] in ("RackhubError", "WorkerLost") and after <= BOUND_S
                    and res[0]["step"] == KILL_STEP)
            ok &= good
            print(f"{'ok  ' if good else 'FAIL'} rank {r}: {res[0]['raised']} code={res[0]['code']} "
                  f"wire={res[0]['wire']} at step {res[0]['step']}, {after:.3f} s after the kill "
                  f"(bound {BOUND_S:g} s): {res[0]['message']}")
    finally:
        hub.stop()
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
