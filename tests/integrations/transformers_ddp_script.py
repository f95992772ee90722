"""A 2-process Hugging Face ``Trainer`` run on CPU (gloo) with the NeuralDBG callback, learning
rate 1000x too high. Run under ``torchrun --nproc_per_node 2 transformers_ddp_script.py
OUT_DIR``. Used by tests/integrations/test_transformers_logging.py."""
from __future__ import annotations

import sys

import torch
import transformers

from neuraldbg.integrations.transformers import NeuralDbgCallback
from test_transformers_callback import Tiny, samples
from tiny_task import LR, STEPS, log_to_stderr, optimizer


def main(out: str) -> None:
    log_to_stderr()
    torch.set_num_threads(1)
    model = Tiny()
    opt = optimizer(model.parameters(), LR * 1000)
    args = transformers.TrainingArguments(output_dir=out, max_steps=STEPS // 2, per_device_train_batch_size=32,
                                          use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
                                          disable_tqdm=True, seed=0, ddp_backend="gloo")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=samples(STEPS),
                                   optimizers=(opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)),
                                   callbacks=[NeuralDbgCallback(export=True)])
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1])
