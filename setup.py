"""Which files the wheel ships (the rest of the metadata is in pyproject.toml).

The built-in playbooks live at the top of the repository (`playbooks/`, the design card's layout)
and are shipped as the package data of `deploy.playbooks`: setuptools maps that package to the
`playbooks/` directory. pyproject.toml alone cannot say it: `packages.find` discovers only
directories under `deploy/`, and an explicit `packages` list would have to name every subpackage.
`deploy.playbook.builtin_playbook` reads them from the package in a wheel install and from
`playbooks/` in a source checkout (an editable install maps only packages that have an
`__init__.py`). tests/unit/test_wheel_install.py proves `plan` with every one from a wheel.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["deploy", "deploy.*"]), "deploy.playbooks"],
    package_dir={"deploy.playbooks": "playbooks"},
    package_data={"deploy": ["py.typed", "data/*.json"], "deploy.playbooks": ["*.yaml"]},
)
