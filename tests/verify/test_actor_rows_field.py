"""The issue-29 verify rows catch the defects they target (run eagerly on the section's
pieces: no compile of the whole section graph)."""

import jax
import jax.numpy as jnp
import numpy as np

from vccc_jax.estimators import actor_stats
from vccc_jax.verify.sections import actor_rows_field as arf


def _token_capped(log_rhos, mask):
    """The pre-issue-29 cleaning: each token's log-ratio capped at +20 BEFORE the sequence /
    batch statistic."""
    invalid = jnp.isnan(log_rhos) | (log_rhos == jnp.inf)
    x = jnp.where(invalid, -jnp.inf, jnp.minimum(log_rhos, 20.0))
    return jnp.where(actor_stats.mask_on(mask), x, 0.0)


def _large_ratio_error():
    with jax.enable_x64(True):
        lib, pub, kept25 = arf._large_ratios(arf.library_fns(), jax.random.PRNGKey(0))
        return float(np.max(np.abs(np.asarray(lib) - np.asarray(pub)))), float(kept25)


def test_large_ratio_row_passes_and_catches_the_token_cap(monkeypatch):
    """Clean: the library equals the published definitions (error ~0, the log r = 25 token
    dropped). With the per-token cap re-injected, seq_tis gives e^-9 instead of 2 and M2PO
    keeps the outlier: the row's error is >= 1."""
    err, kept = _large_ratio_error()
    assert err <= 1e-12 and kept == 0.0
    monkeypatch.setattr(actor_stats, "clean_log_ratios", _token_capped)
    err, kept = _large_ratio_error()
    assert err >= 1.0 and kept == 1.0

