"""Model engine adapters, one module per backend library.

Every call into a backend library lives in its adapter module, so that a change in that
library's API between releases touches one file. Adapter modules import their backend
lazily (inside the functions that need it): importing :mod:`ragbatch.engines` or a
metric that uses it never pulls in torch.

* :mod:`ragbatch.engines.sentence_transformers`: bi-encoders (``embedding`` engines) and
  cross-encoders (``cross_encoder`` engines) through sentence-transformers.
"""

from __future__ import annotations
