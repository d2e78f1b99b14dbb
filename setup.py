"""Which files the wheel ships (the rest of the metadata is in pyproject.toml).

The built-in playbooks live at the top of the repository (`playbooks/`, the design card's layout)
and are shipped as the package data of `deploy.playbooks`: setuptools maps that package to the
`playbooks/` directory. pyproject.toml alone cannot say it: `packages.find` discovers only
directories under `deploy/`, and an explicit `packages` list would have to name every subpackage.
`deploy.engine.playbook.builtin_playbook` reads them from the package in a wheel install and from
`playbooks/` in a source checkout (an editable install maps only packages that have an
`__init__.py`). tests/unit/test_wheel_install.py proves `plan` with every one from a wheel, and that
the build warns of no package it would ignore.
"""

from setuptools import find_packages, setup

setup(
    # deploy/data (the built-in prompt set, no __init__.py) is a data package: listed by name, or
    # setuptools warns "Package 'deploy.data' is absent from the `packages` configuration ... would
    # be ignored" (its data still shipped, for now, through deploy's "data/*.json")
    packages=[*find_packages(include=["deploy", "deploy.*"]), "deploy.data", "deploy.playbooks"],
    package_dir={"deploy.playbooks": "playbooks"},
    package_data={"deploy": ["py.typed"], "deploy.data": ["*.json"], "deploy.playbooks": ["*.yaml"]},
)
