"""The run's configuration: typed sections, the ml_collections schema built from them, the
experiment registry and the generated reference (docs/config.md).

Submodules (imported explicitly): sections (the typed sections every stage shares),
configuration (build, validate and flatten a config against its schema), registry (the
experiments and their configs), configdoc (`python -m terminal_rsi.config.configdoc`).
The typed-setting mechanism they build on (`Section`, `setting`) is `terminal_rsi.settings`,
below every package.
"""
