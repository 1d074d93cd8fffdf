"""Optimizers that run on the hub, and the wire names of reductions.

A hub-side optimizer is described by a spec: a dict of the hub's fields
(type, lr, momentum, weight_decay, beta1, beta2, eps, initial_accumulator,
reduction). It comes either from rackhub.torch.SGD/Adam/AdamW/Adagrad (the
hub's formulas match torch.optim's) or from a torch.optim optimizer's param
group (DistributedOptimizer(..., hub_optimizer=True)): spec_of_group()
translates SGD, Adam, AdamW and Adagrad, and refuses every setting the hub
does not implement, naming it.
"""
import torch

# Reduction ops (Horovod's names). Min, Max and Product reduce on the hub
# element-wise (the collectives, collectives.py); DistributedOptimizer takes
# Average and Sum.
Average = "average"
Sum = "sum"
Adasum = "adasum"
Min = "min"
Max = "max"
Product = "product"


def reduction_of(op):
    """The hub's reduction for a Horovod op."""
    if op in (None, Average):
        return "mean"
    if op == Sum:
        return "sum"
    if op == Adasum:
        raise ValueError("op: Adasum is not implemented by rackhub (use Average or Sum)")
    if op in (Min, Max, Product):
        raise ValueError(f"op: {op} is for the collectives (allreduce, grouped_allreduce, "
                         f"reducescatter); a DistributedOptimizer averages or sums gradients "
                         f"(Average or Sum)")
    raise ValueError(f"op: rackhub.torch.Average or rackhub.torch.Sum, got {op!r}")


# ---------------------------------------------------------------------------
# Specs written by hand: DistributedOptimizer(rh.SGD(lr=0.1), named_parameters)

def SGD(lr, momentum=0.0, weight_decay=0.0, nesterov=False, reduction="mean"):
    """torch.optim.SGD semantics (dampening 0): v = m*v + g + wd*p; p -= lr*v."""
    t = "nesterov" if nesterov else ("momentum" if momentum else "sgd")
    spec = {"type": t, "lr": lr, "weight_decay": weight_decay, "reduction": reduction}
    if momentum:
        spec["momentum"] = momentum
    return spec


def Adam(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, reduction="mean"):
    """torch.optim.Adam semantics (L2 weight decay folded into the gradient)."""
    return {"type": "adam", "lr": lr, "beta1": betas[0], "beta2": betas[1], "eps": eps,
            "weight_decay": weight_decay, "reduction": reduction}


def AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, reduction="mean"):
    return {"type": "adamw", "lr": lr, "beta1": betas[0], "beta2": betas[1], "eps": eps,
            "weight_decay": weight_decay, "reduction": reduction}


def Adagrad(lr=1e-2, eps=1e-10, weight_decay=0.0, initial_accumulator_value=0.0,
            reduction="mean"):
    return {"type": "adagrad", "lr": lr, "eps": eps, "weight_decay": weight_decay,
            "initial_accumulator": initial_accumulator_value, "reduction": reduction}


_SPEC_FIELDS = ("type", "lr", "momentum", "weight_decay", "beta1", "beta2", "eps",
                "initial_accumulator", "reduction")


class HubOptimizer(torch.optim.Optimizer):
    """The local face of a hand-written spec: a torch.optim.Optimizer whose
    param groups carry the spec's fields (so LR schedulers and state_dict
    work) and whose own step does nothing (the hub steps)."""

    def __init__(self, params, spec=None):
        if spec is None:  # re-created from param groups that carry every field
            super().__init__(params, {})
            return
        if not isinstance(spec, dict) or "type" not in spec:
            raise TypeError("optimizer: a torch.optim.Optimizer or a hub spec "
                            "(rackhub.torch.SGD/Adam/AdamW/Adagrad, or a dict with 'type')")
        unknown = sorted(set(spec) - set(_SPEC_FIELDS))
        if unknown:
            raise ValueError(f"optimizer.{unknown[0]}: unknown field (one of "
                             f"{', '.join(_SPEC_FIELDS)})")
        if spec["type"] == "sum-only":
            raise ValueError("optimizer: for sum-only pass a local torch.optim optimizer")
        super().__init__(params, dict(spec))

    @torch.no_grad()
    def step(self, closure=None):
        return closure() if closure is not None else None


def torch_optimizer_name(optimizer):
    """The name of the torch.optim class `optimizer` is or derives from (a
    subclass of torch.optim.Adam is "Adam"); else its own class's name."""
    for base in type(optimizer).__mro__:
        if base.__module__.startswith("torch.optim"):
            return base.__name__
    return type(optimizer).__name__


def spec_of_group(optimizer, group):
    """The hub spec equal to `group` of `optimizer` (the reduction is added
    by the caller). Raises ValueError naming what the hub cannot do."""
    if isinstance(optimizer, HubOptimizer):
        spec = {k: group[k] for k in _SPEC_FIELDS if k in group and k != "reduction"}
        return {k: v for k, v in spec.items() if not (k != "type" and v == 0)}
    name = torch_optimizer_name(optimizer)

    def refuse(setting):
        raise ValueError(f"hub_optimizer: the hub's {name} has no {setting}; run it locally "
                         f"(hub_optimizer=False)")

    if group.get("maximize"):
        refuse("maximize=True")
    wd = float(group.get("weight_decay", 0.0))
    if name == "SGD":
        if group.get("dampening", 0):
            refuse("dampening")
        m = float(group.get("momentum", 0.0))
        t = "nesterov" if group.get("nesterov") else ("momentum" if m else "sgd")
        spec = {"type": t, "lr": float(group["lr"])}
        if m:
            spec["momentum"] = m
    elif name in ("Adam", "AdamW"):
        if group.get("amsgrad"):
            refuse("amsgrad=True")
        b1, b2 = group["betas"]
        spec = {"type": name.lower(), "lr": float(group["lr"]), "beta1": float(b1),
                "beta2": float(b2), "eps": float(group["eps"])}
    elif name == "Adagrad":
        if group.get("lr_decay", 0):
            refuse("lr_decay")
        spec = {"type": "adagrad", "lr": float(group["lr"]), "eps": float(group["eps"])}
        if group.get("initial_accumulator_value", 0):
            spec["initial_accumulator"] = float(group["initial_accumulator_value"])
    else:
        raise ValueError(f"hub_optimizer: the hub implements SGD, Adam, AdamW and Adagrad, "
                         f"not {name}; run it locally (hub_optimizer=False)")
    if wd:
        spec["weight_decay"] = wd
    return spec
