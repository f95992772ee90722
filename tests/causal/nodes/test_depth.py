"""Post-norm depth (neuraldbg/causal/nodes/depth.py): hand-built layer lists, then hand-built
modules read through a monitor's layer list after one forward."""
from __future__ import annotations

import torch
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.causal.nodes.depth import postnorm_depth
from neuraldbg.trace import LayerInfo


def layers(*specs):
    """LayerInfo in forward order from ``(name, type)`` pairs (every one with parameters)."""
    return tuple(LayerInfo(name=n, type=t, index=i, n_params=1 if t != "Dropout" else 0)
                 for i, (n, t) in enumerate(specs))


def bert_block(i):
    p = f"encoder.layer.{i}"
    return [(f"{p}.attention.self.query", "Linear"), (f"{p}.attention.self.key", "Linear"),
            (f"{p}.attention.self.value", "Linear"), (f"{p}.attention.output.dense", "Linear"),
            (f"{p}.attention.output.LayerNorm", "LayerNorm"), (f"{p}.intermediate.dense", "Linear"),
            (f"{p}.output.dense", "Linear"), (f"{p}.output.LayerNorm", "LayerNorm")]


def gpt2_block(i):
    p = f"h.{i}"
    return [(f"{p}.ln_1", "LayerNorm"), (f"{p}.attn.c_attn", "Conv1D"), (f"{p}.attn.c_proj", "Conv1D"),
            (f"{p}.ln_2", "LayerNorm"), (f"{p}.mlp.c_fc", "Conv1D"), (f"{p}.mlp.c_proj", "Conv1D")]


def test_bert_style_blocks_end_in_their_norm_and_count():
    assert postnorm_depth(layers(("embeddings.word", "Embedding"), *sum((bert_block(i) for i in range(3)), []),
                                 ("classifier", "Linear"))) == 3


def test_pre_norm_blocks_end_in_a_linear_layer_and_count_zero():
    assert postnorm_depth(layers(*sum((gpt2_block(i) for i in range(12)), []), ("ln_f", "LayerNorm"))) == 0


def test_a_block_ending_in_a_norm_without_attention_is_no_post_norm_attention_block():
    # a ResNet basic block: conv, bn, conv, bn (the norm comes before the residual add)
    resnet = [(f"layer1.{i}.{n}", t) for i in range(4) for n, t in (("conv1", "Conv2d"), ("bn1", "BatchNorm2d"),
                                                                      ("conv2", "Conv2d"), ("bn2", "BatchNorm2d"))]
    assert postnorm_depth(layers(*resnet)) == 0


def test_the_longest_stack_counts_and_a_stripped_norm_breaks_the_count():
    enc = sum((bert_block(i) for i in range(4)), [])
    dec = [(n.replace("encoder.", "decoder."), t) for n, t in sum((bert_block(i) for i in range(2)), [])]
    assert postnorm_depth(layers(*enc, *dec)) == 4
    stripped = [(n, t) for n, t in enc if not (n.startswith("encoder.layer.1.") and t == "LayerNorm")]
    assert postnorm_depth(layers(*stripped)) == 3


def test_a_norm_found_by_role_counts_like_a_layer_norm_class():
    specs = layers(("blocks.0.attn.q_proj", "Linear"), ("blocks.0.out", "Linear"), ("blocks.0.norm", "MyNorm"))
    assert postnorm_depth(specs) == 0
    roled = tuple(LayerInfo(li.name, li.type, li.index, li.n_params, "norm" if li.type == "MyNorm" else "")
                  for li in specs)
    assert postnorm_depth(roled) == 1


def monitored_layers(model, *inputs):
    with NeuralDbg(model) as dbg:
        model(*inputs)
    return dbg.layers()


def test_torch_encoder_layers_post_norm_by_default_and_pre_norm_with_norm_first():
    x = torch.randn(2, 5, 16)
    for norm_first, want in ((False, 7), (True, 0)):
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first)
        enc = nn.TransformerEncoder(layer, 7, enable_nested_tensor=False)
        # out_proj sits inside self_attn and is never called: it must not count as the block's last layer
        assert postnorm_depth(monitored_layers(enc, x)) == want


def test_hugging_face_bert_is_post_norm_and_gpt2_pre_norm():
    transformers = __import__("pytest").importorskip("transformers")
    ids = torch.randint(0, 32, (2, 6))
    bert = transformers.BertModel(transformers.BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=3,
                                                          num_attention_heads=2, intermediate_size=32,
                                                          max_position_embeddings=8))
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=3,
                                                          n_head=2))
    assert postnorm_depth(monitored_layers(bert, ids)) == 3
    assert postnorm_depth(monitored_layers(gpt2, ids)) == 0
