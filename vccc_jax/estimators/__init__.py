"""Pure, jit/vmap/grad-safe estimators (imports nothing else of vccc_jax).

importance     log-ratios -> ratios, truncation, double-sided masks, diagnostics
critic_targets one-step targets: uncorrected, VCCC (Eq 4/8), clipped (Eq 10), naive and
               Z-centred general-baseline clipped (Sec 4.2), empirical b* (Eq 9)
vtrace         n-step / lambda V-trace (Eq 11), reverse lax.scan and associative scan
actor          PPO / IS surrogates with score centering (Eq 2, 13)
"""
