"""A gallery of wrong estimators, each written the way a user would write it, with the claim
it (wrongly) makes and what ``vccc verify --target`` must say about it.

Loaded by path (``tests/verify/wrong_estimators.py:NAME``) by tests/verify/test_byo_gallery.py.
Each GALLERY entry: (function name, claim, a failing row's name fragment, the diagnosis
fragment that names the bug; "where the bias lives" when no known closed form explains it).
"""

import jax
import jax.numpy as jnp

from vccc_jax.estimators import vtrace
from vccc_jax.estimators.registry import SequenceInputs

sg = jax.lax.stop_gradient


# ------------------------------------------------------------------- one-step critic targets


def uncorrected(rewards, discounts, next_values):
    """Regresses on the stale Bellman sample H: no correction at all."""
    return sg(rewards + discounts * next_values)


def rho_not_rho_minus_one(rewards, discounts, values, next_values, log_rhos, baseline):
    """Eq 4 with rho where rho - 1 belongs: H + rho (H - b)."""
    h = rewards + discounts * next_values
    return sg(h + jnp.exp(log_rhos) * (h - baseline))


def truncated_at_1_5(rewards, discounts, values, next_values, log_rhos):
    """Eq 10 with a hard-coded c = 1.5 (the run claims clipped:2)."""
    w = jnp.minimum(jnp.exp(log_rhos), 1.5)
    return sg(values + w * (rewards + discounts * next_values - values))


def naive_baseline(rewards, discounts, values, next_values, log_rhos, baseline, clip):
    """Clipping substituted into Eq 4: H + (w - 1)(H - b) leaks (1 - Z) b."""
    h = rewards + discounts * next_values
    return sg(h + (jnp.minimum(jnp.exp(log_rhos), clip) - 1.0) * (h - baseline))


def ratio_on_baseline_only(rewards, discounts, values, next_values, log_rhos, baseline):
    """Eq 4 with the ratio applied to the baseline only: H - (rho - 1) b. E[rho - 1] = 0, so
    the correction vanishes in expectation and the mean is the behaviour backup."""
    h = rewards + discounts * next_values
    return sg(h - (jnp.exp(log_rhos) - 1.0) * baseline)


def missing_stop_gradient(rewards, discounts, values, next_values, log_rhos):
    """Eq 8, right mean, but the regression target carries gradient into the critic: passes
    with a warning, fails only with ``loss_ready`` (not in GALLERY: test_byo tests both)."""
    return values + jnp.exp(log_rhos) * (rewards + discounts * next_values - values)


# No known closed form explains these five: the diagnosis says so and names the term of the
# mean that the bias lives in (least squares per MDP on the E_pi / E_mu parts of each term).


def discount_twice(rewards, discounts, values, next_values, log_rhos):
    """Eq 8 with gamma applied twice (``discounts`` already hold gamma (1 - terminal)): the bias
    E_pi[(d^2 - d) Vbar'] = (gamma - 1) E_pi[d Vbar'] is in the bootstrap term, the same for
    every behaviour version (the ratio makes it a pi expectation)."""
    return sg(values + jnp.exp(log_rhos) * (rewards + discounts * discounts * next_values - values))


def ratio_on_bootstrap_only(rewards, discounts, values, next_values, log_rhos):
    """Importance-weights the bootstrap only: r + rho gamma Vbar'. Bias E_mu[r] - E_pi[r]: the
    reward term, different for every behaviour version."""
    return sg(rewards + jnp.exp(log_rhos) * discounts * next_values)


def ratio_on_reward_only(rewards, discounts, values, next_values, log_rhos):
    """Per-decision IS on the reward, bootstrap left uncorrected: H + (rho - 1) r. Bias
    E_mu[gamma Vbar'] - E_pi[gamma Vbar']: the bootstrap term, different for every version."""
    h = rewards + discounts * next_values
    return sg(h + (jnp.exp(log_rhos) - 1.0) * rewards)


def baseline_in_td_error(rewards, discounts, values, next_values, log_rhos, baseline):
    """Eq 8 with the state baseline b where the critic's Vbar(s) belongs inside the TD error:
    Vbar + rho (r + gamma Vbar' - b). Bias Vbar - b: the baseline term, the same for every
    version."""
    return sg(values + jnp.exp(log_rhos) * (rewards + discounts * next_values - baseline))


def hard_coded_gamma(rewards, discounts, values, next_values, log_rhos):
    """Eq 8 with gamma = 0.99 written in, ignoring ``discounts`` (so it bootstraps through
    terminals and uses the wrong gamma): bias E_pi[(0.99 - d) Vbar'], the bootstrap term, the
    same for every version."""
    return sg(values + jnp.exp(log_rhos) * (rewards + 0.99 * next_values - values))


def off_by_one_bootstrap(rewards, discounts, values, next_values, log_rhos):
    """Eq 8 bootstrapping from Vbar(s_t) instead of Vbar(s_{t+1})."""
    return sg(values + jnp.exp(log_rhos) * (rewards + discounts * values - values))


# ------------------------------------------------------------------- multi-step targets


def vtrace_bars_swapped(seq: SequenceInputs, clip, options):
    """Meant rho_bar = clip (which sets the fixed point) and c_bar = 1; swapped them."""
    return vtrace(seq.log_rhos, seq.discounts, seq.rewards, seq.values, seq.bootstrap_value,
                  clip_rho_threshold=1.0, clip_c_threshold=clip, clip_pg_rho_threshold=1.0).vs


def sequence_ratio_per_token(seq: SequenceInputs, clip, options):
    """The whole sequence's ratio prod_t rho_t applied to every token's TD error."""
    next_values = jnp.concatenate([seq.values[1:], seq.bootstrap_value[None]])
    delta = seq.rewards + seq.discounts * next_values - seq.values
    return sg(seq.values + jnp.exp(jnp.sum(seq.log_rhos, axis=0))[None] * delta)


def gae_on_stale_data(seq: SequenceInputs, clip, options):
    """The synchronous-PPO value target, GAE(lambda = 0.9), on stale data (no ratios)."""
    return vtrace(jnp.zeros_like(seq.log_rhos), seq.discounts, seq.rewards, seq.values, seq.bootstrap_value,
                  lambda_=0.9, clip_rho_threshold=None, clip_c_threshold=None, clip_pg_rho_threshold=None).vs


# ----------------------------------------------------------------------------- actor


def tis_uncentred(log_rhos, advantages, clip):
    """Truncated IS weight min(rho, c), without score centering."""
    return jnp.minimum(jnp.exp(log_rhos), clip)


def ratio_inside_gradient(log_pi, log_mu, advantages):
    """An IS policy loss whose weight is not stop-gradient-ed."""
    r = jnp.exp(log_pi - sg(log_pi))
    return -jnp.mean(jnp.exp(log_pi - log_mu) * r * sg(advantages))


GALLERY = (
    ("uncorrected", "vpi", "E[Y|s] =", "the uncorrected target"),
    ("rho_not_rho_minus_one", "vpi", "E[Y|s] =", "rho used where rho - 1 belongs: H + rho (H - b)"),
    ("truncated_at_1_5", "clipped:2", "E[Y|s] =", "clipping to pitilde ∝ min(c mu, pi) at c=1.5"),
    ("naive_baseline", "clipped:2", "E[Y|s] =", "naive-baseline leak (1 - Z) b: H + (w - 1)(H - b) with w = truncate(rho, c=2)"),
    ("ratio_on_baseline_only", "vpi", "E[Y|s] =", "the uncorrected target"),
    ("off_by_one_bootstrap", "vpi", "E[Y|s] =", "off-by-one bootstrap"),
    ("discount_twice", "vpi", "E[Y|s] =", "where the bias lives: the bootstrap term explains 100%"),
    ("ratio_on_bootstrap_only", "vpi", "E[Y|s] =", "where the bias lives: the reward term explains 100%"),
    ("ratio_on_reward_only", "vpi", "E[Y|s] =", "where the bias lives: the bootstrap term explains 100%"),
    ("baseline_in_td_error", "vpi", "E[Y|s] =", "where the bias lives: the baseline term explains 100%"),
    ("hard_coded_gamma", "vpi", "E[Y|s] =", "where the bias lives: the bootstrap term explains"),
    ("vtrace_bars_swapped", "clipped:2", "fixed point", "V-trace with lambda=1, rho_bar=1, c_bar=2"),
    ("sequence_ratio_per_token", "vpi", "Markov", "sequence-level ratio applied per token"),
    ("gae_on_stale_data", "vpi", "fixed point", "uncorrected lambda-return / GAE (rho = 1), lambda=0.9"),
    ("tis_uncentred", "clipped:2", "any b", "uncentred truncated weight at c=2"),
    ("ratio_inside_gradient", "vpi", "Eq 12", "ratio weight left inside the gradient"),
)
