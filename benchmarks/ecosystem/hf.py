"""Hugging Face ``transformers`` models, built from tiny configs with random init.

Nothing is fetched from the hub: every model comes from ``XxxConfig(...)`` and every batch
from :mod:`benchmarks.ecosystem.data`. The loss is the model's own (``labels=`` given), as in
a ``Trainer``-free fine-tuning script. ``deep`` builds 16 blocks and removes every
LayerNorm/RMSNorm (``nn.Identity``) through the module API: the architecture fault.
"""
from __future__ import annotations

from benchmarks.ecosystem import data
from benchmarks.ecosystem.training import Build, EcoArch, Task, strip_norms

HIDDEN, LAYERS, HEADS, DEEP_LAYERS = 64, 2, 4, 16
#: the configs' ``initializer_range`` default (the libraries' convention)
INIT_RANGE = 0.02
VOCAB, SEQ = 64, 32


def _hf_scheduler(opt, warmup: int, total: int):
    from transformers import get_cosine_schedule_with_warmup

    return get_cosine_schedule_with_warmup(opt, warmup, total)


def _layers(b: Build) -> int:
    return DEEP_LAYERS if b.deep else LAYERS


def _finish(model, b: Build):
    # strip after construction: the configs have no "no norm" switch, people edit modules
    if b.deep and strip_norms(model) == 0:
        raise RuntimeError(f"{type(model).__name__}: no normalization layer found to remove")
    return model


def lm_task(model, seed: int, lr: float, batch_size: int = 16) -> Task:
    """Next-token LM on a Markov chain; ``labels=input_ids`` (the model shifts them)."""
    src = data.MarkovTokens(seed, vocab=VOCAB, seq_len=SEQ)

    def batch(n):
        ids = src.batch(n)
        return {"input_ids": ids, "labels": ids.clone()}

    return Task(model=model, batch=batch, loss=lambda bt: model(**bt).loss, lr=lr,
                batch_size=batch_size, label_key="labels", token_key="input_ids",
                token_labels=True, vocab=VOCAB, embed=model.get_input_embeddings(),
                scheduler=_hf_scheduler)


def cls_task(model, seed: int, lr: float, batch_size: int = 32) -> Task:
    """Keyword sequence classification; the model's cross-entropy on ``labels``."""
    src = data.KeywordTokens(seed, vocab=VOCAB, seq_len=24)

    def batch(n):
        ids, y = src.batch(n)
        return {"input_ids": ids, "labels": y}

    return Task(model=model, batch=batch, loss=lambda bt: model(**bt).loss, lr=lr,
                batch_size=batch_size, label_key="labels", token_key="input_ids",
                vocab=VOCAB, embed=model.get_input_embeddings(), scheduler=_hf_scheduler)


def gpt2_model(b: Build):
    """A tiny ``GPT2LMHeadModel`` (dropout 0.1 as the config defaults)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=HIDDEN, n_layer=_layers(b),
                     n_head=HEADS, bos_token_id=0, eos_token_id=0)
    return _finish(GPT2LMHeadModel(cfg), b)


def bert_model(b: Build):
    """A tiny ``BertForSequenceClassification`` with 4 labels."""
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=_layers(b),
                     num_attention_heads=HEADS, intermediate_size=2 * HIDDEN,
                     max_position_embeddings=SEQ, num_labels=4, pad_token_id=0,
                     initializer_range=INIT_RANGE * b.init_range)
    return _finish(BertForSequenceClassification(cfg), b)


def build_gpt2(b: Build) -> Task:
    """GPT-2 LM on the Markov chain."""
    return lm_task(gpt2_model(b), b.seed, lr=3e-3)


def build_bert(b: Build) -> Task:
    """BERT keyword classification."""
    return cls_task(bert_model(b), b.seed, lr=1e-3)


def build_llama(b: Build) -> Task:
    """A tiny Llama-style decoder (RMSNorm, RoPE, SwiGLU, grouped KV heads) as an LM."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                      num_hidden_layers=_layers(b), num_attention_heads=HEADS,
                      num_key_value_heads=2, max_position_embeddings=SEQ,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return lm_task(_finish(LlamaForCausalLM(cfg), b), b.seed, lr=3e-3)


def build_t5(b: Build) -> Task:
    """A tiny ``T5ForConditionalGeneration`` (T5LayerNorm, relative position buckets, its own
    init: std ``d_model ** -0.5`` and ``(d_model d_kv) ** -0.5``): the encoder reads the first
    half of a Markov-chain sequence, the decoder writes the second half (the model shifts
    ``labels`` right itself)."""
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=VOCAB, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=2 * HIDDEN,
                   num_layers=_layers(b), num_decoder_layers=_layers(b), num_heads=HEADS,
                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = _finish(T5ForConditionalGeneration(cfg), b)
    src = data.MarkovTokens(b.seed, vocab=VOCAB, seq_len=SEQ)
    half = SEQ // 2

    def batch(n):
        ids = src.batch(n)
        return {"input_ids": ids[:, :half].contiguous(), "labels": ids[:, half:].contiguous()}

    return Task(model=model, batch=batch, loss=lambda bt: model(**bt).loss, lr=3e-3,
                batch_size=16, label_key="labels", token_key="input_ids", token_labels=True,
                vocab=VOCAB, embed=model.get_input_embeddings(), scheduler=_hf_scheduler)


def build_vit(b: Build) -> Task:
    """ViT on 16x16 template images (patch 4: 16 patches + [CLS])."""
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=HIDDEN,
                    num_hidden_layers=_layers(b), num_attention_heads=HEADS,
                    intermediate_size=2 * HIDDEN, num_labels=4, initializer_range=INIT_RANGE * b.init_range)
    model = _finish(ViTForImageClassification(cfg), b)
    src = data.TemplateImages(b.seed, size=16)

    def batch(n):
        x, y = src.batch(n)
        return {"pixel_values": x, "labels": y}

    return Task(model=model, batch=batch, loss=lambda bt: model(**bt).loss, lr=1e-3,
                batch_size=32, float_input="pixel_values", label_key="labels",
                scheduler=_hf_scheduler)


ARCHS = [
    EcoArch("hf_gpt2", "transformer", "transformers", build_gpt2,
            "GPT2LMHeadModel, next-token LM on a sparse Markov chain (vocab 64, len 32)",
            inputs="tokens", target="tokens", input_layer="transformer.wte",
            init_layer="transformer.wte", deep_layer="transformer.h.0.attn.c_attn"),
    EcoArch("hf_bert", "transformer", "transformers", build_bert,
            "BertForSequenceClassification, 4-class keyword sequences (len 24)",
            inputs="tokens", target="labels", input_layer="bert.embeddings.word_embeddings",
            init_layer="bert.embeddings.word_embeddings",
            deep_layer="bert.encoder.layer.0.attention.self.query"),
    EcoArch("hf_vit", "transformer", "transformers", build_vit,
            "ViTForImageClassification, 4-class noisy templates (3x16x16, patch 4)",
            inputs="float", target="labels",
            input_layer="vit.embeddings.patch_embeddings.projection",
            init_layer="vit.embeddings.patch_embeddings.projection",
            deep_layer="vit.layers.0.attention.q_proj"),
    EcoArch("hf_t5", "transformer", "transformers", build_t5,
            "T5ForConditionalGeneration (T5LayerNorm), the second half of a Markov-chain sequence "
            "from its first",
            inputs="tokens", target="tokens", input_layer="shared", init_layer="shared",
            deep_layer="encoder.block.0.layer.0.SelfAttention.q"),
    EcoArch("hf_llama", "transformer", "transformers", build_llama,
            "LlamaForCausalLM (RMSNorm, RoPE, GQA), next-token LM on a Markov chain",
            inputs="tokens", target="tokens", input_layer="model.embed_tokens",
            init_layer="model.embed_tokens", deep_layer="model.layers.0.self_attn.q_proj"),
]
