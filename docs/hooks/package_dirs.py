"""Griffe extension: `popeval.environments` and `popeval.strategies` live in `environments/`
and `strategies/` (setuptools' `package-dir` in pyproject.toml), which griffe's static
analysis does not follow; attach them to `popeval` once it is loaded."""

from __future__ import annotations

import griffe

#: popeval's sub-packages that live outside `popeval/`, by their directory (pyproject.toml).
PACKAGE_DIRS = {"environments": "environments", "strategies": "strategies"}


class PackageDirs(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        if pkg.name != "popeval":
            return
        for name, directory in PACKAGE_DIRS.items():
            if name not in pkg.members:
                pkg.set_member(name, loader.load(directory))
