"""gnn / gat: node classification on a stochastic block model, GCN and GAT in plain torch.

The graph: 240 nodes in 4 communities, edges with probability 0.08 inside a community and
0.01 across; node features are a weak community signature plus unit Gaussian noise, so
features alone classify poorly and aggregating over neighbours is what helps. Full-batch
training on 30% labelled nodes, dense normalised adjacency (small graph, readable math).

``gnn`` uses GCN layers (Kipf & Welling 2017): H' = D^-1/2 (A + I) D^-1/2 H W.
``gat`` uses single-head GAT layers (Velickovic et al. 2018): attention over neighbours.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.injections import ONSET_FRAC, Injection, register_general, register_injection
from models.registry import ArchSpec, Trainer, register_arch, scale_weights


@dataclass
class GNNConfig:
    """Hyper-parameters of the GNN reference run (the healthy defaults)."""
    conv: str = "gcn"  # "gcn" or "gat"
    n_nodes: int = 240
    n_classes: int = 4
    n_features: int = 16
    p_in: float = 0.08
    p_out: float = 0.01
    signal: float = 0.6  # strength of the community signature in the features
    train_frac: float = 0.3
    hidden: int = 32
    layers: int = 2
    steps: int = 120
    lr: float = 1e-2
    weight_decay: float = 5e-4
    init_gain: float = 1.0
    # how bad "bad" is
    lr_high: float = 3.0  # 300x
    lr_low: float = 1e-6  # 1e-4x
    init_large: float = 30.0
    unstable: bool = False  # arch_unstable: 16 layers, no residuals (oversmoothing)
    unstable_layers: int = 16


class GCNConv(nn.Module):
    """H' = Â H W with Â the symmetric-normalised adjacency (self-loops included)."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        # x: (N, d_in), adj: (N, N) normalised
        return adj @ self.lin(x)  # (N, d_out)


class GATConv(nn.Module):
    """Single-head graph attention: softmax over neighbours of LeakyReLU(a^T [Wh_i || Wh_j])."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d_in, d_out, bias=False)
        self.att_src = nn.Parameter(torch.empty(d_out))
        self.att_dst = nn.Parameter(torch.empty(d_out))
        self.bias = nn.Parameter(torch.zeros(d_out))
        bound = 1.0 / d_out**0.5
        nn.init.uniform_(self.att_src, -bound, bound)
        nn.init.uniform_(self.att_dst, -bound, bound)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)  # (N, d_out)
        scores = (h @ self.att_dst)[:, None] + (h @ self.att_src)[None, :]  # (N, N): i <- j
        scores = F.leaky_relu(scores, 0.2).masked_fill(adj == 0, float("-inf"))
        return torch.softmax(scores, dim=1) @ h + self.bias  # (N, d_out)


class GNN(nn.Module):
    """``layers`` graph convolutions with ReLU between them; the last one outputs logits."""

    def __init__(self, cfg: GNNConfig) -> None:
        super().__init__()
        n = cfg.unstable_layers if cfg.unstable else cfg.layers
        Conv = {"gcn": GCNConv, "gat": GATConv}[cfg.conv]
        dims = [cfg.n_features] + [cfg.hidden] * (n - 1) + [cfg.n_classes]
        self.convs = nn.ModuleList(Conv(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.acts = nn.ModuleList(nn.ReLU() for _ in range(n - 1))

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        # x: (N, n_features)
        for conv, act in zip(self.convs[:-1], self.acts):
            x = act(conv(x, adj))  # (N, hidden)
        return self.convs[-1](x, adj)  # (N, n_classes)


class SBMGraph:
    """A seeded stochastic block model graph with features, labels and a train mask."""

    def __init__(self, cfg: GNNConfig, seed: int) -> None:
        g = torch.Generator().manual_seed(120_000 + seed)
        N, C = cfg.n_nodes, cfg.n_classes
        self.y = torch.arange(N) % C  # balanced communities
        same = self.y[:, None] == self.y[None, :]
        p = torch.where(same, cfg.p_in, cfg.p_out)
        upper = torch.triu(torch.rand(N, N, generator=g) < p, diagonal=1)
        a = (upper | upper.T).float() + torch.eye(N)  # symmetric, self-loops
        self.adj_raw = a  # 0/1 with self-loops (GAT masks with it)
        d = a.sum(1).rsqrt()
        self.adj_norm = d[:, None] * a * d[None, :]  # D^-1/2 (A + I) D^-1/2
        centers = torch.randn(C, cfg.n_features, generator=g)
        self.x = cfg.signal * centers[self.y] + torch.randn(N, cfg.n_features, generator=g)
        self.train = torch.rand(N, generator=g) < cfg.train_frac

    def batch(self, conv: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Full batch: features, the adjacency the conv uses, labels, train mask."""
        adj = self.adj_norm if conv == "gcn" else self.adj_raw
        return self.x, adj, self.y, self.train


class GNNTrainer(Trainer):
    """Full-batch cross-entropy on the labelled nodes; Adam with weight decay (as in GCN)."""

    def __init__(self, cfg: GNNConfig, seed: int, inj) -> None:
        super().__init__(cfg, seed, inj)
        self.graph = SBMGraph(cfg, seed)
        self.model = GNN(cfg)
        scale_weights(self.model, cfg.init_gain)
        inj.apply_model(self.model, cfg, self)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay
        )

    def forward_backward(self, step: int) -> torch.Tensor:
        x, adj, y, train = self.inj.apply_batch(self.graph.batch(self.cfg.conv), step)
        self.inj.zero_grad(self.optimizer, step)
        loss = self.criterion(self.model(x, adj)[train], y[train])
        loss.backward()
        return loss

    def summary(self) -> dict[str, float]:
        x, adj, y, train = self.graph.batch(self.cfg.conv)
        with torch.no_grad():
            pred = self.model(x, adj).argmax(1)
        return {"test_accuracy": float((pred[~train] == y[~train]).float().mean())}


@dataclass
class GATConfig(GNNConfig):
    """Hyper-parameters of the GAT reference run (the healthy defaults)."""
    conv: str = "gat"


for _name, _config in (("gnn", GNNConfig), ("gat", GATConfig)):
    register_arch(ArchSpec(
        name=_name, family="gnn", trainer=GNNTrainer, config=_config,
        task=f"{_config.conv.upper()} node classification on a 4-community stochastic block model",
        input_layer="convs.0.lin", unstable_layer="convs.0.lin", labels_at=2,
        notes="arch_unstable: 16 layers without residuals (oversmoothing, vanishing)",
    ))
    # init_too_small is left out: Adam rescales the tiny gradients and both train anyway.
    register_general(_name, ("healthy", "lr_too_high", "lr_too_low", "init_too_large",
                             "data_nan", "data_inf", "arch_unstable", "labels_shuffled"))


def _offset_features(batch: tuple, step: int, inj: Injection) -> tuple:
    """From the onset on, every feature is offset by +10 (a calibration drift upstream)."""
    return (batch[0] + 10.0, *batch[1:])


register_injection(Injection(
    name="data_shift", archs=("gnn", "gat"), truth=("data", "shifted"), symptom="jump",
    onset_frac=ONSET_FRAC, layer_of="convs.0.lin",
    description="from the onset on, node features arrive offset by +10 (ten noise standard "
                "deviations; a pure x1000 rescale leaves a well-fit ReLU GCN's argmax intact)",
    why="the features' distribution moves mid-run; graph, model and optimizer are untouched",
    batch=_offset_features,
))
