"""PyTorch Geometric node classification: GCN, GAT and GraphSAGE on a generated SBM graph.

The graph is a stochastic block model (``torch_geometric.utils.stochastic_blockmodel_graph``,
generated locally): 4 blocks of 60 nodes, p_in 0.1, p_out 0.01. A node's label is its block
and its 16-d features are its block's mean vector under heavy noise, so features alone are
weak and neighbourhood averaging (what the convolutions do) helps. Transductive, as in the
PyG examples: one forward over the whole graph, the loss on a random mini-batch of training
nodes (half of them are training nodes). The deep variant is 16 convolutions with no
normalization and no residuals: the classic over-smoothing / vanishing stack.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.ecosystem.training import Build, EcoArch, Task

BLOCKS, BLOCK_SIZE, FEATURES, HIDDEN, DEEP_LAYERS = 4, 60, 16, 32, 16


class SBMGraph:
    """The seeded SBM graph: features ``x``, ``edge_index``, labels ``y``, training nodes."""

    def __init__(self, seed: int) -> None:
        from torch_geometric.utils import stochastic_blockmodel_graph

        g = torch.Generator().manual_seed(9_000 + seed)
        probs = torch.full((BLOCKS, BLOCKS), 0.01).fill_diagonal_(0.1)
        # PyG draws from the global RNG: seed it from ours and restore it afterwards
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(9_100 + seed)
            self.edge_index = stochastic_blockmodel_graph([BLOCK_SIZE] * BLOCKS, probs)
        self.y = torch.arange(BLOCKS).repeat_interleave(BLOCK_SIZE)
        means = torch.randn(BLOCKS, FEATURES, generator=g)
        self.x = means[self.y] * 0.5 + torch.randn(len(self.y), FEATURES, generator=g)
        self.train = torch.randperm(len(self.y), generator=g)[: len(self.y) // 2]
        self.gen = torch.Generator().manual_seed(9_200 + seed)

    def batch(self, n: int) -> dict:
        """Whole-graph inputs plus ``n`` random training nodes and their labels."""
        nodes = self.train[torch.randperm(len(self.train), generator=self.gen)[:n]]
        return {"x": self.x.clone(), "edge_index": self.edge_index, "nodes": nodes,
                "y": self.y[nodes]}


class GNN(nn.Module):
    """A stack of PyG convolutions with ReLU and dropout between them, as in PyG's examples."""

    def __init__(self, convs: list[nn.Module], dropout: float = 0.5) -> None:
        super().__init__()
        self.convs = nn.ModuleList(convs)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.dropout(F.relu(x), p=self.dropout, training=self.training)
        return x


def _dims(b: Build) -> list[int]:
    n = DEEP_LAYERS if b.deep else 2
    return [FEATURES] + [HIDDEN] * (n - 1) + [BLOCKS]


def _task(model: GNN, seed: int, lr: float) -> Task:
    graph = SBMGraph(seed)

    def loss(bt):
        out = model(bt["x"], bt["edge_index"])
        return F.cross_entropy(out[bt["nodes"]], bt["y"])

    return Task(model=model, batch=graph.batch, loss=loss, lr=lr, batch_size=len(graph.train),
                float_input="x", label_key="y")


def build_gcn(b: Build) -> Task:
    """Two-layer GCN (Kipf & Welling), hidden 32."""
    from torch_geometric.nn import GCNConv

    d = _dims(b)
    return _task(GNN([GCNConv(i, o) for i, o in zip(d[:-1], d[1:])]), b.seed, lr=1e-2)


def build_gat(b: Build) -> Task:
    """Two-layer GAT: 4 heads of 8 concatenated, then one output head."""
    from torch_geometric.nn import GATConv

    d = _dims(b)
    convs = [GATConv(i, o // 4, heads=4) for i, o in zip(d[:-2], d[1:-1])]
    convs.append(GATConv(d[-2], d[-1], heads=1))
    return _task(GNN(convs, dropout=0.6), b.seed, lr=5e-3)


def build_sage(b: Build) -> Task:
    """Two-layer GraphSAGE (mean aggregation), hidden 32."""
    from torch_geometric.nn import SAGEConv

    d = _dims(b)
    return _task(GNN([SAGEConv(i, o) for i, o in zip(d[:-1], d[1:])]), b.seed, lr=1e-2)


ARCHS = [
    EcoArch("pyg_gcn", "gnn", "torch_geometric", build_gcn,
            "GCNConv x2, 4-block SBM node classification (240 nodes, 16-d noisy features)",
            input_layer="convs.0.lin", init_layer="convs.0.lin", deep_layer="convs.0.lin"),
    EcoArch("pyg_gat", "gnn", "torch_geometric", build_gat,
            "GATConv (4 heads) x2, the same SBM node classification",
            input_layer="convs.0.lin", init_layer="convs.0.lin", deep_layer="convs.0.lin"),
    EcoArch("pyg_sage", "gnn", "torch_geometric", build_sage,
            "SAGEConv (mean) x2, the same SBM node classification",
            # mean aggregation runs before lin_l: the aggregator is the first to see x
            input_layer="convs.0.aggr_module", init_layer="convs.0.lin_l",
            deep_layer="convs.0.aggr_module"),
]
