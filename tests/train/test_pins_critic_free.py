"""Pins of the critic-free learner's bookkeeping, on one learn step of a tiny token env,
each against a reference written here from the logged batch: the per-prompt length scale
(an EMA of live lengths, brute-force loop over episodes) and the kept-token fraction when
the token budget binds (kept tokens = the budget exactly)."""
import jax
import numpy as np
import pytest

from vccc_jax.train import critic_free as cf

ENV = "token:V=8,H=6,Q=4,C=4,P=3,accept=0.4,seed=1"
EMA = 0.7  # != 0.5: the weights of the old scale and the new mean are told apart


@pytest.fixture(scope="module")
def step():
    """(trainer, state before, batch, state after, metrics) of one learn step with a budget
    far below the expected kept tokens (slack 0.3), so it binds."""
    cfg = cf.CFConfig(env=ENV, groups=4, group_size=4, hidden=16, lr=1e-2, law="mixture:0.2",
                      slack=0.3, length_ema=EMA)
    tr = cf.CriticFree(cfg)
    st = tr.init(jax.random.PRNGKey(0))
    batch = tr.rollout(st, jax.random.PRNGKey(1))
    new, metrics = tr.learn(st, batch, jax.random.PRNGKey(2))
    return tr, st, batch, new, jax.device_get(metrics)


def test_length_scale_is_an_ema_of_live_lengths_per_prompt(step):
    tr, st, batch, new, _ = step
    old = np.asarray(st.lengths, np.float64)
    alive = np.asarray(batch.alive)
    prompts = np.asarray(batch.prompts)
    want = old.copy()
    for p in range(tr.task.num_prompts):
        lengths = [alive[:, b].sum() for b in range(len(prompts)) if prompts[b] == p]
        if lengths:
            want[p] = EMA * old[p] + (1 - EMA) * (sum(lengths) / len(lengths))
    assert np.any(want != old)  # some prompt was seen and its mean length is not H
    np.testing.assert_allclose(np.asarray(new.lengths), want, rtol=1e-6)


def test_kept_fraction_counts_only_tokens_within_the_budget(step):
    tr, _, batch, _, m = step
    live = np.asarray(batch.policy_step).sum()
    assert m["live_tokens"] == live
    assert m["overflow"] > 0  # the budget binds (slack 0.3)
    # one block: every packed row is a kept token, and the overflow is what did not fit
    assert m["kept_fraction"] * live == pytest.approx(tr.capacity, abs=1e-3)
    assert m["kept_fraction"] + m["overflow"] <= 1.0 + 1e-6
