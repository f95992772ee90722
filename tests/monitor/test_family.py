"""Family detection from module types."""
import pytest
import torch
from torch import nn

from neuraldbg.monitor.family import detect_family
from neuraldbg.vocab import FAMILIES


class LoRALinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Linear(8, 8)
        self.lora_A = nn.Parameter(torch.zeros(2, 8))
        self.lora_B = nn.Parameter(torch.zeros(8, 2))


class GCNConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3)
        self.attn = nn.MultiheadAttention(8, 2)


class Gan(nn.Module):
    def __init__(self):
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
        self.discriminator = nn.Sequential(nn.Conv1d(1, 2, 3), nn.Sigmoid())


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)


@pytest.mark.parametrize("model,family", [
    (nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), "mlp"),
    (nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2)), "cnn"),
    (nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32), 2, enable_nested_tensor=False), "transformer"),
    (nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 10)), "transformer"),
    (nn.LSTM(4, 8), "rnn"),
    (nn.ModuleList([nn.Embedding(10, 8), nn.GRU(8, 8)]), "rnn"),
    (LoRALinear(), "lora"),
    (GCNConv(), "gnn"),
    (UNet(), "diffusion"),
    (Gan(), "gan"),
    (ActorCritic(), "rl"),
])
def test_detect_family(model, family):
    assert detect_family(model) == family
    assert family in FAMILIES


def test_wrappers_are_looked_through():
    inner = nn.Sequential(nn.Conv1d(1, 1, 3))
    assert detect_family(nn.DataParallel(inner)) == "cnn"


def test_non_module_is_rejected():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        detect_family("resnet")


def test_detect_family_does_not_import_pgmpy():
    import subprocess
    import sys

    code = ("import torch, neuraldbg.monitor.family as p; p.detect_family(torch.nn.Linear(2, 2)); "
            "import sys; print(any(m.startswith('pgmpy') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=__file__.rsplit("/tests/", 1)[0])
    assert out.stdout.strip() == "False"
