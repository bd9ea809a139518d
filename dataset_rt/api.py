"""The public names under the module path dataset-rt 0.4.8 gave them.

0.4.8's classes report ``dataset_rt.api`` as their module, so its users' pickles
(and some imports) name ``dataset_rt.api.ReaderConfig`` and the like. The same
classes report it here, and this module re-exports every public name of
``dataset_rt`` but its exception classes (0.4.8's had none here), so those
pickles load and those imports resolve to the very objects ``dataset_rt`` exports.
"""

import dataset_rt as _package
from dataset_rt import *  # noqa: F403 - the package's own list, not a copy of it
from dataset_rt import errors as _errors

__all__ = [name for name in _package.__all__ if name not in _errors.__all__]
