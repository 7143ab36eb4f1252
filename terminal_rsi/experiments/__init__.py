"""Experiment entry points: the top layer of `terminal_rsi`.

One module per experiment that is not a training stage (`credit_diagnostic`, `rescore`,
`rollouts`, `verify_tasks`, `report`), each with its typed config (`CONFIG`, a
`terminal_rsi.settings.Section` class) and `run(config, workdir)`: it reads its settings,
calls the library packages (credit/, rewards/, agent/, tasks/, report/, ...), prints what a
person reads and writes its files into the workdir. `terminal_rsi/config/registry.py` names them and
`experiments/run.py` runs them. The library packages never import this package.
"""
