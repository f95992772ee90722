"""Plain PyTorch, written the way its users write it: an MLP, ``nn.TransformerEncoder``, ``nn.LSTM``.

The tabular classifier is the MLP of a tabular tutorial (``Linear -> ReLU -> Dropout`` twice,
a linear head) on z-scored numeric columns. The encoder classifier is the tutorial shape:
token + learned position embeddings, a stack of ``nn.TransformerEncoderLayer`` (post-norm,
dropout 0.1, batch_first), mean pooling and a linear head. Its forward also takes
``inputs_embeds``, like the HF models, so input faults can enter after the embedding. The LSTM
forecasts the next value of a noisy two-tone sine. Deep variants: 16 encoder layers with both
LayerNorms removed; a 12-layer stacked LSTM; none for the tabular MLP (no normalization to
remove).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.ecosystem import cpu, data
from benchmarks.ecosystem.training import Build, EcoArch, Task, strip_norms

VOCAB, SEQ, D_MODEL = 64, 24, 32
#: the deep post-norm encoder: 12 blocks of d=64 at a peak rate that needs its warm-up
DEEP_POSTNORM_LAYERS, DEEP_POSTNORM_D, DEEP_POSTNORM_LR = 12, 64, 3e-3


class EncoderClassifier(nn.Module):
    """Embeddings -> ``nn.TransformerEncoder`` -> mean pool -> linear head."""

    def __init__(self, layers: int, n_classes: int = 4, d_model: int = D_MODEL) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Embedding(SEQ, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=2 * d_model,
                                           dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, input_ids=None, inputs_embeds=None):
        h = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        h = h + self.pos(torch.arange(h.shape[1], device=h.device))
        return self.head(self.encoder(h).mean(dim=1))


class Forecaster(nn.Module):
    """``nn.LSTM`` over the sequence, a linear read-out per time step."""

    def __init__(self, layers: int, hidden: int = 32) -> None:
        super().__init__()
        self.lstm = nn.LSTM(1, hidden, num_layers=layers, batch_first=True, dropout=0.1)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        out, _ = cpu.run_lstm(self.lstm, x)  # float32 where this CPU has no bf16 LSTM
        return self.head(out)


def build_encoder(b: Build) -> Task:
    """4-layer ``nn.TransformerEncoder`` keyword classifier."""
    model = EncoderClassifier(16 if b.deep else 4)
    if b.deep:
        strip_norms(model)
    return _keyword_task(model, b.seed, lr=1e-3)


def build_deep_postnorm(b: Build) -> Task:
    """12-block post-norm ``nn.TransformerEncoder`` (d=64) keyword classifier at a peak rate of
    3e-3: it learns with the recipe's warm-up and stalls at chance without it (the
    ``no_warmup`` fault)."""
    model = EncoderClassifier(DEEP_POSTNORM_LAYERS, d_model=DEEP_POSTNORM_D)
    return _keyword_task(model, b.seed, lr=DEEP_POSTNORM_LR)


def _keyword_task(model: EncoderClassifier, seed: int, lr: float) -> Task:
    """Keyword classification with ``model``'s own cross-entropy on its logits."""
    src = data.KeywordTokens(seed, vocab=VOCAB, seq_len=SEQ)

    def batch(n):
        ids, y = src.batch(n)
        return {"input_ids": ids, "labels": y}

    def loss(bt):
        x = {k: v for k, v in bt.items() if k != "labels"}
        return F.cross_entropy(model(**x).float(), bt["labels"])

    return Task(model=model, batch=batch, loss=loss, lr=lr, batch_size=32,
                label_key="labels", token_key="input_ids", vocab=VOCAB, embed=model.embed)


def build_lstm(b: Build) -> Task:
    """2-layer ``nn.LSTM`` next-value forecaster (MSE)."""
    model = Forecaster(12 if b.deep else 2)
    src = data.SineSequences(b.seed, seq_len=32)

    def batch(n):
        x, y = src.batch(n)
        return {"x": x, "y": y}

    def loss(bt):
        return F.mse_loss(model(bt["x"]).float(), bt["y"])

    return Task(model=model, batch=batch, loss=loss, lr=3e-3, batch_size=32,
                float_input="x", float_target="y")


TABULAR_FEATURES = 12


def tabular_model() -> nn.Module:
    """``nn.Sequential`` MLP for tabular rows (hidden 64, dropout 0.1)."""
    return nn.Sequential(nn.Linear(TABULAR_FEATURES, 64), nn.ReLU(), nn.Dropout(0.1),
                         nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 3))


def build_tabular(b: Build) -> Task:
    """3-class MLP on 12 z-scored columns (cross-entropy)."""
    model = tabular_model()
    src = data.TabularRows(b.seed, features=TABULAR_FEATURES)

    def batch(n):
        x, y = src.batch(n)
        return {"x": x, "labels": y}

    def loss(bt):
        return F.cross_entropy(model(bt["x"]).float(), bt["labels"])

    return Task(model=model, batch=batch, loss=loss, lr=3e-3, batch_size=64,
                float_input="x", label_key="labels")


ARCHS = [
    EcoArch("torch_encoder", "transformer", "torch", build_encoder,
            "nn.TransformerEncoder (4 post-norm layers, d=32), 4-class keyword sequences",
            inputs="tokens", target="labels", input_layer="embed", init_layer="embed",
            deep_layer="encoder.layers.0.self_attn"),
    EcoArch("torch_encoder_deep", "transformer", "torch", build_deep_postnorm,
            "nn.TransformerEncoder (12 post-norm layers, d=64, peak lr 3e-3), 4-class keyword sequences",
            steps=200, inputs="tokens", target="labels", input_layer="embed", init_layer="embed",
            # its warm-up twin learns on every seed (loss 0.003-0.3 after 200 steps) through loss
            # spikes at its floor, which loss_pattern reads as confident mistakes, not instability
            injections=("healthy", "no_warmup", "lr_x100", "lr_div1e4")),
    EcoArch("torch_lstm", "rnn", "torch", build_lstm,
            "nn.LSTM (2 layers, hidden 32), next-value forecasting of noisy two-tone sines",
            inputs="float", target="float", input_layer="lstm", init_layer="lstm",
            deep_layer="lstm"),
    EcoArch("torch_tabular", "mlp", "torch", build_tabular,
            "nn.Sequential MLP (2 hidden layers of 64, dropout 0.1), 3-class z-scored tabular rows",
            inputs="float", target="labels", input_layer="0", init_layer="0"),
]
