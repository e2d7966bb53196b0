from setuptools import find_namespace_packages, setup

# The release's version, here only: CHANGELOG.md's newest entry names it (tests/unit/
# test_packaging.py) and the installed package reads it from its metadata.
VERSION = "0.3.0"

REPOSITORY = "https://github.com/metaflow-torch-distributed/metaflow-torch-distributed"

setup(
    name="metaflow-torch-distributed",
    version=VERSION,
    description="@torch_distributed: gang-scheduled distributed PyTorch steps for Metaflow",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    license_expression="Apache-2.0",
    license_files=["LICENSE"],
    project_urls={
        "Documentation": REPOSITORY + "/blob/main/docs/index.md",
        "Source": REPOSITORY,
        "Changelog": REPOSITORY + "/blob/main/CHANGELOG.md",
        "Issues": REPOSITORY + "/issues",
    },
    classifiers=[
        "Development Status :: 4 - Beta",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: System :: Distributed Computing",
    ],
    # The namespace itself is listed so that `pip install -e .` (setuptools' default editable
    # mode) maps metaflow_extensions to this folder, where Metaflow looks for extensions;
    # without it Metaflow finds none (docs/troubleshooting.md, "cannot import name").
    packages=find_namespace_packages(include=["metaflow_extensions", "metaflow_extensions.*"]),
    # What CI runs: the suite on 3.11, the real flows' core on 3.10 (the oldest torch), 3.12
    # and 3.13 (the newest torch) in .ci/torch_range (tests/unit/test_packaging.py).
    python_requires=">=3.10,<3.14",
    # No dependency on Metaflow: it comes as `metaflow` or as Outerbounds' `ob-metaflow` (the
    # same `metaflow` module), and pip would install one over the other. The team's own
    # Metaflow is used; versions.py refuses one outside the tested range when a flow starts.
    extras_require={
        # A fresh environment: pip install 'metaflow-torch-distributed[metaflow]'
        # (the tested range; versions.py refuses to run outside it: keep both in step)
        "metaflow": ["metaflow>=2.19.0,<2.20"],
        # torch is needed in task processes only; install the build that fits your machine.
        # The tested range (core/supported.py's TESTED_TORCH; .ci/torch_range runs its ends):
        # an older torch is refused when a flow starts, a newer one runs with a warning.
        "torch": ["torch>=2.5.0,<2.16"],
    },
)
