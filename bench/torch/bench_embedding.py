#!/usr/bin/python3
"""Step time of an embedding table trained by W=2 ranks: rackhub's
row-sparse tables (nn.Embedding(sparse=True) through
DistributedOptimizer(embeddings=)) vs. torch DDP (gloo) with a dense
nn.Embedding(sparse=False) of the same table, in the same run, modes
interleaved round by round.

    /usr/bin/python3 bench/torch/bench_embedding.py                       # 1M rows, 3 rounds
    /usr/bin/python3 bench/torch/bench_embedding.py --rows 1000000,10000000 --json

Per configuration (rows x 64 fp32, N lookups per rank per step drawn from a
Zipf(1.05) distribution over the rows, fixed seeds):
  rackhub       DistributedOptimizer(SGD, embeddings=[emb]): the sparse
                gradient's unique rows (U ids + U rows, duplicates summed) are
                pushed, the hub's SGD updates the touched rows, the reply
                brings the next batch's unique rows (opt.prefetch), so forward
                pulls nothing
  rackhub-pull  the same without prefetch: the forward pre-hook pulls the
                batch's rows from the hub (one more round trip per step)
  rackhub-raw   as rackhub with embedding_coalesce=False: all N ids and rows
                are pushed (duplicates summed by the hub)
  ddp-gloo      DistributedDataParallel over nn.Embedding(sparse=False): the
                dense rows x 64 gradient is all-reduced every step
                (--ddp-max-rows: larger tables are skipped, memory)
  local         nn.Embedding(sparse=True) + torch.optim.SGD, no communication
Step = zero_grad + forward (lookup, 0.5*sum(out^2)/N) + backward (+ prefetch)
+ step, timed on each rank; a round's figure is the slower rank's median
over the timed steps; the report gives the median over rounds.

Bytes on the wire per rank and step (payload, frame headers not counted):
  rackhub: sent 8*P (ids) + 4*64*P (rows) + 8*M (wanted ids) (P = U
  unique ids, N for rackhub-raw); received
  4*64*M (M = unique rows of the next batch; + pulled ids/rows for
  rackhub-pull); dense: 2 x the table's bytes (a push_pull of the table; a
  ring all-reduce moves 2*(W-1)/W of it each way).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from bench_mlp import Hub, free_port  # noqa: E402  (rackhubd on ephemeral ports)

DIM = 64
ZIPF = 1.05
MODES = ["rackhub", "rackhub-pull", "rackhub-raw", "ddp-gloo", "local"]


def zipf_batches(rows, n, steps, seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, rows + 1, dtype=np.float64)
    cdf = np.cumsum(ranks ** -ZIPF)
    cdf /= cdf[-1]
    perm = rng.permutation(rows)
    return [perm[np.minimum(np.searchsorted(cdf, rng.random(n)), rows - 1)] for _ in range(steps)]


def rank_main(a):
    import torch
    torch.set_num_threads(a.threads)
    rank, world = a.rank, a.world
    steps = a.warmup + a.steps
    batches = [torch.from_numpy(b) for b in zipf_batches(a.rows, a.lookups, steps + 1,
                                                         1000 * rank + a.rows)]
    sparse = a.mode != "ddp-gloo"
    t = time.perf_counter()
    emb = torch.nn.Embedding(a.rows, DIM, sparse=sparse)
    setup = {"alloc_s": time.perf_counter() - t}
    net = emb
    if a.mode == "ddp-gloo":
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank,
                                world_size=world)
        net = torch.nn.parallel.DistributedDataParallel(emb)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
    elif a.mode.startswith("rackhub"):
        import rackhub.torch as rh
        rh.init(rank=rank, size=world, hub=a.hub, tenant=a.tenant, token=a.token,
                transport=a.transport)
        t = time.perf_counter()
        opt = rh.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.01),
                                      named_parameters=emb.named_parameters(),
                                      embeddings=[emb], embedding_init=("random", 0.01, 1),
                                      embedding_coalesce=a.mode != "rackhub-raw")
        setup["declare_s"] = time.perf_counter() - t
    else:
        opt = torch.optim.SGD(emb.parameters(), lr=0.01)
    times, sent, recv, uniq = [], [], [], []
    for step in range(steps):
        ids, nxt = batches[step], batches[step + 1]
        pulled0 = sum(opt.table_stats().values()) if a.mode.startswith("rackhub") else 0
        t = time.perf_counter()
        opt.zero_grad()
        out = net(ids)
        loss = 0.5 * out.pow(2).sum() / len(ids)
        loss.backward()
        if a.mode in ("rackhub", "rackhub-raw"):
            opt.prefetch(emb, nxt)
        opt.step()
        dt = time.perf_counter() - t
        if step >= a.warmup:
            times.append(dt)
            u = int(torch.unique(ids).numel())
            uniq.append(u)
            if a.mode.startswith("rackhub"):
                m = int(torch.unique(nxt).numel()) if a.mode != "rackhub-pull" else 0
                k = sum(opt.table_stats().values()) - pulled0
                p = len(ids) if a.mode == "rackhub-raw" else u
                sent.append(8 * p + 4 * DIM * p + 8 * m + 8 * k)
                recv.append(4 * DIM * (m + k))
            elif a.mode == "ddp-gloo":
                sent.append(4 * DIM * a.rows)
                recv.append(4 * DIM * a.rows)
    print("RESULT " + json.dumps({"rank": rank, "mode": a.mode, "times": times, "setup": setup,
                                  "sent": sent, "recv": recv, "unique": uniq,
                                  "loss": loss.item()}), flush=True)
    if a.mode == "ddp-gloo":
        import torch.distributed as dist
        dist.destroy_process_group()
    elif a.mode.startswith("rackhub"):
        import rackhub.torch as rh
        rh.shutdown()


def run(a, mode, rows, lookups, hub, rnd, env):
    extra = []
    tenant = None
    if mode.startswith("rackhub"):
        tenant = f"emb-{mode}-{rows}-{lookups}-{rnd}"
        token = hub.tenant(tenant, a.world, "")
        extra = ["--hub", hub.data, "--tenant", tenant, "--token", token]
    port = free_port()
    procs = []
    for r in range(a.world):
        cmd = [sys.executable, os.path.abspath(__file__), "--rank-main", "--rank", str(r),
               "--world", str(a.world), "--mode", mode, "--port", str(port), "--steps",
               str(a.steps), "--warmup", str(a.warmup), "--rows", str(rows), "--lookups",
               str(lookups), "--threads", str(a.threads), "--transport", a.transport] + extra
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        res = [json.loads(l[7:]) for l in out.splitlines() if l.startswith("RESULT ")]
        if p.returncode != 0 or not res:
            sys.exit(f"{mode} rows={rows} N={lookups}: a rank failed (exit {p.returncode}):\n{out}")
        results.append(res[0])
    if tenant:
        hub.delete(tenant)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build dir [build]")
    ap.add_argument("--pythonpath", default="", help="the rackhub package's parent directory "
                    "[BUILD/python]")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rows", default="1000000", help="table rows, comma-separated")
    ap.add_argument("--lookups", default="1000,10000,100000",
                    help="ids per rank per step, comma-separated")
    ap.add_argument("--ddp-max-rows", type=int, default=1000000,
                    help="larger tables skip ddp-gloo (memory: 3 copies per rank)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lanes", type=int, default=2)
    ap.add_argument("--transport", default="tcp", help="rackhub ranks' transport [tcp: "
                    "loopback TCP as gloo; shm stalls on table frames of several MB, see "
                    "bench/results/embedding-torch-2026-11-25.md]")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    for name in ("rank", "port"):
        ap.add_argument(f"--{name}", type=int, default=0, help=argparse.SUPPRESS)
    for name in ("mode", "hub", "tenant", "token"):
        ap.add_argument(f"--{name}", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_main:
        a.rows, a.lookups = int(a.rows), int(a.lookups)
        return rank_main(a)

    modes = a.modes.split(",")
    rows_list = [int(x) for x in a.rows.split(",")]
    lookups_list = [int(x) for x in a.lookups.split(",")]
    env = dict(os.environ)
    pp = a.pythonpath or os.path.join(a.build, "python")
    env["PYTHONPATH"] = pp + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = str(a.threads)
    work = tempfile.mkdtemp(prefix="rackhub-emb-bench.")
    hub = Hub(os.path.join(a.build, "bin"), a.lanes, work) \
        if any(m.startswith("rackhub") for m in modes) else None
    configs = [(m, r, n) for r in rows_list for n in lookups_list for m in modes
               if not (m == "ddp-gloo" and r > a.ddp_max_rows)]
    per = {c: [] for c in configs}
    info = {}
    try:
        for rnd in range(a.rounds):
            for c in configs:
                res = run(a, *c, hub, rnd, env)
                per[c].append(max(statistics.median(x["times"]) for x in res))
                info[c] = res
                if not a.json:
                    print(f"round {rnd + 1}/{a.rounds} {c[0]:12s} rows {c[1]:>9d} N {c[2]:>7d} "
                          f"{1000 * per[c][-1]:9.2f} ms/step", flush=True)
    finally:
        if hub:
            hub.stop()
    table = []
    for c in configs:
        m, r, n = c
        res = info[c][0]
        med = statistics.median(per[c])
        entry = {"mode": m, "rows": r, "dim": DIM, "lookups_per_rank": n,
                 "unique_rows_per_rank": round(statistics.mean(res["unique"])),
                 "median_ms_per_step": round(1000 * med, 3),
                 "per_round_ms": [round(1000 * x, 3) for x in per[c]],
                 "bytes_sent_per_rank_step": round(statistics.mean(res["sent"])) if res["sent"] else 0,
                 "bytes_recv_per_rank_step": round(statistics.mean(res["recv"])) if res["recv"] else 0,
                 "dense_push_pull_bytes": 2 * 4 * DIM * r, "setup": res["setup"]}
        ddp = ("ddp-gloo", r, n)
        if ddp in per and m != "ddp-gloo":
            entry["speedup_vs_ddp_gloo"] = round(statistics.median(per[ddp]) / med, 2)
        table.append(entry)
    summary = {"world": a.world, "threads_per_rank": a.threads, "hub_lanes": a.lanes,
               "transport": a.transport,
               "rounds": a.rounds, "timed_steps": a.steps, "warmup_steps": a.warmup,
               "zipf": ZIPF, "results": table}
    if a.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"\n{a.world} ranks x {a.threads} thread(s), hub lanes {a.lanes}, rackhub over "
          f"{a.transport}, dim {DIM}, "
          f"Zipf {ZIPF}, {a.rounds} rounds x {a.steps} timed steps")
    print(f"{'mode':12s} {'rows':>9s} {'N':>7s} {'unique':>7s} {'ms/step':>9s} {'vs ddp':>7s} "
          f"{'sent B':>11s} {'recv B':>11s} {'dense 2x tbl':>13s}")
    for e in table:
        vs = e.get("speedup_vs_ddp_gloo")
        print(f"{e['mode']:12s} {e['rows']:9d} {e['lookups_per_rank']:7d} "
              f"{e['unique_rows_per_rank']:7d} {e['median_ms_per_step']:9.2f} "
              f"{(f'{vs:.1f}x' if vs else '-'):>7s} {e['bytes_sent_per_rank_step']:11d} "
              f"{e['bytes_recv_per_rank_step']:11d} {e['dense_push_pull_bytes']:13d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
