"""Pure, jit/vmap/grad-safe estimators (imports nothing else of vccc_jax).

importance     log-ratios -> ratios, truncation, double-sided masks, diagnostics
critic_targets one-step targets: uncorrected, VCCC (Eq 4/8), clipped (Eq 10), naive and
               Z-centred general-baseline clipped (Sec 4.2), empirical b* (Eq 9)
vtrace         n-step / lambda V-trace (Eq 11): reverse scan (vtrace), associative scan
               (vtrace_associative), donating in-place variant (vtrace_inplace)
actor          PPO / IS surrogates with score centering (Eq 2, 13)
"""
