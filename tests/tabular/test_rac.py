"""Exact RAC claims on a tabular MDP with two slow channels (float64, ~1e-12). Every claim is
evaluated inside ONE jitted computation shared by the module (one XLA compile)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vccc_jax.tabular import history as H
from vccc_jax.tabular import mdp as M
from vccc_jax.tabular import rac
from vccc_jax.tabular import rac_train as T

DELAYS = (0, 2, 4)
KERNELS = ((1.0,), (0.6, 0.3, 0.1), (0.5, 0.5))
MASSES = (0.0, 0.5)


def _claims(m, ch, probs):
    out = {"full": rac.claim_unbiased_full_mass(m, ch, DELAYS, KERNELS, probs),
           "drop": rac.bias_norm(m, ch, DELAYS, KERNELS, probs, "drop", clip=None),
           "identity": rac.claim_identity_is_vtrace(m, ch, probs, clip=1.0, behaviour_lag=2),
           "cut": rac.bias_cut_ratio(m, ch, DELAYS, KERNELS, probs, clip=1.0)}
    for mass in MASSES:
        out[f"linear{mass}"] = rac.claim_linear_in_unreinjected(m, ch, DELAYS, (0.6, 0.3, 0.1), mass,
                                                                 probs, behaviour_lag=1)
    return out


@pytest.fixture(scope="module")
def problem():
    with jax.enable_x64(True):
        m = M.random_mdp(jax.random.PRNGKey(0), 1, 4, 3, gamma=0.9)[0]
        cfg = H.HistoryConfig(step_size=0.4, num_versions=9)
        probs = H.policy_history(m, H.initial_logits(jax.random.PRNGKey(1), 1, 4, 3, 1.0)[0], cfg).probs
        ch = rac.split_rewards(jax.random.PRNGKey(2), m.R, 3)
        return m, ch, probs


@pytest.fixture(scope="module")
def claims(problem):
    with jax.enable_x64(True):
        return jax.device_get(jax.jit(_claims)(*problem))


def test_unbiased_at_full_mass(claims):
    got, want = claims["full"]
    assert abs(float(got - want)) < 1e-12
    assert float(claims["drop"]) > 1e-2  # dropping the slow channels is biased


@pytest.mark.parametrize("mass", MASSES)
def test_bias_linear_in_unreinjected_fraction(claims, mass):
    got, want = claims[f"linear{mass}"]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert float(np.max(np.abs(want))) > 1e-3


def test_identity_kernel_is_vtrace(claims):
    got, want = claims["identity"]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert float(jnp.max(jnp.abs(want))) > 1e-3


def test_clipped_bias_cut(claims):
    r = claims["cut"]
    assert float(r["rac"]) < float(r["drop"]) and float(r["ratio"]) > 1.0


def test_history_too_short(problem):
    with pytest.raises(ValueError, match="history"):
        rac.expected_update(*problem[:2], (0, 8, 8), KERNELS, problem[2], "rac")


# ------------------------------------------------------- exact training (tabular/rac_train.py)
# One compiled training loop for every run below (same U, C, S, A); float64.

U, LR, LAG = 16, 0.5, 1


@pytest.fixture(scope="module")
def runs(problem):
    m, ch, probs = problem
    with jax.enable_x64(True):
        theta0 = jnp.log(probs[0])
        out = {}
        for clip in (None, 1.0):
            for meth in rac.METHODS:
                W = T.fixed_schedule(U, DELAYS, KERNELS, meth, behaviour_lag=LAG)
                out[meth, clip] = jax.device_get(T.train(m, ch, theta0, W, LR, clip=clip))
        # the slow channels carry the task: the fast one is zero-sum noise (shares 0, .5, .5)
        ch2 = rac.split_rewards(jax.random.PRNGKey(3), m.R, 3, jnp.array([0.0, 0.5, 0.5]))
        for meth in ("drop", "rac"):
            W = T.fixed_schedule(U, DELAYS, KERNELS, meth, behaviour_lag=LAG)
            out[meth, "slow"] = jax.device_get(T.train(m, ch2, theta0, W, LR, clip=1.0))
        out["jstar"] = float(T.optimal_return(m, ch2))
        return out


def test_training_step_is_the_expected_update(problem, runs):
    """After the warm-up (K >= lag + D + len(k) - 1) a step of the loop is
    lr * rac.expected_update on the loop's own policy history, for every method."""
    m, ch, _ = problem
    K = U - 1
    logits = np.stack([runs[meth, 1.0].logits for meth in rac.METHODS])

    @jax.jit
    def expected(hists):  # one compiled graph for the three methods
        return jnp.stack([rac.expected_update(m, ch, DELAYS, KERNELS, h, meth, clip=1.0,
                                              behaviour_lag=LAG)
                          for h, meth in zip(hists, rac.METHODS)])

    with jax.enable_x64(True):
        want = np.asarray(expected(jax.nn.softmax(jnp.asarray(logits[:, : K + 1]), axis=-1)))
    np.testing.assert_allclose((logits[:, K + 1] - logits[:, K]) / LR, want, rtol=0, atol=1e-12)
    assert np.min(np.max(np.abs(want), axis=(1, 2))) > 1e-3


def test_full_mass_no_clip_rac_trajectory_is_waits(runs):
    """Kernel mass 1 and no clip: RAC's expected update is the exact gradient at every step, as
    is wait's, so the trajectories coincide; dropping the slow channels does not."""
    np.testing.assert_allclose(runs["rac", None].logits, runs["wait", None].logits, rtol=0, atol=1e-10)
    assert np.max(np.abs(runs["drop", None].logits - runs["wait", None].logits)) > 1e-2
    assert np.max(np.abs(runs["rac", 1.0].logits - runs["wait", 1.0].logits)) > 1e-6  # the clip binds


def test_drop_trails_rac_when_the_slow_channels_matter(runs):
    j_drop, j_rac = runs["drop", "slow"].returns, runs["rac", "slow"].returns
    assert j_rac[-1] > j_rac[0] + 0.1 and j_rac[-1] > j_drop[-1] + 0.05
    assert j_rac[-1] <= runs["jstar"] + 1e-9


def test_event_schedule_matches_fixed_delays_after_warmup():
    """Synthetic events with a constant lag and constant delays give the fixed schedule's weights
    once every kernel age is inside the run; rac keeps the slow mass, drop loses it, wait refuses
    a trace whose rewards arrive late."""
    B, Uu, lag, delays = 2, 10, 1, (0, 2, 4)
    ks = [(1.0,), (0.6, 0.3, 0.1), (0.5, 0.5)]
    consumed = np.repeat(np.arange(Uu), B)
    ver = np.maximum(consumed - lag, 0)
    arrival = consumed[:, None] + np.asarray(delays)[None, :]
    arrival[arrival >= Uu] = -1  # arrives after the last update: never used
    ev = dict(num_updates=Uu, batch_size=B, consumed=consumed, seg_episode=np.arange(consumed.size),
              seg_version=ver, seg_tokens=np.ones(consumed.size, int), arrival=arrival, kernels=ks)
    warm = lag + max(d + len(k) - 1 for d, k in zip(delays, ks))
    for meth in ("drop", "rac"):
        got, want = T.event_schedule(meth, **ev), T.fixed_schedule(Uu, delays, ks, meth, behaviour_lag=lag)
        np.testing.assert_allclose(got[warm:], want[warm:], rtol=0, atol=1e-15)
    rac_w, drop_w = T.event_schedule("rac", **ev), T.event_schedule("drop", **ev)
    assert drop_w[:, 1:].sum() == 0 and rac_w[:, 1:].sum() > 0
    stats = T.schedule_stats(rac_w)["channels"]
    assert stats[0]["age_max"] == lag and stats[1]["age_mean"] > lag + 2
    with pytest.raises(ValueError, match="wait needs"):
        T.event_schedule("wait", **ev)


def test_time_to_fraction():
    t, j = np.array([0.0, 1.0, 2.0, 3.0]), np.array([0.0, 0.4, 0.95, 1.0])
    assert T.time_to_fraction(t, j, 0.0, 1.0, 0.9) == 2.0
    assert T.time_to_fraction(t, j, 0.0, 2.0, 0.9) == float("inf")
