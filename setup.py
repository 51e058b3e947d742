"""Maps the repo's top-level layer folders onto the `dspark.*` import namespace.

`models/` installs as `dspark.models`, `kernels/` as `dspark.kernels`, and so on; `dspark` itself is an
implicit namespace. Declared here because pyproject.toml cannot compute the nested package list.
"""
from setuptools import find_packages, setup

LAYERS = ("models", "kernels", "integration", "ops")

packages = []
for layer in LAYERS:
    packages.append(f"dspark.{layer}")
    packages += [f"dspark.{layer}.{sub}" for sub in find_packages(layer)]

setup(
    packages=packages,
    package_dir={f"dspark.{layer}": layer for layer in LAYERS},
    package_data={"": ["*.proto", "*.json"]},
)
