"""Exact inference by enumeration over the hidden joint, compiled to numpy tables.

The hidden variables are the six roots (3*3*3*2*5*2 = 540 states) and the three latent
mechanisms (3*3*3); together they have 14 580 joint states. For each evidence variable we keep a
log-table ``L_e[h, s] = log P(e = s | parents(h))``, plus one column of zeros for
"unobserved", so a query is a sum of gathered rows, one ``exp`` and a sum over the latents
(:meth:`CompiledNetwork.sum_latents`, a reshape): a fraction of a millisecond, and vectorized
over many cases at once. Unobserved evidence uses the
zero column, i.e. it is marginalized exactly (its CPD column sums to 1), never read as absent.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np

from neuraldbg.causal.cpd import Cpd
from neuraldbg.causal.structure import Network

#: the ``exclude`` entry that rules out every root ok: a run that cannot be healthy (api.impossible)
HEALTHY_KEY = ("healthy", "yes")


class ImpossibleEvidence(ValueError):
    """The evidence has probability zero under every hidden state (only with fitted zeros)."""


#: cases per pass of :meth:`CompiledNetwork.posterior_batch` (a few MB of hidden-state tables)
BATCH_CHUNK = 64


class CompiledNetwork:
    """A network's CPDs as enumeration tables. Immutable after construction."""

    def __init__(self, cpds: Mapping[str, Cpd], network: Network, temperature: float = 1.0, source: str = "") -> None:
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        self.network = network
        self.temperature = float(temperature)
        self.source = source
        roots, latents, evidence = network.root_names, network.latent_names, network.evidence_names
        self.hidden = roots + latents
        self.states = {v: network.states_of(v) for v in self.hidden + evidence}
        cards = [len(self.states[v]) for v in self.hidden]
        grid = np.indices(cards).reshape(len(cards), -1)
        self.n_hidden = grid.shape[1]
        self.index = {v: grid[i] for i, v in enumerate(self.hidden)}

        def column(cpd: Cpd) -> np.ndarray:  # P(var | parents) for every hidden state: (card, H)
            return cpd.values[(slice(None),) + tuple(self.index[p] for p in cpd.parents)]

        with np.errstate(divide="ignore"):
            root_prior = np.zeros(self.n_hidden)
            for v in roots:
                root_prior += np.log(cpds[v].values[self.index[v]])
            latent = np.zeros(self.n_hidden)
            for v in latents:
                latent += np.log(column(cpds[v])[self.index[v], np.arange(self.n_hidden)])
            self.log_prior = root_prior + latent
            # (H, card + 1): the extra zero column stands for "unobserved"
            self.log_tables = [
                np.concatenate([np.log(column(cpds[e]).T), np.zeros((self.n_hidden, 1))], axis=1)
                for e in evidence
            ]
        # row-major copies for batches: one gather of whole rows per evidence variable
        self._tables_by_state = [np.ascontiguousarray(t.T) for t in self.log_tables]
        self._onehot = {v: np.eye(len(self.states[v]))[self.index[v]] for v in roots}  # (H, card)
        self.evidence_pos = {e: i for i, e in enumerate(evidence)}
        self.state_pos = {v: {s: i for i, s in enumerate(self.states[v])} for v in self.states}
        # the root joint states (540) and the all-ok mask
        root_cards = [len(self.states[v]) for v in roots]
        self.n_root_joint = int(np.prod(root_cards))
        # sum_latents is a reshape: it needs the hidden states roots-major, latents fastest,
        # which np.indices in C order gives
        root_joint = np.ravel_multi_index([self.index[v] for v in roots], root_cards)
        if not np.array_equal(root_joint, np.arange(self.n_hidden) // (self.n_hidden // self.n_root_joint)):
            raise RuntimeError("hidden states are not ordered roots-major")
        self.healthy_mask = np.all([self.index[v] == 0 for v in roots], axis=0)
        # P(e = s | root joint), latents summed out: for attributing evidence to hypotheses
        w = np.exp(latent)
        self.root_likelihood = {}
        for e, table in zip(evidence, self.log_tables):
            p = np.exp(table[:, :-1]) * w[:, None]
            self.root_likelihood[e] = self.sum_latents(p)
        self.root_cards = root_cards
        self.root_cards_by_name = dict(zip(roots, root_cards))
        self._root_names = roots

    # ---- encoding ----------------------------------------------------------------------
    def _check(self, name: str, state: str) -> int:
        if name not in self.evidence_pos:
            raise ValueError(f"unknown evidence variable {name!r}; valid: {', '.join(self.evidence_pos)}")
        pos = self.state_pos[name].get(state)
        if pos is None:
            raise ValueError(f"unknown state {state!r} of {name}; valid: {', '.join(self.states[name])}")
        return pos

    def encode(self, evidence: Mapping[str, str]) -> np.ndarray:
        """Evidence dict (single states) -> state-index vector, ``-1`` = unobserved."""
        vec = np.full(len(self.evidence_pos), -1, dtype=np.intp)
        for name, state in evidence.items():
            if not isinstance(state, str):
                raise ValueError(f"encode() takes single states; {name} = {state!r} is a set "
                                 "(use posterior() for partial observations)")
            vec[self.evidence_pos[name]] = self._check(name, state)
        return vec

    def root_joint_index(self, assignment: Mapping[str, str]) -> int:
        """Index (0..539) of a full root assignment; missing roots default to ``ok``."""
        idx = [self.state_pos[v][assignment.get(v, "ok")] for v in self._root_names]
        return int(np.ravel_multi_index(idx, self.root_cards))

    # ---- inference ---------------------------------------------------------------------
    def log_joint(self, codes: np.ndarray) -> np.ndarray:
        """Unnormalized log P(hidden, evidence) for a batch of encoded cases: (N, H)."""
        codes = np.atleast_2d(codes)
        ll = np.zeros((codes.shape[0], self.n_hidden))
        for j, rows in enumerate(self._tables_by_state):
            col = codes[:, j]
            if np.all(col < 0):
                continue
            ll += rows[np.where(col < 0, rows.shape[0] - 1, col)]
        if self.temperature != 1.0:
            ll /= self.temperature
        return ll + self.log_prior

    def log_joint_one(self, evidence: Mapping[str, str | Sequence[str]]) -> np.ndarray:
        """Unnormalized log P(hidden, evidence) for one case: (H,).

        A value may be a set of states (a partial observation: "one of these"), whose
        likelihood is the sum of the states' likelihoods.
        """
        ll = np.zeros(self.n_hidden)
        for name, state in evidence.items():
            if name not in self.evidence_pos:
                raise ValueError(f"unknown evidence variable {name!r}; valid: {', '.join(self.evidence_pos)}")
            # the row-major copy: one state's likelihoods over every hidden state are contiguous
            # (a column of log_tables strides across the whole table, several times slower)
            rows = self._tables_by_state[self.evidence_pos[name]]
            if isinstance(state, str):
                ll += rows[self._check(name, state)]
            else:
                idx = sorted({self._check(name, s) for s in state})
                if not idx:
                    raise ValueError(f"empty state set for {name}")
                ll += np.logaddexp.reduce(rows[idx], axis=0) if len(idx) > 1 else rows[idx[0]]
        if self.temperature != 1.0:
            ll /= self.temperature
        return ll + self.log_prior

    def _normalize(self, lj: np.ndarray) -> np.ndarray:
        top = lj.max(axis=-1, keepdims=True)
        if not np.all(np.isfinite(top)):
            raise ImpossibleEvidence("evidence has zero probability under the model")
        p = np.exp(lj - top)
        return p / p.sum(axis=-1, keepdims=True)

    def posterior_batch(self, codes: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Root marginals ``{var: (N, card)}`` and ``P(healthy)`` ``(N,)`` for encoded cases."""
        codes = np.atleast_2d(codes)
        # in chunks: one (N, H) table of 14 580 hidden states per case would take over 1 GB
        # for 10 000 cases, and its passes would run from memory instead of cache
        parts = [self.marginals(self._normalize(self.log_joint(codes[i:i + BATCH_CHUNK])))
                 for i in range(0, max(len(codes), 1), BATCH_CHUNK)]
        return ({v: np.concatenate([m[v] for m, _ in parts]) for v in self._root_names},
                np.concatenate([h for _, h in parts]))

    def posterior_from_loglik(self, loglik: np.ndarray, temperature: float | None = None
                              ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Root marginals and ``P(healthy)`` from ``log P(evidence | hidden)`` of a batch ``(N, H)``.

        The batched posterior for evidence already reduced to log-likelihoods (partial
        observations summed, as the prior fitter does); ``temperature`` defaults to this
        network's own.
        """
        t = self.temperature if temperature is None else float(temperature)
        if not t > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        return self.marginals(self._normalize(np.atleast_2d(loglik) / t + self.log_prior))

    def marginals(self, p: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Root marginals ``{var: (N, card)}`` and ``P(healthy)`` ``(N,)`` of hidden-state
        posteriors ``p`` ``(N, H)``."""
        return {v: p @ self._onehot[v] for v in self._root_names}, p @ self.healthy_mask.astype(float)

    def posterior(self, evidence: Mapping[str, str | Sequence[str]], exclude: Iterable[tuple[str, str]] = ()
                  ) -> tuple[dict[str, dict[str, float]], float]:
        """Root marginals ``{var: {state: p}}`` and ``P(healthy)`` for one evidence dict;
        ``exclude``: root states the run makes impossible (probability 0, the rest renormalized),
        and :data:`HEALTHY_KEY` for every root ok."""
        joint = self.root_joint_posterior(evidence, exclude).reshape(self.root_cards)
        marg = {}
        for i, v in enumerate(self._root_names):
            probs = joint.sum(axis=tuple(a for a in range(joint.ndim) if a != i))
            marg[v] = {s: float(x) for s, x in zip(self.states[v], probs)}
        return marg, float(joint.flat[0])  # every root at its first state, ok

    def root_joint_posterior(self, evidence: Mapping[str, str | Sequence[str]],
                             exclude: Iterable[tuple[str, str]] = ()) -> np.ndarray:
        """Posterior over the root joint states (index with :meth:`root_joint_index`), without
        the hidden states of any excluded ``(root, state)``."""
        lj = self.log_joint_one(evidence)
        lj[self.excluded(exclude)] = -np.inf
        return self.sum_latents(self._normalize(lj))

    def excluded(self, exclude: Iterable[tuple[str, str]]) -> np.ndarray:
        """Mask over the hidden states of the excluded ``(root, state)`` pairs, and of every root
        ok for :data:`HEALTHY_KEY`."""
        mask = np.zeros(self.n_hidden, dtype=bool)
        for var, state in exclude:
            if (var, state) == HEALTHY_KEY:
                mask |= self.healthy_mask
            else:
                mask |= self.index[var] == self.states[var].index(state)
        return mask

    def sum_latents(self, x: np.ndarray) -> np.ndarray:
        """``x`` over the hidden states (first axis), summed over the latents: the same over
        the root joint states (index with :meth:`root_joint_index`). A reshape, since hidden
        states run roots-major with the latents fastest; several times faster than a
        ``bincount`` over every hidden state."""
        return x.reshape(self.n_root_joint, -1, *x.shape[1:]).sum(axis=1)

    def likelihood_ratio(self, variable: str, state: str | Sequence[str], cause: str, cause_state: str) -> float:
        """``P(variable = state | cause = cause_state, other roots ok) / P(... | all ok)``.

        How much one observed evidence variable, alone, favours one abnormal root state
        over a healthy run; used to attribute events to hypotheses. ``state`` may be a set.
        """
        m = self.root_likelihood[variable]
        states = [state] if isinstance(state, str) else list(state)
        cols = [self._check(variable, s) for s in states]
        num = m[self.root_joint_index({cause: cause_state}), cols].sum()
        den = m[self.root_joint_index({}), cols].sum()
        return float(num / den) if den > 0 else float("inf")

    def cases(self, evidence_list: Sequence[Mapping[str, str]]) -> np.ndarray:
        """Encode many evidence dicts into an ``(N, n_evidence)`` code matrix."""
        return np.stack([self.encode(e) for e in evidence_list]) if evidence_list else \
            np.empty((0, len(self.evidence_pos)), dtype=np.intp)
