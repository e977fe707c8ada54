"""Suite-wide settings: strict rank promotion, as the project's conventions require; JAX's
persistent compilation cache off for ``vccc`` commands run by tests (in process or as
subprocesses that inherit the environment), so no test writes into the user's cache home."""
import os

os.environ["VCCC_COMPILE_CACHE"] = "off"

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
