"""Model, data and optimizers shared by the rank processes (worker.py) and the
single-process reference (test_equivalence.py)."""
import torch

IN, HIDDEN1, HIDDEN2, OUT = 32, 256, 64, 4  # fc1.weight has 8192 elements, fc2.weight 16384 (2 chunks)
BATCH = 16
LR = {"momentum": 0.05, "adam": 0.01, "sumonly-adam": 0.01, "sumonly-sgd-copy": 0.05}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(IN, HIDDEN1)
        self.fc2 = torch.nn.Linear(HIDDEN1, HIDDEN2)
        self.fc3 = torch.nn.Linear(HIDDEN2, OUT)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


def make_model(seed):
    torch.manual_seed(seed)
    return Net()


def data(scenario_seed, rank, step):
    g = torch.Generator().manual_seed(scenario_seed * 1_000_003 + rank * 10_007 + step)
    x = torch.randn(BATCH, IN, generator=g)
    y = torch.sin(x[:, :OUT] * 2.0) + 0.1 * torch.randn(BATCH, OUT, generator=g)
    return x, y


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def local_optimizer(kind, params):
    """The torch.optim optimizer a scenario means (reference, and sum-only ranks)."""
    if kind == "momentum":
        return torch.optim.SGD(params, lr=LR[kind], momentum=0.9)
    if kind in ("adam", "sumonly-adam"):
        return torch.optim.Adam(params, lr=LR[kind])
    if kind == "sumonly-sgd-copy":
        return torch.optim.SGD(params, lr=LR[kind], momentum=0.9)
    raise ValueError(kind)
