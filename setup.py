from setuptools import find_namespace_packages, setup

setup(
    name="metaflow-torch-distributed",
    version="0.1.0",
    description="@torch_distributed: gang-scheduled distributed PyTorch steps for Metaflow",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    # The namespace itself is listed so that `pip install -e .` (setuptools' default editable
    # mode) maps metaflow_extensions to this folder, where Metaflow looks for extensions;
    # without it Metaflow finds none (docs/troubleshooting.md, "cannot import name").
    packages=find_namespace_packages(include=["metaflow_extensions", "metaflow_extensions.*"]),
    python_requires=">=3.9",
    # The tested range; versions.py refuses to run outside it (keep both in step).
    install_requires=["metaflow>=2.19.0,<2.20"],
    extras_require={
        # torch is needed in task processes only; install the build that fits your machine.
        "torch": ["torch>=2.4"],
    },
)
