"""PEFT LoRA fine-tunes of tiny GPT-2 and BERT.

The base is first "pre-trained" for a few dozen plain AdamW steps on a sibling task (another
seed's Markov chain / keyword sets: same kind of data, other facts), then frozen and wrapped
with ``peft.get_peft_model(model, LoraConfig(...))``; the fine-tune learns this seed's task.
PEFT initializes every ``lora_B`` to zero, so the adapted model starts as the base: the
init faults scale every weight matrix after wrapping and leave those zeros at zero.
Pre-training is setup, outside ``wall_time``. No deep variant: the frozen base is not the
adapter's architecture.
"""
from __future__ import annotations

import torch

from benchmarks.ecosystem import hf
from benchmarks.ecosystem.training import Build, EcoArch

PRETRAIN_STEPS = 40
PRETRAIN_LR = 3e-3
#: Pre-training data comes from another seed's generator: related task, different facts.
SIBLING = 7_919


def pretrain(task, steps: int = PRETRAIN_STEPS) -> None:
    """A short, plain AdamW run of the base on its task (no monitor, no faults)."""
    opt = torch.optim.AdamW(task.model.parameters(), lr=PRETRAIN_LR)
    task.model.train()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        task.loss(task.batch(task.batch_size)).backward()
        opt.step()


def build_lora_gpt2(b: Build):
    """GPT-2 base pre-trained on a sibling chain; LoRA r=8 on attention and MLP."""
    from peft import LoraConfig, get_peft_model

    base = hf.gpt2_model(b)
    pretrain(hf.lm_task(base, b.seed + SIBLING, lr=PRETRAIN_LR))
    cfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, task_type="CAUSAL_LM",
                     target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True)
    model = get_peft_model(base, cfg)
    return hf.lm_task(model, b.seed, lr=3e-3)


def build_lora_bert(b: Build):
    """BERT base pre-trained on sibling keywords; LoRA r=8 on every dense, new classifier."""
    from peft import LoraConfig, get_peft_model

    base = hf.bert_model(b)
    pretrain(hf.cls_task(base, b.seed + SIBLING, lr=PRETRAIN_LR))
    # a fresh head, as when fine-tuning to a new label set; PEFT trains it (modules_to_save)
    base.classifier.reset_parameters()
    cfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, task_type="SEQ_CLS",
                     target_modules=["query", "key", "value", "dense"])
    model = get_peft_model(base, cfg)
    return hf.cls_task(model, b.seed, lr=3e-3)


_P = "base_model.model."
ARCHS = [
    EcoArch("lora_gpt2", "lora", "peft", build_lora_gpt2,
               "PEFT LoRA (r=8) on a briefly pre-trained GPT-2, LM on a new Markov chain",
               inputs="tokens", target="tokens", input_layer=_P + "transformer.wte",
               init_layer=_P + "transformer.wte"),
    EcoArch("lora_bert", "lora", "peft", build_lora_bert,
               "PEFT LoRA (r=8) on a briefly pre-trained BERT, new 4-class keyword task",
               inputs="tokens", target="labels", input_layer=_P + "bert.embeddings.word_embeddings",
               init_layer=_P + "bert.embeddings.word_embeddings"),
]
