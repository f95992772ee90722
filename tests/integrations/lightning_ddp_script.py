"""A 2-rank Lightning DDP fit on CPU (gloo) with the NeuralDBG callback, learning rate 1000x
too high. Run as ``python lightning_ddp_script.py OUT_DIR``; Lightning starts rank 1 by running
this script again. Used by tests/integrations/test_lightning_loggers.py, which also trains
:class:`Tiny` on one process."""
from __future__ import annotations

import sys

import lightning.pytorch as L
import torch
from torch.nn import functional as F

from neuraldbg.integrations.lightning import NeuralDbgCallback
from tiny_task import LR, STEPS, batches, log_to_stderr, make_model, optimizer


class Tiny(L.LightningModule):
    """The tiny task's MLP; logs its own loss, as users do."""

    def __init__(self, lr):
        super().__init__()
        self.net = make_model(0)
        self.lr = lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return optimizer(self.parameters(), self.lr)


def main(out: str) -> None:
    log_to_stderr()
    torch.set_num_threads(1)
    trainer = L.Trainer(max_steps=STEPS // 2, strategy="ddp", accelerator="cpu", devices=2,
                        callbacks=[NeuralDbgCallback(export=True)], logger=L.loggers.CSVLogger(out),
                        default_root_dir=out, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(Tiny(LR * 1000), torch.utils.data.DataLoader(batches(STEPS), batch_size=None))


if __name__ == "__main__":
    main(sys.argv[1])
