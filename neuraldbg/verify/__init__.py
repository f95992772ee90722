"""Interventional verification: test each leading hypothesis by replaying a window with the fix.

``NeuralDbg(model, optimizer=opt, snapshots=True)`` keeps bounded checkpoints
(:mod:`.snapshots`); ``dbg.verify(replay, steps=20, top=3)`` (:mod:`.api`) restores one before
each hypothesis' onset, applies that cause's intervention ``do(cause = ok)``
(:mod:`.interventions`), replays the window under a fresh monitor, compares it with the
original (:mod:`.outcome`) and updates the posterior (:mod:`.likelihoods`); the result is a
:class:`~neuraldbg.verify.types.Verification`. ``docs/verification.md`` has the method.

Importing this package loads nothing heavy; its modules import torch where they need it.
"""
