"""The module path public classes report: ``dataset_rt.api``, as in dataset-rt 0.4.8.

0.4.8 pickled its public classes (configs, records, datasets) under
``dataset_rt.api``; reporting the same path lets those pickles load, and
`dataset_rt.api` re-exports every public name. The path is set after each class
is built, because pydantic and dataclasses resolve a class's annotations in the
module it names.
"""

from __future__ import annotations

API_MODULE = "dataset_rt.api"


def facade_module(*classes: type) -> None:
    """Make each class report (and pickle by) ``dataset_rt.api``."""
    for cls in classes:
        cls.__module__ = API_MODULE
