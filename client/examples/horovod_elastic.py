"""A Horovod Elastic PyTorch training script, in the style of Horovod's
elastic examples (pytorch_synthetic_benchmark_elastic.py): only its import
(`import horovod.torch as hvd` -> `import rackhub.torch as hvd`) and its
launcher (`horovodrun -np 4 --min-np 2 --max-np 8 ...` -> `rackhub-run -n 4
--min-np 2 --max-np 8 ...`) are changed. tests/python/test_elastic_example.py
checks that nothing else names rackhub.

    build/bin/rackhub-run -n 4 --min-np 2 --max-np 8 python3 client/examples/horovod_elastic.py

The data set is synthetic: inputs x ~ N(0, I), labels the argmax of a fixed
random teacher. Each rank takes every size()-th batch from rank(); the
learning rate scales with size() and is reset when the membership changes.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

import rackhub.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch elastic example")
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--batches-per-epoch", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--batches-per-commit", type=int, default=1)
args = parser.parse_args()

hvd.init()
torch.manual_seed(42)
torch.set_num_threads(1)

teacher = torch.randn(32, 4)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 4)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def batch(epoch, index):
    g = torch.Generator().manual_seed(epoch * 100003 + index)
    x = torch.randn(args.batch_size, 32, generator=g)
    return x, (x @ teacher).argmax(dim=1)


model = Net()
optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     op=hvd.Average)


def train_epoch(state):
    model.train()
    total, count = 0.0, 0
    for state.batch in range(state.batch, args.batches_per_epoch):
        # Every rank takes its share of the epoch's batches.
        x, y = batch(state.epoch, state.batch * hvd.size() + hvd.rank())
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        total, count = total + loss.item(), count + 1
        if state.batch % args.batches_per_commit == 0:
            state.commit()
    return total / max(count, 1)


@hvd.elastic.run
def train(state):
    while state.epoch < args.epochs:
        loss = train_epoch(state)
        avg = hvd.allreduce(torch.tensor([loss]), name="avg_loss").item()
        if hvd.rank() == 0:
            print(f"epoch {state.epoch}: size {hvd.size()} loss {avg:.4f}", flush=True)
        state.epoch += 1
        state.batch = 0
        state.commit()


def on_state_reset():
    # Horovod's example: the learning rate follows the number of workers.
    for group in optimizer.param_groups:
        group["lr"] = args.lr * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
state.register_reset_callbacks([on_state_reset])
train(state)
if hvd.rank() == 0:
    print("done", flush=True)
