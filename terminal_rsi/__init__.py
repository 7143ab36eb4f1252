"""terminal_rsi: train terminal agents with the Terminal-RSI recipe in JAX/Flax.

Importing the package is light: submodules that pull in heavy engines (Docker,
HTTP servers, plotting) import them where they are used.
"""

__version__ = "0.1.0"
