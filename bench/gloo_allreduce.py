#!/usr/bin/python3
"""gloo all_reduce baseline for rackhub-bench --compare gloo.

Runs W ranks as local processes (torch.multiprocessing, fork) joined through
torch.distributed's gloo backend on loopback, and all_reduces one tensor of
--bytes/4 elements (the same model as `rackhub-bench --bytes`: SIZE is the
fp32 model size, so a 16-bit dtype puts half of it on the wire). Each
iteration: barrier, then time the all_reduce alone on every rank; the
iteration's time is the slowest rank's. Prints one JSON line:

  {"backend":"gloo", "median_ms":..., "times_ms":[...], "dtype":..., ...}

Rank r's tensor is (r+1)*p, p a random pattern of multiples of 1/64 in
[-K/64, K/64], K at most 8 and small enough that every partial sum (at most
K*W(W+1)/2 sixty-fourths) is exact in the dtype's significand (fp32 24 bits,
fp16 11, bf16 8), so the first all_reduce's result must be exactly
p*W(W+1)/2 in any reduction order; where even K = 1 is too large, every rank
sends p (partial sums at most K*W). Every rank checks every element
("verified" in the JSON; a mismatch is exit 1).

--profile resnet50 splits the same flat buffer into ResNet-50's 161 parameter
tensors (bench/torch/bench_tensors.py's resnet50_elements, which also sets the
model size) and all_reduces them as a trainer would: --bucket-mib 0 one
all_reduce per tensor, --bucket-mib B DDP's way, consecutive tensors taken
last first (the order backward produces them) into buckets of at most B MiB
(bucket_cap_mb; DDP's smaller first bucket is not modelled). Each tensor or
bucket is a view of the flat buffer (DDP copies gradients into its bucket
buffers; that copy is not timed here), all of them issued with async_op=True
and then waited for, as DDP's reducer does. The check is the same, over
every element of the flat buffer.

On a rack on one machine (bench/rack_netns.sh) --netns-per-rank P puts rank r
in network namespace P<r> (setns in the forked rank, before gloo starts), with
--master-addr (rank 0's address) and --ifname (GLOO_SOCKET_IFNAME).

Run it with Debian's /usr/bin/python3 (python3-torch). Without torch it prints
{"error": "..."} and exits 3. torch 1.13's gloo cannot all_reduce bf16
("Invalid scalar type"); then --bf16-fallback (fp16 by default) is used and
the JSON says so ("dtype_requested":"bf16", "dtype":"fp16",
"bf16_supported":false). --bf16-fallback none makes it an error instead.

Exit codes: 0 ok, 1 a rank failed, 2 usage, 3 torch or gloo unavailable,
4 dtype unsupported.
"""

import argparse
import datetime
import json
import os
import re
import socket
import sys
import time

SIZE_UNITS = {"": 0, "B": 0, "K": 10, "KiB": 10, "M": 20, "MiB": 20, "G": 30, "GiB": 30}
EXIT_UNAVAILABLE = 3
EXIT_DTYPE = 4


def parse_size(text):
    m = re.fullmatch(r"(\d+)([A-Za-z]*)", text)
    if not m or m.group(2) not in SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (e.g. 64MiB)")
    return int(m.group(1)) << SIZE_UNITS[m.group(2)]


def free_port():
    # Bound then released: another process could take it in between, which
    # only makes init fail loudly (the caller may simply run again).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def emit(obj):
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def percentile(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]


def probe_rank(rank, dtype_name, port, out_queue):
    """Can gloo all_reduce this dtype? A one-rank group of its own, so that a
    refusal cannot leave the real group in a bad state (in torch 1.13 the
    error surfaces asynchronously, sometimes in the next collective)."""
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", rank=0, world_size=1)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    try:
        dist.all_reduce(torch.ones(8, dtype=dtype))
        out_queue.put(None)
    except RuntimeError as e:
        out_queue.put(str(e))
    dist.destroy_process_group()


CLONE_NEWNET = 0x40000000


def enter_netns(name):
    """Moves this (single-threaded, just forked) process into network
    namespace `name`, as `ip netns exec` would for the sockets it opens."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


SIGNIFICAND_BITS = {"fp32": 24, "fp16": 11, "bf16": 8}


def exact_pattern(workers, dtype):
    """(K, rank -> weight, sum of weights): rank r sends weight(r) * p with p
    in [-K, K] (sixty-fourths), every partial sum exact in `dtype`."""
    limit = 2 ** SIGNIFICAND_BITS[dtype] - 1
    ranked = workers * (workers + 1) // 2
    if limit // ranked >= 1:
        return min(8, limit // ranked), (lambda r: r + 1), ranked
    return max(1, min(8, limit // workers)), (lambda r: 1), workers


def profile_groups(args, elem_bytes):
    """[(begin, end)] element ranges of the flat buffer, one all_reduce each,
    in issue order."""
    elements = args.bytes // 4
    if args.profile == "even":
        return [(0, elements)]
    sizes = resnet50_elements()
    bounds, at = [], 0
    for n in sizes:
        bounds.append((at, at + n))
        at += n
    if args.bucket_mib == 0:
        return bounds
    cap = args.bucket_mib << 20
    groups, begin, end = [], None, None
    for b, e in reversed(bounds):  # contiguous: a bucket is one slice
        if end is not None and (end - b) * elem_bytes > cap:
            groups.append((begin, end))
            end = None
        if end is None:
            end = e
        begin = b
    groups.append((begin, end))
    return groups


def resnet50_elements():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch"))
    from bench_tensors import resnet50_elements as sizes  # one place for the profile
    return sizes()


def rank_main(rank, args, port, out_queue):
    if args.netns_per_rank:
        enter_netns(f"{args.netns_per_rank}{rank}")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # one core-sized process per rank, like rackhub's workers
    os.environ["MASTER_ADDR"] = args.master_addr
    os.environ["MASTER_PORT"] = str(port)
    os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
    dist.init_process_group("gloo", rank=rank, world_size=args.workers,
                            timeout=datetime.timedelta(seconds=args.timeout))
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    used = args.used_dtype
    elements = args.bytes // 4
    gen = torch.Generator().manual_seed(12345)  # the same pattern on every rank
    k, weight, total = exact_pattern(args.workers, used)
    pattern = torch.randint(-k, k + 1, (elements,), generator=gen, dtype=torch.int32)
    tensor = (pattern * weight(rank)).to(dtypes[used]).div_(64)
    expected = (pattern * total).to(dtypes[used]).div_(64)
    del pattern
    views = [tensor[b:e] for b, e in profile_groups(args, tensor.element_size())]
    mismatches = 0
    times = []
    for it in range(args.warmup + args.iterations):
        dist.barrier()
        t0 = time.perf_counter()
        if len(views) == 1:
            dist.all_reduce(tensor)
        else:
            for work in [dist.all_reduce(v, async_op=True) for v in views]:
                work.wait()
        t1 = time.perf_counter()
        if it >= args.warmup:
            times.append((t1 - t0) * 1e3)
        if it == 0:  # untimed: every element of the first sum, exactly
            mismatches = int((tensor != expected).sum())
            del expected
        tensor.mul_(1.0 / args.workers)  # untimed: keeps 16-bit sums finite
    # The iteration's time is the slowest rank's.
    mine = torch.tensor(times + [float(mismatches)], dtype=torch.float64)
    gathered = [torch.zeros_like(mine) for _ in range(args.workers)]
    dist.all_gather(gathered, mine)
    dist.destroy_process_group()
    if rank == 0:
        stacked = torch.stack(gathered)
        wrong = int(stacked[:, -1].sum())
        per_iter = stacked[:, :-1].max(dim=0).values.tolist()
        median = percentile(per_iter, 0.5)  # the same nearest-rank median as rackhub-bench
        wire = 4 if used == "fp32" else 2
        out_queue.put({
            "backend": "gloo",
            "torch": torch.__version__,
            "workers": args.workers,
            "bytes": args.bytes,
            "elements": elements,
            "wire_bytes": elements * wire,
            "dtype_requested": args.dtype,
            "dtype": used,
            "bf16_supported": None if args.dtype != "bf16" else used == "bf16",
            "note": args.note,
            "profile": args.profile,
            "bucket_mib": args.bucket_mib,
            "all_reduces": len(views),
            "iterations": args.iterations,
            "warmup": args.warmup,
            "median_ms": round(median, 4),
            "p10_ms": round(percentile(per_iter, 0.1), 4),
            "p90_ms": round(percentile(per_iter, 0.9), 4),
            "gbps_per_worker": round(args.bytes / (median * 1e-3) / 1e9, 4),
            "times_ms": [round(t, 4) for t in per_iter],
            "verified": wrong == 0,
            "wrong_elements": wrong,
            "exit": 0 if wrong == 0 else 1,
        })


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--bytes", type=parse_size, default=parse_size("64MiB"),
                   help="model size in fp32 bytes, as rackhub-bench --bytes (elements = SIZE/4)")
    p.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default="fp32")
    p.add_argument("--profile", choices=["even", "resnet50"], default="even",
                   help="resnet50: ResNet-50's 161 tensors (sets --bytes)")
    p.add_argument("--bucket-mib", type=int, default=0,
                   help="with --profile resnet50: 0 = one all_reduce per tensor, B = DDP-style "
                        "buckets of at most B MiB")
    p.add_argument("--bf16-fallback", choices=["fp16", "fp32", "none"], default="fp16")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--timeout", type=int, default=300, help="gloo timeout, seconds")
    p.add_argument("--netns-per-rank", metavar="P", default="",
                   help="rank r runs in network namespace P<r> (needs root)")
    p.add_argument("--master-addr", default="127.0.0.1", help="rank 0's address")
    p.add_argument("--ifname", default="lo", help="GLOO_SOCKET_IFNAME")
    p.add_argument("--probe", action="store_true",
                   help="only check that torch + gloo import; print versions")
    args = p.parse_args()
    if args.workers < 1 or args.iterations < 1 or args.warmup < 0 or args.bytes < 4:
        p.error("--workers and --iterations must be >= 1, --bytes >= 4")
    if args.bucket_mib < 0:
        p.error("--bucket-mib must be >= 0")
    if args.profile == "resnet50":
        args.bytes = 4 * sum(resnet50_elements())
    try:
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
    except ImportError as e:
        emit({"error": f"{sys.executable} cannot import torch ({e}); install python3-torch "
                       "(deploy/bootstrap.sh) or pass another interpreter"})
        return EXIT_UNAVAILABLE
    if not dist.is_available() or not dist.is_gloo_available():
        emit({"error": f"torch {torch.__version__} has no gloo backend"})
        return EXIT_UNAVAILABLE
    if args.probe:
        emit({"torch": torch.__version__, "python": sys.executable, "gloo": True})
        return 0
    ctx = mp.get_context("fork")
    queue = ctx.SimpleQueue()
    args.used_dtype, args.note = args.dtype, None
    if args.dtype != "fp32":
        try:
            mp.start_processes(probe_rank, args=(args.dtype, free_port(), queue), nprocs=1,
                               join=True, start_method="fork")
            refusal = queue.get()
        except Exception as e:
            refusal = f"probe failed: {str(e).strip()[-500:]}"
        if refusal is not None:
            if args.dtype != "bf16" or args.bf16_fallback == "none":
                emit({"error": f"gloo cannot all_reduce {args.dtype}: {refusal}"})
                return EXIT_DTYPE
            args.used_dtype = args.bf16_fallback
            args.note = (f"torch {torch.__version__} gloo cannot all_reduce bf16 ({refusal}); "
                         f"timed {args.used_dtype} instead (same elements; fp16 puts the same "
                         "bytes on the wire)")
    try:
        mp.start_processes(rank_main, args=(args, free_port(), queue), nprocs=args.workers,
                           join=True, start_method="fork")
    except Exception as e:  # a rank raised or died: report it, never hang
        emit({"error": f"a gloo rank failed: {str(e).strip()[-2000:]}"})
        return 1
    if queue.empty():
        emit({"error": "rank 0 reported nothing"})
        return 1
    result = queue.get()
    code = result.pop("exit", 0)
    if code != 0:
        result["error"] = (f"gloo all_reduce gave a wrong sum: {result['wrong_elements']} "
                           "elements of the first iteration differ from the reference")
    emit(result)
    return code


if __name__ == "__main__":
    sys.exit(main())
