"""DistributedOptimizer across a hub restart (kill -9) and with
on_rollback="raise": the client reconnects by itself; the first step after
the restart raises RolledBack inside the optimizer, which pulls the hub's
parameters into the model, logs a warning and skips the step; training then
goes on. With on_rollback="raise" the RolledBack exception reaches the
caller (with .iteration), and a pull lets it continue."""
import logging
import os
import signal
import subprocess
import sys
import time

import harness

harness.require_torch()

import torch  # noqa: E402

import rackhub  # noqa: E402
import rackhub.torch as rh  # noqa: E402


def restart(hub):
    """SIGKILL, then the same daemon again on the same ports and state dir."""
    hub.proc.send_signal(signal.SIGKILL)
    hub.proc.wait()
    ready = os.path.join(hub.dir, "ready2")
    hub.proc = subprocess.Popen(
        [os.path.join(hub.bin, "rackhubd"), "--admin-listen", hub.admin,
         "--data-listen", hub.data, "--metrics-listen", "127.0.0.1:0",
         "--admin-token-file", hub.admin_token,
         "--ready-file", ready, "--lanes", "2", "--no-pin-lanes",
         "--state-dir", os.path.join(hub.dir, "state")],
        stdout=hub.log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not os.path.exists(ready):
        time.sleep(0.05)
    if not os.path.exists(ready):
        raise RuntimeError("rackhubd did not restart:\n" + hub.log_text())


def train_steps(model, opt, n, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(8, 4, generator=g)
        y = torch.randn(8, 2, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


class Capture(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


def main():
    hub = harness.Hub(lanes=2)
    ok = True
    cap = Capture()
    logging.getLogger("rackhub.torch").addHandler(cap)
    try:
        token = hub.create_tenant("rb", 1)
        rh.init(rank=0, size=1, hub=hub.data, tenant="rb", token=token, op_timeout=20)
        torch.manual_seed(1)
        model = torch.nn.Linear(4, 2)
        opt = rh.DistributedOptimizer(rh.SGD(lr=0.1), named_parameters=model.named_parameters())
        train_steps(model, opt, 3, seed=1)
        c = rh.client()
        key = opt._rackhub.slots[0].key
        before = c.key_info(key)["next_iteration"]
        print(f"before the restart: next_iteration {before}")
        ok &= before == 3

        restart(hub)
        # The first step after the restart is skipped and resynchronized.
        train_steps(model, opt, 1, seed=2)
        info = c.key_info(key)
        print(f"after the resync: {info}, skipped_steps {opt.skipped_steps}, "
              f"reconnects {c.reconnects}, warnings {cap.records}")
        ok &= opt.skipped_steps == 1 and c.reconnects >= 1
        ok &= any("step skipped" in r and "RolledBack" in r for r in cap.records)
        ok &= not info["resync_needed"]
        it = info["next_iteration"]
        ok &= it < before
        # Model == hub's parameters of that version.
        buf = torch.empty(model.weight.numel())
        c.wait(c.pull(opt._rackhub.slots[0].key, buf.numpy()))
        same = torch.equal(buf.view_as(model.weight), model.weight.data)
        print(f"model weight equals the hub's: {same}")
        ok &= same
        train_steps(model, opt, 2, seed=3)
        after = c.key_info(key)["next_iteration"]
        print(f"two more steps: next_iteration {after} (expected {it + 2})")
        ok &= after == it + 2 and opt.skipped_steps == 1

        # on_rollback="raise": the exception reaches the caller.
        model2 = torch.nn.Linear(4, 2)  # its own hooks: one optimizer per model
        opt2 = rh.DistributedOptimizer(rh.SGD(lr=0.1), named_parameters=model2.named_parameters(),
                                       prefix="raise/", on_rollback="raise")
        train_steps(model2, opt2, 2, seed=4)
        restart(hub)
        raised = None
        try:
            train_steps(model2, opt2, 1, seed=5)
        except rackhub.RolledBack as e:
            raised = e
        print(f"on_rollback='raise': {type(raised).__name__}: {raised} "
              f"(code {getattr(raised, 'code', None)}, iteration "
              f"{getattr(raised, 'iteration', None)})")
        ok &= raised is not None and raised.code == "ROLLED_BACK" and \
            isinstance(raised, rackhub.RackhubError)
        if raised is not None:
            k2 = opt2._rackhub.slots[0].key
            ok &= c.key_info(k2)["resync_needed"] and raised.iteration == \
                c.key_info(k2)["next_iteration"]
            # The caller resyncs by hand (a pull of every key), then goes on.
            # Rolled back to 0 by a hub without a checkpoint: the from_client
            # keys have no values, rank 0 supplies them again first.
            for s in opt2._rackhub.slots:
                try:
                    c.wait(c.init(s.key, s.param.data.numpy()))
                except rackhub.RackhubError as e:
                    if e.wire != "INVALID_ARGUMENT":
                        raise
            for s in opt2._rackhub.slots:
                buf = torch.empty(s.param.numel())
                c.wait(c.pull(s.key, buf.numpy()))
                with torch.no_grad():
                    s.param.data.copy_(buf.view_as(s.param))
            before2 = c.key_info(k2)["next_iteration"]
            train_steps(model2, opt2, 1, seed=6)
            ok &= c.key_info(k2)["next_iteration"] == before2 + 1
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        print(f"FAIL: {e}")
        ok = False
    finally:
        try:
            rh.shutdown()
        except Exception:  # noqa: BLE001
            pass
        hub.stop()
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
