"""The group (critic-free) contract: a group advantage estimator's exact expected update.

A group estimator (GRPO, Dr. GRPO, RLOO, REINFORCE++, ReMax, OPO, GPG ...) maps the outcome
rewards of the G completions of one prompt to one advantage per completion:
``fn(rewards [N, G], lengths [N, G], greedy [N]) -> advantages [N, G]`` (N independent groups;
``lengths`` the completions' token counts, ``greedy`` the reward of the greedy completion,
ReMax's baseline). Under asynchrony the G completions of a prompt come from different
behaviour versions: each slot draws a lag L from the lag law, then its completion from
mu_L = pi_{H - L}. The update is (1/G) sum_i w_i A_i grad log pi(y_i) (tokens summed, the
group averaged) with w_i = pi(y_i) / mu_{L_i}(y_i) (the ratio row: Eq 12's correction per
completion) or w_i = 1 (the uncorrected row). Its expectation is enumerated exactly over all
C^G ordered groups of completions; the versions factor out:

    ratio:  E[U] = sum_y (1/G) sum_i A_i(y) S(y_i) pi(y_i) prod_{j != i} m(y_j)
    w = 1:  E[U] = sum_y prod_j m(y_j) (1/G) sum_i A_i(y) S(y_i)

with m = sum_L P(L) mu_L the law's behaviour mixture and S(y) = grad_theta log pi(y) (exact,
float64). The baseline's dependence on the sample is inside the expectation: a baseline that
includes y_i (the group mean) gives (1 - 1/G) Eq 12 at best, a leave-one-out one Eq 12.
The claim is Eq 12: grad J = sum_y pi(y) r(y) S(y).

Testbeds (:func:`testbeds`): a 4-armed bandit (one-token completions) and a token tree
(first token EOS, a or b; after a or b one more token a or b: completions EOS, aa, ab, ba,
bb of 1 or 2 tokens; one softmax per prefix). Each problem draws logits and outcome rewards
in {0, 0.5, 1} (each level present: with two levels every per-reward advantage gives a multiple
of Eq 12, since sum_y pi(y) S(y) = 0, which would hide the bias of a sample-dependent baseline); the learner is the end of an exact gradient-ascent
history theta_{k+1} = theta_k + STEP grad J(theta_k), k < HORIZON, and lag L's behaviour is
pi_{HORIZON - L} (as :mod:`.lags` on the MDPs). ReMax's greedy completion is decoded
greedily under the learner.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Optional, Sequence

import numpy as np

from vccc_jax.verify.report import Row, failing, worst

HORIZON = 16
STEP = 1.0
GROUP = 4
TOL = 1e-9          # relative: ||E[U] - grad J|| / ||grad J||
NUM_PROBLEMS = 8


@dataclasses.dataclass(frozen=True)
class Testbed:
    """Completions of one prompt: ``paths`` [C, <=T] token ids per prefix node, ``nodes`` the
    softmax each token is drawn from; ``num_params``; ``lengths`` [C]."""

    name: str
    paths: tuple            # per completion: ((node, token), ...)
    node_sizes: tuple       # tokens per node

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(p) for p in self.paths], float)

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.node_sizes)])

    @property
    def num_params(self) -> int:
        return int(sum(self.node_sizes))

    def policy(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(pi [C], S [C, P] = grad log pi) of per-node softmax logits ``theta`` [P]."""
        off = self.offsets
        probs = [np.exp(theta[off[k]:off[k + 1]] - np.max(theta[off[k]:off[k + 1]])) for k in range(len(off) - 1)]
        probs = [p / p.sum() for p in probs]
        pi = np.ones(len(self.paths))
        S = np.zeros((len(self.paths), self.num_params))
        for c, path in enumerate(self.paths):
            for node, tok in path:
                pi[c] *= probs[node][tok]
                S[c, off[node]:off[node + 1]] -= probs[node]
                S[c, off[node] + tok] += 1.0
        return pi, S

    def greedy(self, theta: np.ndarray) -> int:
        """The completion decoded greedily (argmax token at each node)."""
        off = self.offsets
        best = {k: int(np.argmax(theta[off[k]:off[k + 1]])) for k in range(len(off) - 1)}
        for c, path in enumerate(self.paths):
            if all(best[node] == tok for node, tok in path):
                return c
        raise AssertionError("no greedy completion")


def testbeds() -> tuple[Testbed, Testbed]:
    bandit = Testbed("bandit", tuple(((0, a),) for a in range(4)), (4,))
    # node 0: EOS (0), a (1), b (2); node 1 after a, node 2 after b: a (0), b (1)
    tree = Testbed("token tree", (((0, 0),), ((0, 1), (1, 0)), ((0, 1), (1, 1)), ((0, 2), (2, 0)),
                                  ((0, 2), (2, 1))), (3, 2, 2))
    return bandit, tree


@dataclasses.dataclass(frozen=True)
class Problem:
    testbed: Testbed
    rewards: np.ndarray     # [C]
    thetas: np.ndarray      # [HORIZON + 1, P] the history; the learner is thetas[-1]


def problems(testbed: Testbed, num: int = NUM_PROBLEMS, seed: int = 0) -> list[Problem]:
    rng = np.random.default_rng([seed, len(testbed.paths)])
    out = []
    C = len(testbed.paths)
    for _ in range(num):
        r = rng.permutation(np.resize([0.0, 1.0, 0.5], C))  # three levels: binary rewards hide biases
        theta = rng.normal(size=testbed.num_params)
        hist = [theta]
        for _ in range(HORIZON):
            pi, S = testbed.policy(hist[-1])
            hist.append(hist[-1] + STEP * (pi * r) @ S)
        out.append(Problem(testbed, r, np.stack(hist)))
    return out


def law_pmf(law) -> np.ndarray:
    """P(L) for L = 0..HORIZON from an int lag or a ``vccc train --lag`` law (``envs.lag``)."""
    from vccc_jax.envs.lag import LagLaw

    return LagLaw.parse(law if isinstance(law, str) else f"fixed:{int(law)}").pmf(HORIZON + 1)


def groups(C: int, G: int = GROUP) -> np.ndarray:
    """Every ordered group of G completions. [C^G, G]"""
    return np.array(list(itertools.product(range(C), repeat=G)), int)


@dataclasses.dataclass
class Expected:
    """Per problem: E[U] with the ratio, without it (w = 1), and grad J. [n, P] each."""

    ratio: np.ndarray
    plain: np.ndarray
    grad: np.ndarray


def advantages_for(fn: Callable, probs: Sequence[Problem], G: int = GROUP) -> list[np.ndarray]:
    """The estimator's advantages on every ordered group of every problem. [C^G, G] each."""
    out = []
    for p in probs:
        ys = groups(len(p.testbed.paths), G)
        greedy = np.full(len(ys), p.rewards[p.testbed.greedy(p.thetas[-1])])
        adv = np.asarray(fn(p.rewards[ys], p.testbed.lengths[ys], greedy), float)
        if adv.shape != ys.shape:
            raise ValueError(f"group estimator returned shape {adv.shape} for rewards of shape {ys.shape}")
        out.append(adv)
    return out


def expected(probs: Sequence[Problem], advs: Sequence[np.ndarray], pmf: np.ndarray, G: int = GROUP) -> Expected:
    """Exact E[U] under the lag law ``pmf`` (module docstring)."""
    rat, pla, grad = [], [], []
    for p, A in zip(probs, advs):
        pols = [p.testbed.policy(t) for t in p.thetas]
        pi, S = pols[-1]
        m = sum(w * pols[HORIZON - L][0] for L, w in enumerate(pmf) if w > 0)
        ys = groups(len(pi), G)
        mm = m[ys]                                            # [T, G]
        prod_all = np.prod(mm, axis=1)
        others = np.stack([np.prod(np.delete(mm, i, axis=1), axis=1) for i in range(G)], 1)  # prod_{j != i}
        coef_r = A * pi[ys] * others / G                      # [T, G]
        coef_p = A * prod_all[:, None] / G
        rat.append(np.einsum("tg,tgp->p", coef_r, S[ys]))
        pla.append(np.einsum("tg,tgp->p", coef_p, S[ys]))
        grad.append((pi * p.rewards) @ S)
    return Expected(np.stack(rat), np.stack(pla), np.stack(grad))


@dataclasses.dataclass
class Fit:
    """E[U] against grad J per problem: relative bias, min cosine, the scale alpha of the best
    multiple alpha grad J and what it leaves (``resid``: ||E - alpha g|| / ||g||)."""

    rel: np.ndarray
    cos: np.ndarray
    alpha: np.ndarray
    resid: np.ndarray

    @property
    def exact(self) -> bool:
        return not failing(self.rel, TOL).any()

    @property
    def multiple(self) -> bool:
        return not failing(self.resid, TOL).any()

    def sentence(self) -> str:
        if self.exact:
            return f"E[update] = Eq 12 (relative error {worst(self.rel):.1e})"
        a_lo, a_hi = float(np.min(self.alpha)), float(np.max(self.alpha))
        alpha = f"{a_lo:.4g}" if a_hi - a_lo <= 1e-9 * max(1.0, abs(a_hi)) else f"{a_lo:.3g} to {a_hi:.3g}"
        if self.multiple:
            return f"E[update] = {alpha} x Eq 12 (the direction is Eq 12's; residual {worst(self.resid):.1e})"
        return (f"E[update] is not a multiple of Eq 12: relative bias up to {worst(self.rel):.2g}, min cosine "
                f"{float(np.min(self.cos)):.3f}; best multiple {alpha} leaves {worst(self.resid):.2g}")


def fit(e: np.ndarray, g: np.ndarray) -> Fit:
    ng = np.linalg.norm(g, axis=1)
    ne = np.linalg.norm(e, axis=1)
    alpha = np.einsum("np,np->n", e, g) / ng**2
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.einsum("np,np->n", e, g) / (ne * ng)
    return Fit(np.linalg.norm(e - g, axis=1) / ng, cos, alpha,
               np.linalg.norm(e - alpha[:, None] * g, axis=1) / ng)


@dataclasses.dataclass
class GroupReport:
    """Per lag (or law): the fits of the ratio and uncorrected rows on both testbeds."""

    name: str
    fits: dict   # {(testbed, lag, "ratio" | "plain"): Fit}

    def rows(self) -> list[Row]:
        rows = []
        for (tb, lag, kind), f in self.fits.items():
            what = "ratio pi/mu" if kind == "ratio" else "no ratio (w = 1)"
            rows.append(Row(f"{self.name}: E[update] = Eq 12, {tb}, lag {lag}, {what}", "Eq 12", "exact",
                            len(f.rel), worst(f.rel), TOL, f.exact, f.sentence()))
        return rows


def check_group(fn: Callable, name: str, lags: Sequence = (0, 1, 4, 16), *, num: int = NUM_PROBLEMS,
                seed: int = 0, G: int = GROUP, beds: Optional[Sequence[Testbed]] = None) -> GroupReport:
    """Fit E[update] of the estimator ``fn`` to Eq 12 at each lag (an int or a law string)."""
    fits = {}
    for tb in beds or testbeds():
        probs = problems(tb, num, seed)
        advs = advantages_for(fn, probs, G)
        for lag in lags:
            ex = expected(probs, advs, law_pmf(lag), G)
            fits[(tb.name, lag, "ratio")] = fit(ex.ratio, ex.grad)
            fits[(tb.name, lag, "plain")] = fit(ex.plain, ex.grad)
    return GroupReport(name, fits)


def is_group(fn) -> bool:
    """A group estimator: a library adapter's (``group_contract``) or ``fn(rewards, lengths, ...)``."""
    import inspect

    if getattr(fn, "group_contract", False):
        return True
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return names[:2] == ["rewards", "lengths"]


def report(fn: Callable, name: str, lag=0) -> tuple[list[Row], list[str]]:
    """(rows, diagnosis) of ``vccc verify --target`` for a group estimator at ``lag`` (an int or
    a law): the ratio rows are the claim (Eq 12); the rows without the ratio are information."""
    from vccc_jax.verify.diagnose import as_info

    rep = check_group(fn, name, (lag,))
    rows = rep.rows()
    for r in rows:
        if "no ratio" in r.name:
            as_info(r, "information (the update without the ratio; the claim is the ratio row)")
    diagnosis = [f"{tb}: with the ratio {rep.fits[(tb, lag, 'ratio')].sentence()}; without it "
                 f"{rep.fits[(tb, lag, 'plain')].sentence()}" for tb in dict.fromkeys(k[0] for k in rep.fits)]
    return rows, diagnosis


def kl(lag, num: int = NUM_PROBLEMS, seed: int = 0) -> float:
    """Mean KL(pi || m) over the problems of both testbeds under lag (or law) ``lag``."""
    vals = []
    pmf = law_pmf(lag)
    for tb in testbeds():
        for p in problems(tb, num, seed):
            pols = [tb.policy(t)[0] for t in p.thetas]
            m = sum(w * pols[HORIZON - L] for L, w in enumerate(pmf) if w > 0)
            vals.append(float(np.sum(pols[-1] * (np.log(pols[-1]) - np.log(m)))))
    return float(np.mean(vals))


# ---------------------------------------------------------------- reference estimators (ours)
# Written from the papers, independent of any library, [N, G] NumPy; the cross rows compare the
# libraries' functions with these and with train/critic_free's group baseline on the same groups.

def grpo(r, lengths=None, greedy=None, *, eps=1e-6, ddof=1):
    """GRPO (Shao et al. 2024): (r - mean_g r) / (std_g r + eps); ddof 1 as torch.std."""
    return (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=ddof, keepdims=True) + eps)


def dr_grpo(r, lengths=None, greedy=None):
    """Dr. GRPO (Liu et al. 2025): r - mean_g r (no std)."""
    return r - r.mean(1, keepdims=True)


def rloo(r, lengths=None, greedy=None):
    """RLOO (Ahmadian et al. 2024): r_i - mean_{j != i} r_j."""
    G = r.shape[1]
    return (G * r - r.sum(1, keepdims=True)) / (G - 1)


def remax(r, lengths=None, greedy=None):
    """ReMax (Li et al. 2023): r - r(greedy completion)."""
    return r - np.asarray(greedy)[:, None]


def opo(r, lengths, greedy=None):
    """OPO (Hao et al. 2025): r - sum_j l_j r_j / sum_j l_j (length-weighted group mean)."""
    return r - (lengths * r).sum(1, keepdims=True) / lengths.sum(1, keepdims=True)


def _whiten(x, w):
    """Whitening over the batch's tokens: x a per-completion value repeated over its w tokens;
    mean and Bessel-corrected variance over all tokens, each mean's denominator n + 1e-8 and
    1 / sqrt(var + 1e-8) (REINFORCE++'s paper whitens; the epsilons are verl's masked_whiten)."""
    n = w.sum(1, keepdims=True)
    mean = (w * x).sum(1, keepdims=True) / (n + 1e-8)
    var = (w * (x - mean) ** 2).sum(1, keepdims=True) / (n + 1e-8) * n / (n - 1)
    return (x - mean) / np.sqrt(var + 1e-8)


def reinforce_pp(r, lengths, greedy=None):
    """REINFORCE++ (Hu 2025), outcome reward, gamma 1: the return r whitened over the batch's tokens."""
    return _whiten(r, lengths)


def reinforce_pp_baseline(r, lengths, greedy=None):
    """REINFORCE++-baseline: r - mean_g r, then whitened over the batch's tokens."""
    return _whiten(r - r.mean(1, keepdims=True), lengths)


def gpg(r, lengths=None, greedy=None):
    """GPG (Chu et al. 2025): alpha (r - mean_g r), alpha = batch size / #nonzero rewards."""
    alpha = r.shape[1] / np.maximum(np.count_nonzero(r, axis=1, keepdims=True), 1)
    return alpha * (r - r.mean(1, keepdims=True))


REFERENCES = {"grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo, "remax": remax, "opo": opo,
              "reinforce_plus_plus": reinforce_pp, "reinforce_plus_plus_baseline": reinforce_pp_baseline,
              "gpg": gpg}
