"""Suite-wide settings: strict rank promotion, as the project's conventions require."""
import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
