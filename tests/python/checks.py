"""Checks of a rank's worker script (collectives_worker.py,
late_rank_worker.py): `CHECK ok|FAIL name detail` per check, then
`CHECKS n failed k [names]`, which test_collectives.py reads per rank."""

failed = []
count = 0


def check(name, cond, detail=""):
    global count
    count += 1
    if not cond:
        failed.append(name)
    print(f"CHECK {'ok  ' if cond else 'FAIL'} {name} {detail}", flush=True)


def raises(fn, exc, text):
    """(True, what) if fn() raised `exc` with `text` in its message."""
    try:
        fn()
    except exc as e:
        return text in str(e), f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - report what was raised instead
        return False, f"{type(e).__name__}: {e}"
    return False, "nothing raised"


def summary():
    """Prints the totals line; returns the exit code (1 if a check failed)."""
    print(f"CHECKS {count} failed {len(failed)} {failed}", flush=True)
    return 1 if failed else 0
