#!/usr/bin/python3
"""rackhub planning model: iteration time and cross-rack bytes of a synchronous
push_pull for W workers x R racks, hub cores, link speeds and model sizes,
hierarchical (one hub per rack, hubs exchange rack sums) or flat (one hub for
every rack). Equations, parameters and limits: docs/planning.md.

  plan.py fit        measure this machine, write bench/model/params-<date>.json
  plan.py predict    one configuration, with its breakdown and bound
  plan.py validate   predicted vs measured bench/multirack_netns.sh runs
  plan.py plot       planning curves and the hub balance plot (PNG)

numpy + matplotlib only; run with /usr/bin/python3.
"""
import argparse, datetime, glob, json, math, os, re, statistics, subprocess, sys, tempfile
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CHUNK_BYTES = 32 * 1024        # tenant default chunk (fp32 bytes)
HDR = 40                       # frame header bytes (net/frame.h)
ETH_PAYLOAD = 1448 / 1538      # TCP payload per Ethernet frame on the wire: MTU 1500, TCP
                               # timestamps, + 14 MAC + 4 FCS + 8 preamble + 12 gap
SLOTS = {"sgd": 0, "momentum": 1, "nesterov": 1, "adagrad": 1, "adam": 2, "adamw": 2, "sum-only": 0}
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
GiB, MiB = 1 << 30, 1 << 20


# ---------------------------------------------------------------- sizes, bytes

def parse_size(s):
    m = re.fullmatch(r"([0-9.]+)\s*(|k|ki|m|mi|g|gi)b?", str(s).strip().lower())
    if not m:
        raise argparse.ArgumentTypeError("size '%s' is not like 16MiB, 100MB, 1GiB" % s)
    mult = {"": 1, "k": 1e3, "ki": 1 << 10, "m": 1e6, "mi": 1 << 20, "g": 1e9, "gi": 1 << 30}
    return int(float(m.group(1)) * mult[m.group(2)])


def parse_rate(s):
    """tc rate text ('1gbit', '300mbit') -> bits/s; 'none' -> None."""
    if s == "none":
        return None
    m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", s.lower())
    if not m:
        raise ValueError("rate '%s' is not like 1gbit or 300mbit" % s)
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def chunk_elements(model_bytes, keys=4, chunk_bytes=CHUNK_BYTES):
    """Elements of every chunk in tenant-wide index order: `keys` keys of
    model_bytes/4/keys elements (rackhub-bench's layout), each cut into
    chunks of chunk_bytes/4 elements, the last one short."""
    total, ce = model_bytes // 4, chunk_bytes // 4
    sizes = [total // keys] * keys
    sizes[-1] += total % keys
    out = []
    for n in sizes:
        full, rest = divmod(n, ce)
        out.append(np.full(full, ce, dtype=np.int64))
        if rest:
            out.append(np.array([rest], dtype=np.int64))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def exchange_bytes(e, racks, lanes, d):
    """Per hub: bytes it sends and receives on its hub links per iteration
    (server/lanes/rack_exchange.cc): chunk g has its home at rack (g / lanes) % R;
    a non-home hub sends the fp32 rack sum (RACK_SUM, 40 + 4n) to the home;
    the home sends the new parameters in the wire dtype (RACK_PARAMS, 40 + d n)
    to each of the R-1 other hubs."""
    out, inn = np.zeros(racks), np.zeros(racks)
    if racks < 2:
        return out, inn
    home = (np.arange(len(e)) // lanes) % racks
    s, p = HDR + 4 * e, HDR + d * e
    for h in range(racks):
        mine = home == h
        out[h] = s[~mine].sum() + (racks - 1) * p[mine].sum()
        inn[h] = p[~mine].sum() + (racks - 1) * s[mine].sum()
    return out, inn


def traffic(cfg):
    """Bytes per iteration of one configuration (frames: headers + payload)."""
    R, W, lanes, d = cfg["racks"], cfg["wpr"], cfg["lanes"], DTYPE_BYTES[cfg["dtype"]]
    e = chunk_elements(cfg["model_bytes"], cfg.get("keys", 4))
    push = float((HDR + d * e).sum())               # one worker's push (= its reply)
    t = {"push": push, "chunks": len(e)}
    if cfg["mode"] == "hierarchical" and R > 1:
        out, inn = exchange_bytes(e, R, lanes, d)
        t["x_dir"] = float(max(out.max(), inn.max()))   # busiest hub link direction
        t["x_total"] = float(out.sum())                 # all hubs, one direction each
        t["hub_nic_dir"] = W * push + t["x_dir"]
        t["k_x"] = R - 1          # senders whose progress paces a home's replies
    else:
        t["x_dir"] = (R - 1) * W * push                 # rack 0's uplink (flat hub)
        t["x_total"] = 2 * (R - 1) * W * push           # remote pushes + their replies
        t["hub_nic_dir"] = R * W * push
        t["k_x"] = (R - 1) * W
    return t


# --------------------------------------------------------------- the equations

def sync_eff(params, k, rate=None):
    """Effective payload fraction of a link whose reply direction is paced by
    k senders (calibrated single-hub runs across a shaped link; linear in k
    between calibrated points, clamped outside). rate: a calibrated rate's own
    table, else the mean over the calibrated rates."""
    tables = params["link"]["efficiency"]
    if rate in tables:
        tab = tables[rate]
    else:
        ks = sorted({int(k2) for t in tables.values() for k2 in t})
        tab = {str(k2): float(np.mean([t[str(k2)] for t in tables.values() if str(k2) in t])) for k2 in ks}
    ks = sorted(int(x) for x in tab)
    return float(np.interp(max(k, 1), ks, [tab[str(x)] for x in ks]))


def hub_kernel_seconds(cfg, params, w_contrib):
    """One hub's aggregation + optimizer time per iteration, on one core, from
    the measured kernel rates (bytes of memory traffic per second, 32 KiB).
    Traffic per fp32 model byte: a contribution reads its input (d/4) and reads
    and writes the accumulator (2); a stage update copies the sum (2); the
    optimizer reads the sum and p_old, writes p_new, reads+writes each state
    slot (3 + 2 slots); narrowing the reply (1 + d/4)."""
    k = params["kernels"]
    M, R, d = cfg["model_bytes"], cfg["racks"], DTYPE_BYTES[cfg["dtype"]]
    opt = cfg.get("optimizer", "sgd")
    acc = w_contrib * (2 + d / 4) * M
    if R > 1:
        stages = 1 if cfg["mode"] == "hierarchical" else R
        share = 1 / R if cfg["mode"] == "hierarchical" else 1.0  # model share this hub is home of
        acc += 2 * stages * M + 3 * R * share * M
    else:
        share = 1.0
    reply = (1 + d / 4) * share * M if R > 1 or d < 4 else 0.0   # R = 1, fp32: the reply is the params
    rate = k["rate_64MiB"] if cfg.get("kernel_rates") == "64MiB" else k["rate"]
    r_opt = rate[{"nesterov": "momentum", "adamw": "adam", "sum-only": "sgd"}.get(opt, opt)]
    return (acc + reply) / rate["sum"] + (3 + 2 * SLOTS[opt]) * share * M / r_opt


def predict(cfg, params):
    """Planning model: iteration time = t0 + max(worker NIC, hub NIC, hub CPU,
    cross-rack link), each a pipelined resource that moves its bytes per
    iteration at its rate (docs/planning.md)."""
    R, W, C = cfg["racks"], cfg["wpr"], cfg["hub_cores"]
    t = traffic(cfg)
    n = params["net"]
    c_net = n["hub_tcp_s_per_byte"] if cfg.get("hub_net", "tcp") == "tcp" else 0.0
    sync = (lambda k: sync_eff(params, k) / sync_eff(params, 1)) if cfg.get("sync", True) else (lambda k: 1.0)
    b_i, b_x = cfg["intra_gbit"] * 1e9 / 8, cfg["link_gbit"] * 1e9 / 8
    b_h = cfg.get("hub_nic_gbit", cfg["intra_gbit"]) * 1e9 / 8
    hier = cfg["mode"] == "hierarchical" and R > 1
    k_nic = W if hier or R == 1 else R * W
    terms = {
        "worker NIC": t["push"] / (ETH_PAYLOAD * b_i),
        "hub NIC": t["hub_nic_dir"] / (ETH_PAYLOAD * sync(k_nic) * b_h),
        "cross-rack link": t["x_dir"] / (ETH_PAYLOAD * sync(t["k_x"]) * b_x) if R > 1 else 0.0,
    }
    w_contrib = W if hier or R == 1 else R * W
    cpu = c_net * 2 * t["hub_nic_dir"] + hub_kernel_seconds(cfg, params, w_contrib)
    terms["hub CPU (%d cores)" % C] = cpu / C
    bound = max(terms, key=terms.get)
    return {"t0": n["t0_s"], "terms": terms, "bound": bound, "hub_cpu_s": cpu,
            "time": n["t0_s"] + terms[bound], "cross_rack_bytes": t["x_total"],
            "busiest_link_dir_bytes": t["x_dir"] if R > 1 else 0.0, "traffic": t}


def predict_testbed(cfg, rate_bps, rate_name, params):
    """The same iteration on this test machine (bench/multirack_netns.sh): every
    hub and worker shares `cores` cores, workers reach their own hub through
    shared memory (flat: rack 0's; the other racks' over TCP across the shaped
    links), the rack links are tc tbf at rate_bps. Iteration = t0 +
    max(shaped link, shared CPU)."""
    tb = params["testbed"]
    R, W = cfg["racks"], cfg["wpr"]
    t = traffic(cfg)
    hier = cfg["mode"] == "hierarchical"
    eff = sync_eff(params, t["k_x"], rate_name)
    link = t["x_dir"] * 8 / (eff * rate_bps)
    shm_workers = R * W if hier else W
    tcp_workers = 0 if hier else (R - 1) * W
    work = (shm_workers * tb["cpu_s_per_byte"]["shm"] + tcp_workers * tb["cpu_s_per_byte"]["tcp"]) * t["push"]
    if hier:
        work += tb["cpu_s_per_byte"]["tcp"] / 2 * t["x_total"]   # each hub-link byte: one TCP send + receive
    cpu = work / tb["cores"]
    terms = {"shaped link": link, "shared CPU": cpu}
    bound = max(terms, key=terms.get)
    return {"time": tb["t0_s"] + terms[bound], "terms": terms, "bound": bound, "eff": eff,
            "link_bytes": t["x_dir"], "k": t["k_x"]}


def load_params(path):
    if path is None:
        files = sorted(glob.glob(os.path.join(HERE, "params-*.json")))
        if not files:
            sys.exit("plan.py: no bench/model/params-*.json; run 'plan.py fit' first or pass --params")
        path = files[-1]
    with open(path) as f:
        p = json.load(f)
    p["_path"] = os.path.relpath(path, REPO)
    return p


# ------------------------------------------------------------------------ fit

def run(cmd):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s exited %d:\n%s" % (cmd[0], r.returncode, r.stderr[-2000:]))
    return r.stdout


def bench_json(bench, args, netns=None):
    """One rackhub-bench run's JSON; a failed run is shown and run once more."""
    cmd = ([] if netns is None else ["ip", "netns", "exec", netns]) + [bench] + args + ["--json"]
    try:
        return json.loads(run(cmd).strip().splitlines()[-1])
    except RuntimeError as e:
        print("plan.py: %s\nplan.py: running it again" % e, file=sys.stderr)
        return json.loads(run(cmd).strip().splitlines()[-1])


def fit_kernels(kb):
    if kb is None:
        return kernels_from_results()
    paths = run([kb, "--benchmark_list_tests=true"]).split()
    path = next(p for p in ("avx512", "avx2", "portable") if any("/" + p + "/" in t for t in paths))
    rows = "sum/fp32/N:2|fused/(sgd|momentum|adam|adagrad)/N:4"
    out = run([kb, "--benchmark_filter=^(memcpy|(%s)/(32KiB|64MiB)/%s)/" % (rows, path),
               "--benchmark_min_time=0.1", "--benchmark_format=json"])
    med = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            parts = b["run_name"].split("/")
            name = "memcpy" if parts[0] == "memcpy" else ("sum" if parts[0] == "sum" else parts[1])
            size = next(p for p in parts if p in ("32KiB", "64MiB"))
            med.setdefault(size, {})[name] = b["bytes_per_second"]
    return {"path": path, "source": os.path.relpath(kb, REPO), "rate": med["32KiB"], "rate_64MiB": med["64MiB"],
            "note": "bytes of memory traffic per second on one core, medians of 5 (rackhub-kernel-bench); "
                    "'rate' = 32 KiB buffers (a chunk, cache resident), the hub's case"}


def kernels_from_results():
    """No kernel bench binary: the best path's GB/s from bench/results/kernels.md."""
    f = os.path.join(REPO, "bench", "results", "kernels.md")
    rate, size = {}, None
    for line in open(f):
        m = re.match(r"### S = (32 KiB|64 MiB)", line)
        if m:
            size = m.group(1).replace(" ", "")
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if size and len(cells) >= 3 and re.match(r"(memcpy|sum/fp32/N:2|fused/\w+/N:4)$", cells[0]):
            nums = [float(c) for c in cells[2::2] if re.fullmatch(r"[0-9.]+", c)]
            name = cells[0] if cells[0] == "memcpy" else "sum" if cells[0].startswith("sum") else cells[0].split("/")[1]
            rate.setdefault(size, {})[name] = nums[-1] * 1e9
    return {"path": "best in kernels.md", "source": os.path.relpath(f, REPO), "rate": rate["32KiB"],
            "rate_64MiB": rate["64MiB"], "note": "read from bench/results/kernels.md (no kernel bench binary)"}


def fit_loopback(build, kernels, workers=(1, 2, 4, 6, 8), mib=16, iterations=10, wait=0):
    bench = os.path.join(build, "bin", "rackhub-bench")
    M = mib * MiB
    raw, c_net, slopes, t0 = [], {}, {}, {}
    for tr in ("tcp", "shm"):
        t0[tr] = bench_json(bench, ["--workers", "2", "--bytes", "4KiB", "--keys", "1", "--iterations", "300",
                                    "--transport", tr])["median_ms"] / 1e3
        per_byte, pts = [], []
        for w in workers:
            for attempt in range(3):   # a run disturbed by other processes is run again
                wait_quiet(wait)
                with OtherCpu() as other:
                    d = bench_json(bench, ["--workers", str(w), "--bytes", "%dMiB" % mib, "--iterations",
                                           str(iterations), "--transport", tr])
                if other.seconds < 0.5:
                    break
                print("  (other processes used %.1f s of CPU during the run: again)" % other.seconds, file=sys.stderr)
            raw.append({k: d[k] for k in ("workers", "bytes", "transport", "median_ms", "p10_ms", "p90_ms",
                                          "hub_cpu_s_per_gb")})
            raw[-1]["other_cpu_s"] = round(other.seconds, 2)
            push = float((HDR + 4 * chunk_elements(M)).sum())
            cpu_iter = d["hub_cpu_s_per_gb"] * w * M / 1e9        # hub CPU seconds per iteration
            kern = hub_kernel_seconds({"model_bytes": M, "racks": 1, "dtype": "fp32", "mode": "flat"},
                                      {"kernels": kernels}, w)
            per_byte.append((cpu_iter - kern) / (2 * w * push))   # hub TCP/shm cost per byte, one direction
            pts.append((w, d["median_ms"] / 1e3))
        c_net[tr] = statistics.median(per_byte)
        # Whole-machine CPU per worker: slope of the iteration time against W
        # once the workers outnumber the cores (all cores busy), x cores.
        xs = np.array([w for w, _ in pts if w >= 2]); ys = np.array([y for w, y in pts if w >= 2])
        slope, icpt = np.polyfit(xs, ys, 1)
        slopes[tr] = {"slope_s_per_worker": float(slope), "intercept_s": float(icpt), "push_bytes": push}
    return raw, c_net, slopes, t0


NS = "rhp-"   # namespaces of the link calibration (multirack_netns.sh uses rh-)


def tbf_args(rate):
    v = parse_rate(rate) / 8
    return ["rate", rate, "burst", str(max(int(v * 0.002), 131072)), "latency", "100ms"]


def netns_cleanup(names):
    for ns in names:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for pid in pids:   # processes left in our own namespaces (an interrupted run)
            subprocess.run(["kill", pid], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def fit_links(build, rates, workers=(1, 2, 4, 6), mib=16, iterations=5, rounds=2, wait=0):
    """Single hub across one shaped link, built like multirack_netns.sh (rack
    namespaces <-> a spine router, tbf both ways on every rack link): the hub
    in rhp-rack0, W workers (TCP) in rhp-rack1. Gives the link's effective
    payload rate when the hub's replies are paced by W senders."""
    if os.geteuid() != 0:
        print("fit: not root: link calibration skipped", file=sys.stderr)
        return None
    bench = os.path.join(build, "bin", "rackhub-bench")
    spine, racks = NS + "spine", [NS + "rack0", NS + "rack1"]
    existing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    if any(ns in existing for ns in [spine] + racks):
        sys.exit("plan.py fit: namespace %s* exists (another run? remove with ip netns del)" % NS)
    created = []
    try:
        sh = lambda *a: run(list(a))
        sh("ip", "netns", "add", spine)
        created.append(spine)
        sh("ip", "netns", "exec", spine, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        for r, ns in enumerate(racks):
            sh("ip", "netns", "add", ns)
            created.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "link", "add", "rhp%dx%d" % (os.getpid(), r), "netns", ns, "type", "veth",
               "peer", "name", "sp%d" % r, "netns", spine)
            sh("ip", "-n", ns, "link", "set", "rhp%dx%d" % (os.getpid(), r), "name", "rk")
            sh("ip", "-n", ns, "addr", "add", "10.79.%d.2/24" % r, "dev", "rk")
            sh("ip", "-n", ns, "link", "set", "rk", "up")
            sh("ip", "-n", spine, "addr", "add", "10.79.%d.1/24" % r, "dev", "sp%d" % r)
            sh("ip", "-n", spine, "link", "set", "sp%d" % r, "up")
            sh("ip", "-n", ns, "route", "add", "default", "via", "10.79.%d.1" % r)
        runs = []
        for rate in rates:
            for r, ns in enumerate(racks):
                for dev_ns, dev in ((ns, "rk"), (spine, "sp%d" % r)):
                    subprocess.run(["ip", "netns", "exec", dev_ns, "tc", "qdisc", "del", "dev", dev, "root"],
                                   capture_output=True)
                    sh("ip", "netns", "exec", dev_ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", *tbf_args(rate))
            for rnd in range(rounds):
                for w in workers:
                    wait_quiet(wait)
                    with OtherCpu() as other:
                        d = bench_json(bench, ["--racks", "1", "--workers", str(w), "--bytes", "%dMiB" % mib,
                                               "--iterations", str(iterations), "--rack-addrs", "10.79.0.2",
                                               "--hub-netns-prefix", NS + "rack"], netns=racks[1])
                    runs.append({"rate": rate, "round": rnd + 1, "workers": w, "bytes": d["bytes"],
                                 "median_ms": d["median_ms"], "transport": d["transport"],
                                 "other_cpu_s": round(other.seconds, 2)})
                    print("  link %-8s W=%d round %d: %.1f ms" % (rate, w, rnd + 1, d["median_ms"]), file=sys.stderr)
        return runs
    finally:
        netns_cleanup(created)


def cmd_fit(a):
    build = os.path.abspath(a.build)
    out = a.out or os.path.join(HERE, "params-%s.json" % a.date)
    parts = set(a.parts.split(","))
    old = json.load(open(out)) if parts != {"kernels", "loopback", "links"} else {}
    p = {"date": a.date, "machine": machine(), "build": os.path.relpath(build, REPO),
         "loadavg_before": loadavg(), "parts_measured": sorted(parts)}
    kb = a.kernel_bench or next((f for f in (os.path.join(build, "bin", "rackhub-kernel-bench"),
                                             os.path.join(REPO, "build", "bin", "rackhub-kernel-bench"))
                                  if os.access(f, os.X_OK)), None)
    p["kernels"] = fit_kernels(kb) if "kernels" in parts else old["kernels"]
    if "loopback" not in parts:
        for k in ("net", "testbed", "loopback_runs"):
            p[k] = old[k]
    else:
        fit_loopback_into(p, build, a)
    if "links" not in parts:
        p["link"] = old["link"]
    else:
        fit_links_into(p, build, a)
    p["loadavg_after"] = loadavg()
    with open(out, "w") as f:
        json.dump(p, f, indent=1)
        f.write("\n")
    print("wrote %s" % os.path.relpath(out, REPO))
    show_params(p)


def fit_loopback_into(p, build, a):
    raw, c_net, slopes, t0 = fit_loopback(build, p["kernels"], iterations=a.iterations, wait=a.wait_quiet)
    p["net"] = {"hub_tcp_s_per_byte": c_net["tcp"], "hub_shm_s_per_byte": c_net["shm"], "t0_s": t0["tcp"],
                "t0_shm_s": t0["shm"],
                "note": "hub CPU seconds per byte through its TCP (shm) stack, one direction, loopback; "
                        "t0 = median iteration of a 4 KiB model, 2 workers"}
    cores = os.cpu_count()
    p["testbed"] = {"cores": cores, "t0_s": t0["shm"],
                    "cpu_s_per_byte": {tr: slopes[tr]["slope_s_per_worker"] * cores / slopes[tr]["push_bytes"]
                                       for tr in slopes},
                    "fit": slopes,
                    "note": "shared-CPU term, validation only: whole-machine CPU seconds per worker per byte of "
                            "its push (push + reply, worker + hub), from loopback runs with W >= 2"}
    p["loopback_runs"] = raw


def fit_links_into(p, build, a):
    links = fit_links(build, a.rates.split(), rounds=a.rounds, wait=a.wait_quiet) if not a.no_links else None
    if links:
        eff = {}
        for rate in a.rates.split():
            for w in sorted({r["workers"] for r in links}):
                ms = [r["median_ms"] for r in links if r["rate"] == rate and r["workers"] == w]
                push = float((HDR + 4 * chunk_elements(links[0]["bytes"])).sum())
                t = statistics.median(ms) / 1e3 - p["net"]["t0_shm_s"]
                eff.setdefault(rate, {})[str(w)] = w * push * 8 / (parse_rate(rate) * t)
        p["link"] = {"efficiency": eff, "runs": links,
                     "note": "payload bytes / (rate x time) of the busiest direction, single hub, W TCP workers "
                             "across a tbf-shaped rack link; key = W = senders pacing the replies"}
    else:
        p["link"] = {"efficiency": {"none": {"1": 1448 / 1514}}, "note": "not calibrated (no root): TCP headers only"}


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


class OtherCpu:
    """CPU seconds (user + system) the machine spent outside this script and
    its children (another engineer's compiler...) while the block ran: the
    machine's (/proc/stat) minus ours and our children's (getrusage). Tick
    sampling makes it uncertain by ~2 % of the block's CPU time."""
    def __enter__(self):
        self.t = self._now()
        return self

    def __exit__(self, *exc):
        self.seconds = self._now() - self.t

    @staticmethod
    def _now():
        f = open("/proc/stat").readline().split()
        ticks = (int(f[1]) + int(f[2]) + int(f[3])) / os.sysconf("SC_CLK_TCK")
        t = os.times()
        return ticks - t.children_user - t.children_system - t.user - t.system


def wait_quiet(max_s, window=2, need=2):
    """Waits (at most max_s) until other processes used < 0.25 s of user CPU
    in `need` consecutive windows of `window` s: the machine is shared."""
    t, quiet = 0, 0
    while t < max_s and quiet < need:
        with OtherCpu() as o:
            __import__("time").sleep(window)
        quiet = quiet + 1 if o.seconds < 0.25 else 0
        t += window
    if quiet < need:
        print("plan.py: the machine is still busy after %d s; measuring anyway" % max_s, file=sys.stderr)


def machine():
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    cc = open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()
    return {"cpu": model, "cores": os.cpu_count(), "kernel": os.uname().release, "tcp_congestion_control": cc}


def show_params(p):
    k, n, tb = p["kernels"], p["net"], p["testbed"]
    print("kernels (%s, 32 KiB, GB/s of traffic per core): %s" % (
        k["path"], ", ".join("%s %.1f" % (x, v / 1e9) for x, v in k["rate"].items())))
    print("hub TCP %.3f ns/B, shm %.3f ns/B per direction; t0 %.3f ms (tcp), %.3f ms (shm)" % (
        n["hub_tcp_s_per_byte"] * 1e9, n["hub_shm_s_per_byte"] * 1e9, n["t0_s"] * 1e3, n["t0_shm_s"] * 1e3))
    print("test bed: %d cores; CPU per worker-byte shm %.3f ns, tcp %.3f ns" % (
        tb["cores"], tb["cpu_s_per_byte"]["shm"] * 1e9, tb["cpu_s_per_byte"]["tcp"] * 1e9))
    for rate, tab in p["link"]["efficiency"].items():
        print("link %s: payload efficiency by senders k: %s" % (
            rate, ", ".join("k=%s %.3f" % (x, v) for x, v in sorted(tab.items(), key=lambda i: int(i[0])))))


# -------------------------------------------------------------------- predict

def config_from(a, racks=None, workers=None):
    R = racks or a.racks
    N = workers or a.workers
    return {"racks": R, "wpr": math.ceil(N / R), "hub_cores": a.hub_cores, "lanes": a.hub_cores,
            "link_gbit": a.link_gbit, "intra_gbit": a.intra_gbit, "hub_nic_gbit": a.hub_nic_gbit or a.intra_gbit,
            "model_bytes": a.model_bytes, "dtype": a.dtype, "optimizer": a.optimizer, "mode": a.mode,
            "hub_net": a.hub_net, "sync": a.sync == "measured", "keys": a.keys}


def cmd_predict(a):
    p = load_params(a.params)
    cfg = config_from(a)
    r = predict(cfg, p)
    R, W = cfg["racks"], cfg["wpr"]
    print("%d workers = %d racks x %d, %s, %s model (%.1f MiB fp32, %s on the wire, %s), hub %d cores / %g Gbit NIC, "
          "workers %g Gbit, rack links %g Gbit  [params %s]" % (
              R * W, R, W, cfg["mode"], fmt_bytes(cfg["model_bytes"]), cfg["model_bytes"] / MiB, cfg["dtype"],
              cfg["optimizer"], cfg["hub_cores"], cfg["hub_nic_gbit"], cfg["intra_gbit"], cfg["link_gbit"], p["_path"]))
    print("  %-26s %10.3f ms" % ("fixed (t0)", r["t0"] * 1e3))
    for k, v in r["terms"].items():
        print("  %-26s %10.3f ms%s" % (k, v * 1e3, "   <- bound" if k == r["bound"] else ""))
    print("  %-26s %10.3f ms" % ("iteration", r["time"] * 1e3))
    print("  cross-rack bytes/iteration %s (all racks, frames), busiest rack link %s each way" % (
        fmt_bytes(r["cross_rack_bytes"]), fmt_bytes(r["busiest_link_dir_bytes"])))
    print("  hub CPU %.3f core-s/iteration: needs %.1f cores to keep up with its NIC" % (
        r["hub_cpu_s"], r["hub_cpu_s"] / max(r["terms"]["hub NIC"], 1e-12)))
    if a.json:
        print(json.dumps({k: v for k, v in r.items() if k != "traffic"}))


def fmt_bytes(b):
    for unit, v in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if b >= v:
            return "%.2f %s" % (b / v, unit)
    return "%d B" % b


# ------------------------------------------------------------------- validate

def cmd_validate(a):
    p = load_params(a.params)
    files = list(a.runs)
    if a.run:
        os.makedirs(a.out_dir, exist_ok=True)
        t_all = datetime.datetime.now()
        for spec in a.configs.split():
            R, W = (int(x) for x in spec.split("x"))
            for rate in a.rates.split():   # one rate per call: a quiet machine is awaited before each
                f = os.path.join(a.out_dir, "multirack-r%dw%d-%s.jsonl" % (R, W, rate))
                cmd = [os.path.join(REPO, "bench", "multirack_netns.sh"), "--build", a.build, "--racks", str(R),
                       "--workers", str(W), "--bytes", a.bytes, "--iterations", str(a.iterations),
                       "--rounds", str(a.rounds), "--rates", rate, "--json", f]
                wait_quiet(a.wait_quiet)
                print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
                t, load = datetime.datetime.now(), loadavg()
                with OtherCpu() as other:
                    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                wall = (datetime.datetime.now() - t).total_seconds()
                print("  %s %s: %.0f s wall, load average before %s; other processes' CPU %.1f s" % (
                    spec, rate, wall, load, other.seconds), file=sys.stderr)
                lines = [json.loads(l) for l in open(f) if l.strip()]
                with open(f, "w") as out:
                    for d in lines:
                        d.update(other_cpu_s=round(other.seconds, 1), call_wall_s=round(wall, 1))
                        out.write(json.dumps(d, separators=(",", ":")) + "\n")
                files.append(f)
        print("validation runs: %.0f s wall in all" % (datetime.datetime.now() - t_all).total_seconds(),
              file=sys.stderr)
    runs = [json.loads(l) for f in files for l in open(f) if l.strip()]
    groups = {}
    for r in runs:
        key = (r["racks"], r["workers"], r["bytes"], r["dtype"], r["rate"], r["topology"])
        groups.setdefault(key, []).append(r)
    rows, worst = [], 0.0
    print("| racks x workers | model | rate | mode | k | predicted ms | measured ms | error | bound | "
          "round medians | link MiB/it, predicted (frames) | measured (veth) | others' CPU s |")
    print("|---|---|---|---|---:|---:|---:|---:|---|---|---:|---:|---:|")
    order = lambda k: (k[0], k[1], k[2], -(parse_rate(k[4]) or 1e12), k[5] != "hierarchical")
    for key in sorted(groups, key=order):
        R, W, B, dt, rate, topo = key
        rs = groups[key]
        rate_bps = parse_rate(rate)
        if rate_bps is None and not a.unshaped:
            continue
        meas = statistics.median(r["median_ms"] for r in rs)
        cfg = {"racks": R, "wpr": W, "lanes": a.lanes, "model_bytes": B, "dtype": dt, "mode": topo}
        if rate_bps is None:
            pr = predict_testbed(cfg, 1e15, rate, p)
        else:
            pr = predict_testbed(cfg, rate_bps, rate, p)
        err = (pr["time"] * 1e3 - meas) / meas
        if rate_bps is not None:
            worst = max(worst, abs(err))
        veth = statistics.median(max(max(v) for v in r["link_bytes"].values()) / (r["iterations"] + 2) for r in rs)
        other = rs[0].get("other_cpu_s", rs[0].get("other_user_cpu_s"))
        print("| %dx%d | %s | %s | %s | %d | %.1f | %.1f | %+.1f %% | %s | %s | %.2f | %.2f | %s |" % (
            R, W, fmt_bytes(B), rate, topo, pr["k"], pr["time"] * 1e3, meas, 100 * err, pr["bound"],
            " ".join("%.0f" % r["median_ms"] for r in rs), pr["link_bytes"] / MiB, veth / MiB,
            "" if other is None else "%.1f" % other))
        rows.append((key, pr, meas, err))
    print("\nshaped configurations: %d, largest |error| %.1f %%, within 15 %%: %d" % (
        sum(1 for k, *_ in rows if parse_rate(k[4])), 100 * worst,
        sum(1 for k, pr, m, e in rows if parse_rate(k[4]) and abs(e) <= 0.15)))


# ----------------------------------------------------------------------- plot

def cmd_plot(a):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    p = load_params(a.params)
    files = []
    racks = [1, 2, 4, 8, 16, 32, 64]
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(racks)))

    # 1. Iteration time vs workers, racks 1..64, hierarchical vs flat.
    links, models = [10, 25, 100], [("ResNet-50 size, 102 MB", 102_228_128), ("1.3 GB", 1_300_000_000)]
    fig, axes = plt.subplots(len(models), len(links), figsize=(15, 9), sharex=True)
    for i, (mname, mb) in enumerate(models):
        for j, g in enumerate(links):
            ax = axes[i][j]
            for R, col in zip(racks, colors):
                Ns = np.unique(np.round(np.geomspace(max(R, 8), 2048, 24) / R).astype(int) * R)
                for mode, ls in (("hierarchical", "-"), ("flat", "--")):
                    if R == 1 and mode == "flat":
                        continue
                    res = [predict(plot_cfg(R, n, g, mb, mode, a), p) for n in Ns]
                    ax.plot(Ns, [r["time"] for r in res], ls, color=col,
                            label=("R=%d" % R) if mode == "hierarchical" else None)
                    # mark where the bound changes along the curve
                    for n, r0, r1 in zip(Ns[1:], res[:-1], res[1:]):
                        if r0["bound"] != r1["bound"]:
                            ax.plot([n], [r1["time"]], "o", ms=4, color=col, mfc="none")
            ax.set_xscale("log", base=2); ax.set_yscale("log")
            ax.set_title("%s, %g Gbit/s rack links and worker NICs" % (mname, g), fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            if i == len(models) - 1: ax.set_xlabel("workers (all racks)")
            if j == 0: ax.set_ylabel("iteration time, s")
    axes[0][0].legend(title="racks: solid hierarchical,\ndashed flat; o = bound changes", fontsize=8,
                      title_fontsize=8)
    fig.suptitle("rackhub planning model: synchronous push_pull, fp32, SGD; hub %d cores over TCP, hub NIC = %g x "
                 "link speed  [%s]" % (a.hub_cores, a.hub_nic_factor, p["_path"]), fontsize=11)
    fig.tight_layout()
    files.append(a.out_prefix + "-time.png"); fig.savefig(files[-1], dpi=80); plt.close(fig)

    # 2. Cross-rack bytes per iteration.
    fig, ax = plt.subplots(figsize=(7, 4.5))
    mb = 102_228_128
    for R, col in zip(racks[1:], colors[1:]):
        Ns = np.array([n for n in (64, 128, 256, 512, 1024, 2048) if n >= R])
        for mode, ls in (("hierarchical", "-"), ("flat", "--")):
            ax.plot(Ns, [predict(plot_cfg(R, n, 25, mb, mode, a), p)["cross_rack_bytes"] / 1e9 for n in Ns],
                    ls, color=col, label=("R=%d" % R) if mode == "hierarchical" else None)
    ax.set_xscale("log", base=2); ax.set_yscale("log"); ax.grid(True, which="both", alpha=0.3)
    ax.set_xlabel("workers"); ax.set_ylabel("cross-rack bytes per iteration, GB (all racks)")
    ax.set_title("102 MB fp32 model: hierarchical (solid) vs flat (dashed)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout(); files.append(a.out_prefix + "-bytes.png"); fig.savefig(files[-1], dpi=80); plt.close(fig)

    # 3. Balance (PHub): cores a hub needs to aggregate at its NIC's line rate.
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 4.8))
    nics = np.array([10, 25, 40, 100, 200, 400])
    variants = [("tcp", "32KiB", "-", "TCP (measured per-byte cost)"),
                ("rdma", "32KiB", "--", "kernels only, 32 KiB rates"),
                ("rdma", "64MiB", ":", "kernels only, 64 MiB (DRAM) rates")]
    for opt, col in (("sgd", "C0"), ("adam", "C3")):
        for net, kr, ls, what in variants:
            ax1.plot(nics, [balance(p, g, opt, net, a.balance_wpr, kr) for g in nics], ls, color=col, marker=".",
                     label="%s, %s" % (opt, what))
    ax1.set_xscale("log"); ax1.set_yscale("log"); ax1.grid(True, which="both", alpha=0.3)
    ax1.set_xlabel("hub NIC, Gbit/s"); ax1.set_ylabel("hub cores at which CPU time = NIC time")
    ax1.set_title("cores a hub needs for line rate (%d workers/rack, 2 racks)" % a.balance_wpr, fontsize=10)
    ax1.legend(fontsize=7)
    wprs = np.array([1, 2, 4, 8, 16, 32, 64])
    for opt, col in (("sgd", "C0"), ("adam", "C3")):
        for net, kr, ls, what in variants:
            ax2.plot(wprs, [balance(p, 100, opt, net, w, kr) for w in wprs], ls, color=col, marker=".",
                     label="%s, %s" % (opt, what))
    ax2.set_xscale("log", base=2); ax2.set_yscale("log"); ax2.grid(True, which="both", alpha=0.3)
    ax2.set_xlabel("workers per rack"); ax2.set_ylabel("cores per 100 Gbit/s of hub NIC")
    ax2.set_title("the optimizer's share: Adam costs more when few workers share an update", fontsize=10)
    cores = np.arange(1, 33)
    for g, col in zip((10, 25, 100), ("C0", "C1", "C2")):
        for opt, ls in (("sgd", "-"), ("adam", ":")):
            ts = [predict(dict(plot_cfg(4, 4 * a.balance_wpr, g, 102_228_128, "hierarchical", a), hub_cores=c,
                               lanes=c, optimizer=opt), p)["time"] for c in cores]
            ax3.plot(cores, ts, ls, color=col, label="%g Gbit/s links, hub NIC %g, %s" % (g, g * a.hub_nic_factor, opt))
    ax3.set_yscale("log"); ax3.grid(True, which="both", alpha=0.3)
    ax3.set_xlabel("hub cores (lanes)"); ax3.set_ylabel("iteration time, s")
    ax3.set_title("102 MB, 4 racks x %d workers, hierarchical, TCP: the knee" % a.balance_wpr, fontsize=10)
    ax3.legend(fontsize=7)
    fig.tight_layout(); files.append(a.out_prefix + "-balance.png"); fig.savefig(files[-1], dpi=80); plt.close(fig)
    for f in files:
        print("wrote %s" % os.path.relpath(f, REPO))

    print("\nbalance: hub cores per Gbit/s of hub NIC at which its cores become the bound "
          "(hierarchical, 2 racks, 1 GiB model):")
    print("| optimizer | hub network cost | kernel rates | W=1 | W=4 | W=16 | W=64 | Gbit/s per core at W=16 |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for opt in ("sgd", "adam"):
        for net, kr, _, what in variants:
            c = [balance(p, 100, opt, net, w, kr) / 100 for w in (1, 4, 16, 64)]
            print("| %s | %s | %s | %s | %.1f |" % (opt, net, kr, " | ".join("%.4f" % x for x in c), 1 / c[2]))


def plot_cfg(R, N, gbit, model_bytes, mode, a):
    return {"racks": R, "wpr": math.ceil(N / R), "hub_cores": a.hub_cores, "lanes": a.hub_cores,
            "link_gbit": gbit, "intra_gbit": gbit, "hub_nic_gbit": gbit * a.hub_nic_factor,
            "model_bytes": model_bytes, "dtype": "fp32", "optimizer": "sgd", "mode": mode, "hub_net": "tcp",
            "sync": True, "keys": 4}


def balance(p, nic_gbit, opt, net, wpr, kernel_rates="32KiB"):
    """Cores at which one hub's CPU time equals its NIC time (hierarchical,
    2 racks, 1 GiB model, links ideal: no sync loss; 1 core = 1 lane)."""
    cfg = {"racks": 2, "wpr": wpr, "hub_cores": 1, "lanes": 1, "link_gbit": 1e6, "intra_gbit": nic_gbit,
           "hub_nic_gbit": nic_gbit, "model_bytes": 1 << 30, "dtype": "fp32", "optimizer": opt,
           "mode": "hierarchical", "hub_net": net, "sync": False, "keys": 4, "kernel_rates": kernel_rates}
    r = predict(cfg, p)
    return r["hub_cpu_s"] / r["terms"]["hub NIC"]


# ----------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    today = datetime.date.today().isoformat()

    f = sub.add_parser("fit", help="measure kernels, loopback TCP/shm and shaped links; write params JSON")
    f.add_argument("--build", default=os.path.join(REPO, "build"), help="build dir with bin/ [build]")
    f.add_argument("--out", help="params file [bench/model/params-<date>.json]")
    f.add_argument("--kernel-bench", help="rackhub-kernel-bench binary [BUILD/bin, else build/bin, else "
                                          "bench/results/kernels.md]")
    f.add_argument("--date", default=today)
    f.add_argument("--rates", default="1gbit 300mbit", help="link calibration rates (tc units)")
    f.add_argument("--rounds", type=int, default=2, help="link calibration rounds")
    f.add_argument("--iterations", type=int, default=10, help="loopback iterations per run")
    f.add_argument("--no-links", action="store_true", help="skip the netns link calibration (root)")
    f.add_argument("--parts", default="kernels,loopback,links",
                   help="what to measure; the other parts are kept from the existing --out file")
    f.add_argument("--wait-quiet", type=int, default=300,
                   help="before each loopback run wait up to S s until other processes leave the CPU idle [300]")

    p = sub.add_parser("predict", help="iteration time and cross-rack bytes of one configuration")
    p.add_argument("--workers", type=int, required=True, help="workers, all racks")
    p.add_argument("--racks", type=int, default=1)
    p.add_argument("--hub-cores", type=int, default=16, help="hub cores = lanes")
    p.add_argument("--link-gbit", type=float, default=25, help="each rack's cross-rack (uplink) speed")
    p.add_argument("--intra-gbit", type=float, default=25, help="worker NIC speed (and hub NIC unless --hub-nic-gbit)")
    p.add_argument("--hub-nic-gbit", type=float, help="hub NIC speed [--intra-gbit]")
    p.add_argument("--model-bytes", type=parse_size, required=True, help="fp32 model size, e.g. 100MB, 1GiB")
    p.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="fp32", help="wire dtype")
    p.add_argument("--optimizer", choices=sorted(SLOTS), default="sgd")
    p.add_argument("--mode", choices=["hierarchical", "flat"], default="hierarchical")
    p.add_argument("--hub-net", choices=["tcp", "rdma"], default="tcp",
                   help="tcp: measured per-byte TCP cost on the hub; rdma: none (assumption, not measured here)")
    p.add_argument("--sync", choices=["measured", "ideal"], default="measured",
                   help="measured: link efficiency falls with the senders pacing the replies (calibrated)")
    p.add_argument("--keys", type=int, default=4)
    p.add_argument("--params")
    p.add_argument("--json", action="store_true")

    v = sub.add_parser("validate", help="predicted vs measured multirack_netns.sh runs")
    v.add_argument("runs", nargs="*", help="JSON-lines files of multirack_netns.sh --json")
    v.add_argument("--run", action="store_true", help="run bench/multirack_netns.sh first (root)")
    v.add_argument("--configs", default="2x2 3x2 4x2 2x4", help="RxW layouts to run")
    v.add_argument("--rates", default="1gbit 500mbit 300mbit none", help="'none': unshaped (diagnostic rows)")
    v.add_argument("--bytes", default="16MiB")
    v.add_argument("--iterations", type=int, default=10, help="timed iterations per run (+2 warm-up) [10]")
    v.add_argument("--rounds", type=int, default=3)
    v.add_argument("--build", default=os.path.join(REPO, "build"))
    v.add_argument("--out-dir", default="/tmp/rackhub-plan-validate")
    v.add_argument("--lanes", type=int, default=os.cpu_count(), help="lanes per hub in the runs [cores]")
    v.add_argument("--unshaped", action="store_true", help="also show rate 'none' rows (CPU-bound, diagnostic)")
    v.add_argument("--wait-quiet", type=int, default=600,
                   help="--run: before each layout wait up to S s until other processes leave the CPU idle [600]")
    v.add_argument("--params")

    g = sub.add_parser("plot", help="planning curves and balance plot (PNG)")
    g.add_argument("--out-prefix", default=os.path.join(REPO, "bench", "results", "planning-" + today))
    g.add_argument("--hub-cores", type=int, default=16)
    g.add_argument("--hub-nic-factor", type=float, default=4, help="hub NIC speed / rack link speed [4]")
    g.add_argument("--balance-wpr", type=int, default=16, help="workers per rack in the balance plot")
    g.add_argument("--params")

    a = ap.parse_args()
    {"fit": cmd_fit, "predict": cmd_predict, "validate": cmd_validate, "plot": cmd_plot}[a.cmd](a)


if __name__ == "__main__":
    main()
