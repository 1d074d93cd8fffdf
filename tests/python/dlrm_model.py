"""The DLRM demo's data, model and single-process reference (dlrm_demo.py
trains the same model through rackhub; test_embedding.py reuses the
row-sparse reference math).

Data (synthetic clicks from a known ground-truth model, generated here with
a fixed seed, identical in every process):
- 4 dense features ~ N(0, 1); 3 categorical features (user: 20,000 ids,
  item: 8,000, category: 1,000) and one bag of 3 tags (2,000 ids) per sample,
  every id Zipf-distributed (p(k) ~ 1/(k+1)^1.05 over a fixed random
  permutation of the table's ids).
- True logit = -0.5 + x . w + b_user + b_item + b_cat + mean(b_tags) + <U_user, V_item>
  (per-id effects ~ N(0, 0.6^2), U, V in R^4 ~ N(0, 0.6^2)); label ~
  Bernoulli(sigmoid(true logit)). The true logit's AUC on the held-out set is
  the Bayes-optimal AUC (printed for context).

Model (DLRM, Naumov et al. 2019): nn.Embedding(sparse=True) of dim 8 for
user, item, category; nn.EmbeddingBag(sparse=True, mode="sum") for the tags;
bottom MLP 4-16-8 on the dense features; pairwise dot products of the 5
vectors (10) concatenated with the bottom output (8); top MLP 18-16-1;
BCEWithLogits loss.

Optimizer: torch.optim.Adagrad(lr=LR) for the dense parameters (element-wise,
as torch); the tables run ROW-WISE AdaGrad (one accumulator per row, as DLRM
and the hub). Tables start at the hub's random init (table_init_, seeds
TABLE_SEED + i * 2**40, uniform in [-INIT_SCALE, INIT_SCALE)).

reference_step() does what W ranks and the hub do, in one process: each
rank's shard gradient (shard mean), the dense gradients summed in rank order
times 1/W, torch's Adagrad; each table's sparse rows summed per rank in
order, then over ranks in rank order, times 1/W, row-wise AdaGrad in fp32 in
the hub's order of operations (so the runs can agree bit for bit).
"""
import numpy as np
import torch

SEED = 0
TABLES = [("user", 20000), ("item", 8000), ("category", 1000), ("tags", 2000)]
BAG = 3              # tags per sample (the EmbeddingBag table, last)
DENSE = 4
DIM = 8
ZIPF = 1.05
N_TRAIN, N_TEST = 131072, 16384
BATCH = 512          # global batch; each of W ranks trains on BATCH / W of it
EPOCHS = 4
LR = 0.005
INIT_SCALE = 0.05
TABLE_SEED = 11
SEED_STRIDE = 2 ** 40  # = rackhub.torch.embedding.SEED_STRIDE


def _zipf_ids(rng, rows, n):
    p = 1.0 / np.arange(1, rows + 1) ** ZIPF
    perm = rng.permutation(rows)
    return perm[rng.choice(rows, size=n, p=p / p.sum())]


def make_data():
    """{"train": (dense, cats, tags, y), "test": (...), "true_logit_test": ...}:
    dense float32 N x 4, cats int64 N x 3, tags int64 N x BAG, y float32 N."""
    rng = np.random.default_rng(SEED + 1)
    n = N_TRAIN + N_TEST
    dense = rng.standard_normal((n, DENSE)).astype(np.float32)
    ids = [_zipf_ids(rng, rows, n * (BAG if name == "tags" else 1)) for name, rows in TABLES]
    cats = np.stack(ids[:3], axis=1).astype(np.int64)
    tags = ids[3].reshape(n, BAG).astype(np.int64)
    w = np.array([0.6, -0.4, 0.3, 0.0])
    effect = [rng.normal(0, 0.6, rows) for _, rows in TABLES]
    U = rng.normal(0, 0.6, (TABLES[0][1], 4))
    V = rng.normal(0, 0.6, (TABLES[1][1], 4))
    logit = (-0.5 + dense @ w + effect[0][cats[:, 0]] + effect[1][cats[:, 1]]
             + effect[2][cats[:, 2]] + effect[3][tags].mean(axis=1)
             + (U[cats[:, 0]] * V[cats[:, 1]]).sum(axis=1))
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)

    def part(a, b):
        return tuple(torch.from_numpy(np.ascontiguousarray(v[a:b])) for v in (dense, cats, tags, y))

    return {"train": part(0, N_TRAIN), "test": part(N_TRAIN, n),
            "true_logit_test": logit[N_TRAIN:]}


def epoch_order(epoch):
    """The global order of the training samples in `epoch` (every process)."""
    g = torch.Generator().manual_seed(SEED * 1000 + epoch)
    return torch.randperm(N_TRAIN, generator=g)


def shard(batch_idx, rank, world):
    """Rank `rank`'s part of a global batch of sample indices."""
    per = len(batch_idx) // world
    return batch_idx[rank * per:(rank + 1) * per]


class DLRM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        nn = torch.nn
        torch.manual_seed(SEED)
        self.emb = nn.ModuleList([nn.Embedding(rows, DIM, sparse=True)
                                  for _, rows in TABLES[:3]])
        self.bag = nn.EmbeddingBag(TABLES[3][1], DIM, mode="sum", sparse=True)
        self.bottom = nn.Sequential(nn.Linear(DENSE, 16), nn.ReLU(), nn.Linear(16, DIM),
                                    nn.ReLU())
        n = 1 + len(TABLES)
        self.pairs = torch.tril_indices(n, n, offset=-1)
        self.top = nn.Sequential(nn.Linear(DIM + self.pairs.shape[1], 16), nn.ReLU(),
                                 nn.Linear(16, 1))

    def tables(self):
        """The table modules, in TABLES order (their i gives the init seed)."""
        return list(self.emb) + [self.bag]

    def forward(self, dense, cats, tags):
        z = self.bottom(dense)
        vecs = [z] + [e(cats[:, i]) for i, e in enumerate(self.emb)] + [self.bag(tags)]
        t = torch.stack(vecs, dim=1)                          # B x 5 x DIM
        dots = torch.bmm(t, t.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([z, dots], dim=1)).squeeze(1)


def loss_of(model, batch):
    dense, cats, tags, y = batch
    return torch.nn.functional.binary_cross_entropy_with_logits(model(dense, cats, tags), y)


def take(data, idx):
    return tuple(v[idx] for v in data)


def auc(model, data, chunk=4096):
    """Held-out ROC AUC of `model` (sklearn.metrics.roc_auc_score)."""
    from sklearn.metrics import roc_auc_score
    with torch.no_grad():
        scores = torch.cat([model(*(v[a:a + chunk] for v in data[:3]))
                            for a in range(0, len(data[3]), chunk)])
    return roc_auc_score(data[3].numpy(), scores.numpy())


def bayes_auc(d):
    from sklearn.metrics import roc_auc_score
    return roc_auc_score(d["test"][3].numpy(), d["true_logit_test"])


# -- the hub's row-sparse math, in one process --------------------------------

def rank_order_row_sums(per_rank):
    """per_rank: [(ids int64 n, rows float32 n x dim)] of each rank in rank
    order. Returns (touched sorted ids, float32 sums): duplicates summed in
    the order given within a rank, then the ranks' partial rows in rank order
    (a rank that did not touch a row adds nothing), as the hub does."""
    all_ids = np.concatenate([i for i, _ in per_rank]) if per_rank else np.zeros(0, np.int64)
    touched = np.unique(all_ids)
    dim = per_rank[0][1].shape[1]
    total = np.zeros((len(touched), dim), np.float32)
    seen = np.zeros(len(touched), bool)
    for ids, rows in per_rank:
        if len(ids) == 0:
            continue
        idx = np.searchsorted(touched, ids)
        part = np.zeros((len(touched), dim), np.float32)
        np.add.at(part, idx, rows.astype(np.float32))
        mine = np.zeros(len(touched), bool)
        mine[idx] = True
        both = mine & seen
        total[both] = total[both] + part[both]
        only = mine & ~seen
        total[only] = part[only]
        seen |= mine
    return touched, total


def rowwise_adagrad_(weight, state, touched, sums, lr, eps, grad_scale):
    """The hub's row-wise AdaGrad on rows `touched` (weight: float32 numpy
    rows x dim, state: float32 numpy rows), fp32, its order of operations:
    d = sum * gs; s += (d*d summed left to right) / dim; p -= lr * d / (sqrt(s) + eps)."""
    f = np.float32
    d = sums * f(grad_scale)
    squares = np.cumsum(d * d, axis=1, dtype=np.float32)[:, -1]
    s = state[touched] + squares / f(weight.shape[1])
    state[touched] = s
    denom = np.sqrt(s) + f(eps)
    weight[touched] = weight[touched] - (f(lr) * d) / denom[:, None]


def sparse_rows(grad):
    """(ids, rows) of a sparse gradient as pushed (uncoalesced, in order)."""
    if grad is None:
        return np.zeros(0, np.int64), np.zeros((0, DIM), np.float32)
    return grad._indices()[0].numpy().copy(), grad._values().detach().numpy().copy()


class Reference:
    """The single-process run that W ranks through rackhub mirror."""

    def __init__(self, world, table_init):
        torch.set_num_threads(1)
        self.world = world
        self.model = DLRM()
        for i, m in enumerate(self.model.tables()):
            table_init(m.weight, TABLE_SEED + i * SEED_STRIDE, INIT_SCALE)
        tables = {id(m.weight) for m in self.model.tables()}
        self.dense = [p for p in self.model.parameters() if id(p) not in tables]
        self.opt = torch.optim.Adagrad(self.dense, lr=LR)
        self.state = [np.zeros(m.weight.shape[0], np.float32) for m in self.model.tables()]
        self.scale = torch.tensor(1.0 / world, dtype=torch.float32)

    def step(self, train, batch_idx):
        """One global batch; returns the mean of the ranks' shard losses."""
        dense_grads, table_grads, losses = [], [], []
        for r in range(self.world):
            self.model.zero_grad(set_to_none=True)
            loss = loss_of(self.model, take(train, shard(batch_idx, r, self.world)))
            loss.backward()
            losses.append(loss.item())
            dense_grads.append([p.grad.clone() for p in self.dense])
            table_grads.append([sparse_rows(m.weight.grad) for m in self.model.tables()])
        for i, p in enumerate(self.dense):
            s = dense_grads[0][i].clone()
            for r in range(1, self.world):
                s += dense_grads[r][i]
            p.grad = s * self.scale
        for i, m in enumerate(self.model.tables()):
            m.weight.grad = None
            touched, sums = rank_order_row_sums([table_grads[r][i] for r in range(self.world)])
            rowwise_adagrad_(m.weight.data.numpy(), self.state[i], touched, sums, LR,
                             self.opt.defaults["eps"], 1.0 / self.world)
        self.opt.step()
        return sum(losses) / len(losses)
