"""The shipped prior files, one ``<family>.json`` per architecture family (data only).

They are read by :mod:`neuraldbg.causal.priors` and written by ``neuraldbg tune-priors``
(:mod:`neuraldbg.fit`); ``docs/priors.md`` documents their schema and provenance.
"""
