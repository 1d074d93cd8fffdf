"""Horovod's torch API beyond the basics on W ranks (2 or 3; rackhub-run
with its own hub): horovod_api_worker.py checks every function against a
single-process reference on every rank; this driver requires every rank to
pass every check. Usage: test_horovod_api.py W"""
import os
import re
import subprocess
import sys

import harness

harness.require_torch()

MIN_CHECKS = 370  # every rank runs at least this many (rank 0 one more)


def import_cycles():
    """The modules of rackhub.torch import each other without a cycle
    (their relative imports, read from the sources)."""
    import ast
    d = os.path.join(os.environ["PYTHONPATH"].split(os.pathsep)[0], "rackhub", "torch")
    graph = {}
    for f in os.listdir(d):
        if f.endswith(".py"):
            deps = set()
            for n in ast.walk(ast.parse(open(os.path.join(d, f)).read())):
                if isinstance(n, ast.ImportFrom) and n.level == 1:
                    deps |= {n.module.split(".")[0]} if n.module else {a.name for a in n.names}
            graph[f[:-3]] = deps
    found = []

    def visit(m, path):
        for x in sorted(graph.get(m, ())):
            if x in path:
                found.append(path[path.index(x):] + [x])
            elif x != "__init__":
                visit(x, path + [x])
    for m in graph:
        visit(m, [m])
    return found


def main():
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    run = os.path.join(os.environ["RACKHUB_BIN_DIR"], "rackhub-run")
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([run, "-n", str(world), "--lanes", "2", "python3",
                        os.path.join(here, "horovod_api_worker.py")],
                       capture_output=True, text=True, timeout=600, cwd=here)
    print(r.stdout + r.stderr)
    totals = re.findall(r"^\[(\d+)\] CHECKS (\d+) failed (\d+)", r.stdout, re.M)
    ok = r.returncode == 0 and len(totals) == world and all(int(f) == 0 for _, _, f in totals)
    ok &= all(int(n) >= MIN_CHECKS for _, n, _ in totals)
    cycles = import_cycles()
    print(f"import cycles in rackhub.torch: {cycles or 'none'}")
    ok &= not cycles
    print(f"{'PASSED' if ok else 'FAILED'}: exit {r.returncode}, per rank (rank, checks, "
          f"failed): {totals}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
