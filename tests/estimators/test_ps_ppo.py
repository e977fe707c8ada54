"""PS-PPO estimator pieces: cutoff laws, prefix weights (exactly unbiased per step), GRPO baseline."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from vccc_jax.estimators.related import ps_ppo

H = 6
LAWS = ["full", "uniform", "mixture:0.3", "geometric:0.7"]


@pytest.mark.parametrize("law", LAWS)
def test_survival_and_pmf(law):
    law = ps_ppo.CutoffLaw.parse(law)
    s = np.asarray(law.survival(jnp.array([2.0, 4.5, 6.0]), H))
    assert s.shape == (3, H) and np.all(s[:, 0] == 1.0)
    assert np.all(np.diff(s, axis=-1) <= 1e-12)
    np.testing.assert_allclose(np.asarray(law.pmf(jnp.array([2.0, 4.5]), H)).sum(-1), 1.0, atol=1e-6)
    assert law.always_unbiased == bool(np.all(s > 0))


def test_survival_closed_forms_and_prefix_weights():
    """Each law's S(t) = P(T > t) as the module docstring writes it (L = ceil(length scale),
    capped at H), its pmf P(T = k) = S(k - 1) - S(k) with the mass beyond H on T = H, and
    w_t = 1[t < T] / S(t) times the live-step mask (tool steps and padding get 0)."""
    with jax.enable_x64(True):
        t, scales = np.arange(H), np.array([2.5, 6.0, 9.0])
        L = np.minimum(np.ceil(scales), H)[:, None]
        uni = np.maximum(L - t, 0) / L
        want = {"full": np.ones((3, H)), "uniform": uni, "mixture:0.3": 0.3 + 0.7 * uni,
                "geometric:0.7": np.broadcast_to(0.7 ** t, (3, H))}
        for name, s in want.items():
            law = ps_ppo.CutoffLaw.parse(name)
            np.testing.assert_allclose(law.survival(jnp.asarray(scales), H), s, rtol=1e-12)
            pmf = s - np.concatenate([s[:, 1:], np.zeros((3, 1))], axis=1)
            np.testing.assert_allclose(law.pmf(jnp.asarray(scales), H), pmf, rtol=1e-12, atol=1e-15)
        s = want["mixture:0.3"][:2].T  # [H, 2]
        alive = np.ones((H, 2))
        alive[1, 0] = alive[4:, 1] = 0.0  # a tool step in sequence 0, padding after step 3 in sequence 1
        w = ps_ppo.prefix_weights(jnp.asarray([3, 6]), jnp.asarray(s), jnp.asarray(alive))
        keep = (t[:, None] < np.array([3, 6])[None]) & (s > 0)
        np.testing.assert_allclose(w, np.where(keep, 1.0 / s, 0.0) * alive, rtol=1e-12)


@pytest.mark.parametrize("law", LAWS)
def test_prefix_weights_are_unbiased_per_step(law):
    """sum_T P(T) w_t(T) = 1 for every step t with S(t) > 0 (enumerating every cutoff)."""
    with jax.enable_x64(True):
        law = ps_ppo.CutoffLaw.parse(law)
        lengths = jnp.array([3.0, 6.0])
        s = law.survival(lengths, H)  # [2, H]
        pmf = law.pmf(lengths, H)
        cut = jnp.arange(1, H + 1)
        expect = jnp.zeros((H, 2))
        for b in range(2):
            w = ps_ppo.prefix_weights(cut, jnp.broadcast_to(s[b][:, None], (H, H)))  # [t, T]
            expect = expect.at[:, b].set(w @ pmf[b])
        np.testing.assert_allclose(expect, jnp.where(s.T > 0, 1.0, 0.0), rtol=0, atol=1e-12)


def test_sample_cutoffs_match_survival():
    """Empirical P(T > t) vs S(t): each within a 99.99% binomial interval (fixed key)."""
    law = ps_ppo.CutoffLaw.parse("mixture:0.2")
    n = 20000
    s = law.survival(jnp.full((n,), 5.0), H)
    cut = np.asarray(ps_ppo.sample_cutoffs(jax.random.PRNGKey(0), s))
    assert cut.min() >= 1 and cut.max() <= H
    for t in range(H):
        p = float(s[0, t])
        lo, hi = stats.binom.interval(0.9999, n, p)
        assert lo <= np.sum(cut > t) <= hi, (t, p)


def test_group_advantages_and_loss():
    r = jax.random.normal(jax.random.PRNGKey(1), (3, 5))
    a = ps_ppo.group_advantages(r)
    np.testing.assert_allclose(a.mean(-1), 0.0, atol=1e-6)
    np.testing.assert_allclose(a.std(-1), 1.0, atol=1e-4)
    np.testing.assert_allclose(ps_ppo.group_advantages(r, normalize=False).sum(-1), 0.0, atol=1e-5)
    lp = jnp.log(jnp.array([[0.5, 0.2], [0.3, 0.9]]))
    lm = jnp.log(jnp.array([[0.25, 0.2], [0.3, 0.3]]))
    adv = jnp.array([[1.0, -1.0]])
    w = jnp.array([[1.0, 2.0], [0.0, 1.0]])
    # ratios: 2 (clipped to 1.2, A>0) and 1; 1 and 3 (A<0: min(3 * -1, 1.2 * -1) = -3)
    np.testing.assert_allclose(ps_ppo.ppo_token_loss(lp, lm, adv, w), [-1.2, -(2 * -1.0 + -3.0)],
                               rtol=1e-6)
    np.testing.assert_allclose(ps_ppo.kept_fraction(w, jnp.ones_like(w)), 0.75)


def test_parse_errors_and_capacity():
    for bad in ("banana", "mixture:0", "geometric:1.5", "mixture:x"):
        with pytest.raises(ValueError, match="cutoff law"):
            ps_ppo.CutoffLaw.parse(bad)
    assert str(ps_ppo.CutoffLaw.parse("mixture:0.25")) == "mixture:0.25"
    assert ps_ppo.capacity_for(ps_ppo.CutoffLaw.parse("full"), H, 10) == 60
    # uniform on 1..6 keeps 3.5 steps on average: 1.0 x 3.5 x 10 = 35
    assert ps_ppo.capacity_for(ps_ppo.CutoffLaw.parse("uniform"), H, 10, slack=1.0) == 35
