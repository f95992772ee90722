"""``diffusers``: a tiny ``UNet2DModel`` trained as DDPM (epsilon prediction, MSE).

The training step of the diffusers examples: draw clean images, noise and timesteps, let
``DDPMScheduler.add_noise`` make the noisy input, and regress the noise. The batch carries
the noise twice, as model-input ingredient (``noise``) and as regression target
(``target``), so a fault can hit the target alone. The deep variant stacks 4 resnet layers
per block and removes every GroupNorm.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.ecosystem import data
from benchmarks.ecosystem.training import Build, EcoArch, Task, strip_norms

SIZE, TIMESTEPS = 8, 1000


def _scheduler(opt, warmup: int, total: int):
    from diffusers.optimization import get_cosine_schedule_with_warmup

    return get_cosine_schedule_with_warmup(opt, num_warmup_steps=warmup, num_training_steps=total)


def build_unet(b: Build) -> Task:
    """UNet2DModel (8x8, channels 16/32, no attention) + DDPMScheduler, eps-MSE on blobs."""
    from diffusers import DDPMScheduler, UNet2DModel

    model = UNet2DModel(
        sample_size=SIZE, in_channels=1, out_channels=1,
        block_out_channels=(16, 32), layers_per_block=4 if b.deep else 1, norm_num_groups=8,
        down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
    )
    if b.deep and strip_norms(model) == 0:
        raise RuntimeError("UNet2DModel: no GroupNorm found to remove")
    noise_sched = DDPMScheduler(num_train_timesteps=TIMESTEPS)
    src = data.BlobImages(b.seed, size=SIZE)
    gen = torch.Generator().manual_seed(7_500 + b.seed)

    def batch(n):
        clean = src.batch(n)
        noise = torch.randn(clean.shape, generator=gen)
        t = torch.randint(0, TIMESTEPS, (n,), generator=gen)
        return {"clean": clean, "noise": noise, "target": noise.clone(), "t": t}

    def loss(bt):
        noisy = noise_sched.add_noise(bt["clean"], bt["noise"], bt["t"])
        pred = model(noisy, bt["t"]).sample
        return F.mse_loss(pred.float(), bt["target"])

    return Task(model=model, batch=batch, loss=loss, lr=2e-3, batch_size=16,
                float_input="clean", float_target="target", scheduler=_scheduler)


ARCHS = [
    EcoArch("diffusers_unet", "diffusion", "diffusers", build_unet,
            "UNet2DModel 8x8 + DDPMScheduler, epsilon-prediction MSE on Gaussian-blob images",
            inputs="float", target="float", input_layer="conv_in", init_layer="conv_in",
            deep_layer="conv_in"),
]
