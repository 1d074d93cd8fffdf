#!/usr/bin/python3
"""Convergence under gradient compression: the digits CNN of the main demo
(client/examples/digits_cnn.py, deploy/demo.sh; 38,282 parameters) trained
by W=2 workers through a rackhub hub for a fixed number of steps, once per
compression of DistributedOptimizer(compression=...), same seeds:

    /usr/bin/python3 bench/torch/bench_compression.py                   # build/, seed 0
    /usr/bin/python3 bench/torch/bench_compression.py --build build-py --seeds 0,1,2 --json

Variants (--variants): none (fp32), fp16, topk:0.01 (error feedback),
topk:0.01:noef, topk:0.001 (error feedback); any compression string works.

Training is the demo's: each epoch both workers draw the same shuffled
order of the 1347 training images (a generator seeded with the seed) and
worker r takes positions r, r+2, ...; 32 images per worker and step (21
steps per epoch), the hub averages the gradients (local mode: sum-only
keys), each worker's torch.optim.SGD(lr 0.1, momentum 0.9) steps, the rate
x0.1 after 10 epochs (210 steps); --steps 315 = 15 epochs. Seed 0 is the
demo's initialization (digits_cnn.make_model); seed s > 0 re-initializes
the layers after torch.manual_seed(s) (the same distributions). Both workers
start from the same weights (no broadcast: nothing but the optimizer's
pushes touches the tenant, so the hub's byte counter is theirs).

Reported per variant (and seed): training loss = mean over the last epoch's
steps and both workers; held-out loss and accuracy on the 450 held-out
images after the last step (and after each epoch, for the curve); whether
both workers' final weights are bit-identical; bytes pushed per step and
worker:
  computed  from the keys: per chunk of n elements (the tenant's chunk size,
            8192 fp32 elements by default), dense 4n (fp16: 2n); top-k
            4 + (4 + 4) * k with k = ceil(ratio * n), or 4n when that is not
            smaller (the chunk is then sent dense; 4 + 8k >= 4n);
  measured  the hub's counter (rackhubctl stats: bytes_in of the tenant, push
            payloads plus a 40-byte frame header each), divided by steps x
            workers; "payload" is it minus the headers.
and bytes of the reply (hub -> worker) per step and worker: the tenant's
bytes_out counter (everything the hub wrote to the workers' connections:
one PARAMS frame per pushed chunk, plus the few replies to the start-up
calls) over steps x workers, "payload" = it minus a 40-byte header per
pushed chunk. The keys are sum-only (local mode): the reply is the averaged
gradient, dense for none/fp16 (4n or 2n per chunk) and sparse for top-k
(4 + 8 x the nonzeros of the chunk's average where smaller than 4n: at
most 4 + 8 x W x k, "bound").
"""
import argparse
import hashlib
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(ROOT, "client", "examples")
sys.path.insert(0, HERE)
from bench_mlp import Hub  # noqa: E402  (rackhubd on ephemeral ports, --in-memory)

VARIANTS = ["none", "fp16", "topk:0.01", "topk:0.01:noef", "topk:0.001"]
HEADER_BYTES = 40


# ---------------------------------------------------------------------------
# Rank process

def init_model(dc, seed):
    import torch
    model = dc.make_model()  # torch.manual_seed(digits_cnn.SEED) inside
    if seed != dc.SEED:
        torch.manual_seed(seed)
        for m in model.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
    return model


def rank_main(a):
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, EXAMPLES)
    import digits_cnn as dc
    import rackhub.torch as rh

    torch.set_num_threads(1)
    rank, world = a.rank, a.world
    x_tr, y_tr, x_te, y_te = dc.load_digits()
    model = init_model(dc, a.seed)
    # local_rank/local_size given: init does no collective (no helper-key
    # traffic on the tenant; its byte counter is the optimizer's pushes only).
    rh.init(rank=rank, size=world, hub=a.hub, tenant=a.tenant, token=a.token,
            local_rank=rank, local_size=world)
    opt = rh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9),
                                  named_parameters=model.named_parameters(),
                                  compression=a.compression)
    chunk = rh.client().chunk_elements
    sizes = [p.numel() for p in model.parameters()]

    def held_out():
        model.eval()
        with torch.no_grad():
            out = model(x_te)
            loss = F.cross_entropy(out, y_te).item()
            acc = 100.0 * (out.argmax(dim=1) == y_te).float().mean().item()
        model.train()
        return loss, acc

    order = torch.Generator().manual_seed(a.seed)
    n = len(x_tr) - len(x_tr) % world
    per_epoch = n // world // a.batch
    losses, curve = [], []
    step = 0
    t0 = time.perf_counter()
    while step < a.steps:
        perm = torch.randperm(len(x_tr), generator=order)[:n]
        mine = perm[rank::world]
        for s in range(per_epoch):
            if step == a.lr_drop_step:
                for g in opt.param_groups:
                    g["lr"] = a.lr * 0.1
            idx = mine[s * a.batch:(s + 1) * a.batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(x_tr[idx]), y_tr[idx])
            loss.backward()
            opt.step()
            losses.append(loss.item())
            step += 1
            if step % per_epoch == 0 or step == a.steps:
                curve.append([step, *held_out()])
            if step == a.steps:
                break
    secs = time.perf_counter() - t0
    h = hashlib.sha1()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    rh.shutdown()
    print("RESULT " + json.dumps({
        "rank": rank, "losses": losses, "curve": curve, "per_epoch": per_epoch,
        "chunk_elements": chunk, "sizes": sizes, "weights_sha1": h.hexdigest(),
        "seconds": secs, "skipped": opt.skipped_steps}), flush=True)
    return 0


# ---------------------------------------------------------------------------
# Driver

def pushed_bytes(compression, sizes, chunk):
    """Payload bytes one worker pushes per step (see the module docstring)."""
    total = 0
    for n_key in sizes:
        for first in range(0, n_key, chunk):
            n = min(chunk, n_key - first)
            if compression == "fp16" or compression == "bf16":
                total += 2 * n
            elif compression.startswith("topk:"):
                # aggregation::TopKCount of the key's fp32 ratio
                ratio = struct.unpack("f", struct.pack("f", float(compression.split(":")[1])))[0]
                k = min(max(math.ceil(ratio * n * (1.0 - 8 * sys.float_info.epsilon)), 1), n)
                total += 4 + 8 * k if 4 + 8 * k < 4 * n else 4 * n
            else:
                total += 4 * n
    return total


def reply_bound(compression, sizes, chunk, world):
    """Largest reply payload per step and worker: dense as pushed_bytes for
    none/fp16; top-k: per chunk 4 + 8 x min(world x k, n), or 4n when that
    is not smaller (the hub's sparse reply holds the nonzeros of the average,
    at most the union of the workers' k entries)."""
    if not compression.startswith("topk:"):
        return pushed_bytes(compression, sizes, chunk)
    ratio = struct.unpack("f", struct.pack("f", float(compression.split(":")[1])))[0]
    total = 0
    for n_key in sizes:
        for first in range(0, n_key, chunk):
            n = min(chunk, n_key - first)
            k = min(max(math.ceil(ratio * n * (1.0 - 8 * sys.float_info.epsilon)), 1), n)
            nz = min(world * k, n)
            total += 4 + 8 * nz if 4 + 8 * nz < 4 * n else 4 * n
    return total


def tenant_stats(hub, tenant):
    r = subprocess.run([os.path.join(hub.bindir, "rackhubctl"), "--admin", hub.admin,
                        "--token-file", hub.token, "--json", "stats", tenant],
                       capture_output=True, text=True, check=True)
    for t in json.loads(r.stdout).get("tenants", []):
        if t.get("name") == tenant:
            return {k: int(t.get(k, 0)) for k in ("bytes_in", "bytes_out", "pushes")}
    sys.exit(f"rackhubctl stats: no tenant {tenant}:\n{r.stdout}")


def run_variant(a, hub, variant, seed, env, idx):
    tenant = f"cmp-{idx}-s{seed}"
    token = hub.tenant(tenant, a.world, "")
    procs = []
    for r in range(a.world):
        cmd = [sys.executable, os.path.abspath(__file__), "--rank-main", "--rank", str(r),
               "--world", str(a.world), "--compression", variant, "--seed", str(seed),
               "--steps", str(a.steps), "--batch", str(a.batch), "--lr", str(a.lr),
               "--lr-drop-step", str(a.lr_drop_step), "--hub", hub.data, "--tenant", tenant,
               "--token", token]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        res = [json.loads(l[7:]) for l in out.splitlines() if l.startswith("RESULT ")]
        if p.returncode != 0 or not res:
            sys.exit(f"{variant} seed {seed}: a rank failed (exit {p.returncode}):\n{out}")
        results.append(res[0])
    stats = tenant_stats(hub, tenant)
    hub.delete(tenant)
    r0 = results[0]
    per_epoch = r0["per_epoch"]
    last = [sum(r["losses"][-per_epoch:]) / per_epoch for r in results]
    steps_workers = a.steps * a.world
    return {
        "variant": variant, "seed": seed,
        "train_loss_last_epoch": sum(last) / len(last),
        "held_out_loss": r0["curve"][-1][1], "held_out_acc": r0["curve"][-1][2],
        "curve": r0["curve"],
        "workers_bit_identical": len({r["weights_sha1"] for r in results}) == 1,
        "weights_sha1": r0["weights_sha1"],
        "skipped_steps": max(r["skipped"] for r in results),
        "bytes_computed": pushed_bytes(variant, r0["sizes"], r0["chunk_elements"]),
        "bytes_measured": stats["bytes_in"] / steps_workers,
        "payload_measured": (stats["bytes_in"] - HEADER_BYTES * stats["pushes"]) / steps_workers,
        "pushes_per_step_worker": stats["pushes"] / steps_workers,
        "reply_bound": reply_bound(variant, r0["sizes"], r0["chunk_elements"], a.world),
        "reply_measured": stats["bytes_out"] / steps_workers,
        "reply_payload_measured":
            (stats["bytes_out"] - HEADER_BYTES * stats["pushes"]) / steps_workers,
        "seconds": max(r["seconds"] for r in results),
        "chunk_elements": r0["chunk_elements"], "sizes": r0["sizes"],
    }


def fmt_bytes(b):
    return f"{b / 1000:.1f} kB" if b >= 1000 else f"{b:.0f} B"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build dir [build]")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=315, help="steps (21 per epoch) [315]")
    ap.add_argument("--batch", type=int, default=32, help="images per worker and step")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--lr-drop-step", type=int, default=210, help="lr x0.1 from this step")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds [0]")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--lanes", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print every result as JSON too")
    # rank process
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--compression", default="none", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--hub", default="", help=argparse.SUPPRESS)
    ap.add_argument("--tenant", default="", help=argparse.SUPPRESS)
    ap.add_argument("--token", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_main:
        return rank_main(a)

    variants = a.variants.split(",")
    seeds = [int(s) for s in a.seeds.split(",")]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(a.build, "python") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    work = tempfile.mkdtemp(prefix="rackhub-compression-bench.")
    hub = Hub(os.path.join(a.build, "bin"), a.lanes, work)
    rows = []
    try:
        for seed in seeds:
            for i, v in enumerate(variants):
                r = run_variant(a, hub, v, seed, env, i)
                rows.append(r)
                print(f"seed {seed} {v:16s} train loss {r['train_loss_last_epoch']:.4f}  "
                      f"held-out loss {r['held_out_loss']:.4f} acc {r['held_out_acc']:.1f} %  "
                      f"pushed/step/worker {fmt_bytes(r['bytes_computed'])} computed, "
                      f"{fmt_bytes(r['payload_measured'])} measured payload, reply "
                      f"{fmt_bytes(r['reply_payload_measured'])} measured payload "
                      f"(bytes_out {r['reply_measured']:.1f} B)  "
                      f"({r['seconds']:.1f} s, workers bit-identical: "
                      f"{r['workers_bit_identical']})", flush=True)
    finally:
        hub.stop()

    dense = {r["seed"]: r for r in rows if r["variant"] == variants[0]}
    print(f"\n{a.world} workers, {a.steps} steps of {a.batch} images per worker, "
          f"seeds {a.seeds}; chunk {rows[0]['chunk_elements']} elements; "
          f"keys {rows[0]['sizes']}")
    print("| compression | train loss (last epoch) | held-out loss | held-out acc | "
          f"acc - {variants[0]}, mean (worst seed) | pushed / step / worker (computed) | "
          "measured (payload + headers) | vs fp32 | reply / step / worker, measured "
          "(payload + headers) | reply bound | push + reply vs fp32 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    base_bytes = pushed_bytes("none", rows[0]["sizes"], rows[0]["chunk_elements"])
    base_total = statistics.mean(r["bytes_measured"] + r["reply_measured"]
                                 for r in rows if r["variant"] == "none") if any(
        r["variant"] == "none" for r in rows) else float("nan")
    for v in variants:
        rs = [r for r in rows if r["variant"] == v]

        def mean(key):
            return statistics.mean(r[key] for r in rs)

        def per_seed(key, f):
            """Every seed's value (up to 3 seeds), else the range."""
            v = [r[key] for r in rs]
            if len(v) == 1:
                return ""
            if len(v) <= 3:
                return " (" + ", ".join(f % x for x in v) + ")"
            return " (" + f % min(v) + " - " + f % max(v) + ")"

        gaps = [r["held_out_acc"] - dense[r["seed"]]["held_out_acc"] for r in rs]
        dacc = statistics.mean(gaps)
        print(f"| {v} | {mean('train_loss_last_epoch'):.4f}"
              f"{per_seed('train_loss_last_epoch', '%.4f')} | {mean('held_out_loss'):.4f} | "
              f"{mean('held_out_acc'):.1f} %{per_seed('held_out_acc', '%.1f')} | "
              f"{dacc:+.1f}{'' if len(gaps) == 1 else f' (worst {min(gaps):+.1f})'} | "
              f"{fmt_bytes(rs[0]['bytes_computed'])} "
              f"({rs[0]['bytes_computed']} B) | {fmt_bytes(rs[0]['payload_measured'])} + "
              f"{fmt_bytes(rs[0]['bytes_measured'] - rs[0]['payload_measured'])} | "
              f"{base_bytes / rs[0]['bytes_computed']:.1f}x less | "
              f"{fmt_bytes(mean('reply_payload_measured'))}"
              f"{per_seed('reply_payload_measured', '%.0f')} + "
              f"{fmt_bytes(mean('reply_measured') - mean('reply_payload_measured'))} | "
              f"{fmt_bytes(rs[0]['reply_bound'])} | "
              f"{base_total / (mean('bytes_measured') + mean('reply_measured')):.1f}x less |")
    print("\nheld-out accuracy (%) after each epoch, seed", seeds[0])
    curves = {r["variant"]: r["curve"] for r in rows if r["seed"] == seeds[0]}
    steps = [c[0] for c in curves[variants[0]]]
    print("| step | " + " | ".join(variants) + " |")
    print("|---:|" + "---:|" * len(variants))
    for i, s in enumerate(steps):
        print(f"| {s} | " + " | ".join(f"{curves[v][i][2]:.1f}" for v in variants) + " |")
    if a.json:
        print(json.dumps(rows))
    bad = [r for r in rows if not r["workers_bit_identical"] or r["skipped_steps"]]
    if bad:
        print(f"WARNING: {len(bad)} run(s) with workers not bit-identical or skipped steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
