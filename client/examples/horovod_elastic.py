"""A Horovod Elastic PyTorch training script, in the style of Horovod's
elastic examples (pytorch_synthetic_benchmark_elastic.py): only its import
(`import horovod.torch as hvd` -> `import rackhub.torch as hvd`) and its
launcher (`horovodrun -np 4 --min-np 2 --max-np 8 ...` -> `rackhub-run -n 4
--min-np 2 --max-np 8 ...`) are changed. tests/python/test_elastic_example.py
checks that nothing else names rackhub.

    build/bin/rackhub-run -n 4 --min-np 2 --max-np 8 python3 client/examples/horovod_elastic.py

The data set is synthetic (the same on every rank): inputs x ~ N(0, I),
labels the argmax of a fixed random teacher. As in Horovod's
pytorch_mnist_elastic.py, an ElasticSampler in the TorchState splits the
samples of the epoch not trained yet over the current ranks (after a rank
leaves or joins the rest are split again, nothing trained is redone); the
learning rate scales with size() and is reset when the membership changes.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data

import rackhub.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch elastic example")
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--samples", type=int, default=2560, help="samples per epoch")
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


g = torch.Generator().manual_seed(7)
inputs = torch.randn(args.samples, 32, generator=g)
dataset = torch.utils.data.TensorDataset(inputs, (inputs @ teacher).argmax(dim=1))
train_sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)
train_loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size,
                                           sampler=train_sampler)


model = Net()
optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     op=hvd.Average)


def train_epoch(state):
    model.train()
    total, count = 0.0, 0
    # This rank's share of the samples of the epoch not trained yet.
    for batch_idx, (x, y) in enumerate(train_loader):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        total, count = total + loss.item(), count + 1
        state.train_sampler.record_batch(batch_idx, args.batch_size)
        if batch_idx % args.batches_per_commit == 0:
            state.commit()
    return total, count


@hvd.elastic.run
def train(state):
    while state.epoch < args.epochs:
        total, count = train_epoch(state)
        sums = hvd.allreduce(torch.tensor([total, float(count)]), op=hvd.Sum, name="avg_loss")
        if hvd.rank() == 0:
            print(f"epoch {state.epoch}: size {hvd.size()} loss "
                  f"{sums[0].item() / max(sums[1].item(), 1.0):.4f}", flush=True)
        state.epoch += 1
        state.train_sampler.set_epoch(state.epoch)  # at the end of the epoch
        state.commit()


def on_state_reset():
    # Horovod's example: the learning rate follows the number of workers.
    for group in optimizer.param_groups:
        group["lr"] = args.lr * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, train_sampler=train_sampler, epoch=0)
state.register_reset_callbacks([on_state_reset])
train(state)
if hvd.rank() == 0:
    print("done", flush=True)
