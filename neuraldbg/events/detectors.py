"""Imports the built-in detectors so that they register themselves."""
from neuraldbg.events import activation, data, gradient, loss  # noqa: F401
