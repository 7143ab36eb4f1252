"""Runtime infrastructure shared by every layer: device meshes and shardings, multi-process
coordination, atomic file writes, weight exports, the JAX compile cache and progress bars.

Submodules (imported explicitly): sharding, multihost, atomic, exports, compile_cache,
progress. Nothing here imports another terminal_rsi package except `settings`.
"""
