"""Distribution "lopt": learned optimizers, their meta-training, and the tasks they train on."""
from setuptools import find_packages, setup

# Distributed meta-training: Ray actors for workers and evaluators, Ray Tune for PBT.
RAY_REQUIRES = ["ray[tune]>=2.40"]
# lopt.torch.hf: a Hugging Face Trainer (which needs accelerate); models are built from configs, nothing downloads.
HF_REQUIRES = ["transformers>=4.46", "accelerate>=1.1.0"]
DOCS_REQUIRES = ["sphinx>=7.2", "myst-nb>=1.1", "furo>=2024.1.29", "jupytext>=1.16", "nbclient>=0.10",
                 "nbformat>=5.9", "ipykernel>=6.29", "matplotlib>=3.7"] + HF_REQUIRES

setup(
    name="lopt",
    version="0.1.0",
    description="Meta-train learned optimizers in JAX and use them as optax transforms.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["lopt", "lopt.*", "outer_trainers", "outer_trainers.*", "tasks", "tasks.*"]),
    # Meta-trained theta files (a few KB each) and their provenance ship inside the package.
    # The published optimizers ship as their authors released them: theta file, LICENSE, provenance.
    package_data={"lopt.pretrained": ["*.json", "thetas/*.msgpack"],
                  "lopt.published": ["*/theta.state", "*/LICENSE", "*/info.json"]},
    install_requires=[
        "jax>=0.6.0",
        "jaxlib>=0.6.0",
        "dm-haiku>=0.0.13",
        "flax>=0.10.0",
        "optax>=0.2.4",
        "gin-config>=0.5.0",
        "numpy>=1.26",
        "chex>=0.1.88",
        "scikit-learn>=1.3",
        "tqdm>=4.66",
        "msgpack>=1.0",
        "tensorboardX>=2.6",
        "matplotlib>=3.7",
        "scipy>=1.11",
    ],
    extras_require={
        # The documentation site (Sphinx + myst-nb) and executing the tutorial notebooks.
        "docs": DOCS_REQUIRES,
        # Meta-training on many machines: Ray workers, evaluation actors, PBT with Ray Tune.
        "ray": RAY_REQUIRES,
        # lopt.torch: the meta-trained optimizers as torch.optim.Optimizers.
        "torch": ["torch>=2.1"],
        # lopt.torch.hf: the optimizers in a Hugging Face Trainer.
        "hf": ["torch>=2.1"] + HF_REQUIRES,
        # Everything both test tiers need, the docs build and the tutorials included; pytest-cov prints
        # each tier's line coverage, pytest-xdist runs the tests on every core (-n auto).
        "test": ["pytest>=7.4", "pytest-timeout>=2.2", "pytest-cov>=5.0", "pytest-xdist>=3.5", "torch>=2.1"] + DOCS_REQUIRES + RAY_REQUIRES,
    },
)
