"""Asking the hub again after a recovery of the tenant.

A request that meets a recovery of the tenant (a rank lost or joined in an
elastic job, docs/elastic.md "Membership") fails with a non-fatal
WORKER_LOST (or ROLLED_BACK). The client contract (client.h,
docs/elastic.md) is: Pull a key of the tenant, which the hub holds until the
recovery ended, then ask again. `again_after_recovery` is that loop, bounded
by a deadline; every caller (the optimizer's push_again, the elastic
membership rounds, the hub-side rollback) runs it instead of its own copy.

Thread use: the caller's (a training thread or the collective executor).
"""
import time

import torch


def again_after_recovery(client, attempt, key, elements, timeout, errors, give_up=None):
    """Returns attempt()'s result. After an exception of the classes
    `errors`: raises it if give_up(e) is true or `timeout` seconds have
    passed since the call, else Pulls `key` (`elements` fp32 values into a
    scratch buffer; it returns once the tenant's recovery ended) and tries
    again."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return attempt()
        except errors as e:
            if (give_up is not None and give_up(e)) or time.monotonic() >= deadline:
                raise
        client.wait(client.pull(key, torch.empty(elements, dtype=torch.float32).numpy()))
