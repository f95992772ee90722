import torch


def pytest_configure(config):
    # CI has 2 cores shared by the suite; one thread keeps timings stable and tests fast
    torch.set_num_threads(1)
