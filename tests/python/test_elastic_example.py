"""The Horovod Elastic example (client/examples/horovod_elastic.py) runs on
rackhub with only its import and its launcher changed:

1. the script names rackhub only in its import line (and in its docstring,
   which explains the change): with `import horovod.torch as hvd` in place
   of `import rackhub.torch as hvd` and the docstring removed, nothing in it
   is rackhub's;
2. rackhub-run -n 3 --min-np 2 --max-np 4 runs it to the end (exit 0; its
   ElasticSampler splits 1440 samples over the 3 ranks: 15 steps of 32 an
   epoch), rank 0 prints one line per epoch with size 3, and the loss goes
   down;
3. bad launcher arguments are refused by name.

    test_elastic_example.py EXAMPLE      (RACKHUB_BIN_DIR: rackhub-run's directory)
"""
import ast
import os
import re
import subprocess
import sys

import harness

harness.require_torch()


def main():
    example = sys.argv[1]
    ok = True
    src = open(example).read()
    tree = ast.parse(src)
    body = tree.body[1:] if isinstance(tree.body[0], ast.Expr) else tree.body  # the docstring
    code = "\n".join(ast.get_source_segment(src, node) for node in body)
    horovod = code.replace("import rackhub.torch as hvd", "import horovod.torch as hvd")
    good = "rackhub" not in horovod and "import horovod.torch as hvd" in horovod
    print(f"{'ok  ' if good else 'FAIL'} the example names rackhub only in its import")
    ok &= good

    run = os.path.join(os.environ["RACKHUB_BIN_DIR"], "rackhub-run")
    r = subprocess.run([run, "-n", "3", "--min-np", "2", "--max-np", "4", "--lanes", "2",
                        "python3", example, "--epochs", "4", "--samples", "1440"],
                       capture_output=True, text=True, timeout=200)
    print(r.stdout + r.stderr)
    epochs = re.findall(r"^\[0\] epoch (\d+): size (\d+) loss (\S+)$", r.stdout, re.M)
    good = (r.returncode == 0 and [int(e[0]) for e in epochs] == [0, 1, 2, 3]
            and all(e[1] == "3" for e in epochs) and float(epochs[-1][2]) < float(epochs[0][2])
            and "[0] done" in r.stdout)
    print(f"{'ok  ' if good else 'FAIL'} rackhub-run: exit {r.returncode}, epochs {epochs}")
    ok &= good
    # Bad launcher input: refused by name, before anything starts.
    bad = [(["-n", "2", "--min-np", "1", "python3", "x.py"], "--min-np and --max-np go together"),
           (["-n", "5", "--min-np", "2", "--max-np", "4", "python3", "x.py"],
            "need 1 <= --min-np (2) <= -n (5) <= --max-np (4)"),
           (["--add", "2"], "--add needs --job DIR"),
           (["--add", "2", "--job", "/nonexistent"], "not the directory of a running elastic job")]
    for args, want in bad:
        r = subprocess.run([run] + args, capture_output=True, text=True, timeout=30)
        good = r.returncode != 0 and want in r.stderr
        print(f"{'ok  ' if good else 'FAIL'} rackhub-run {' '.join(args)}: {r.stderr.strip()}")
        ok &= good
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
