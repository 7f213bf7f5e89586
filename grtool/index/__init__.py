"""Docid indexes for constrained decoding: build, open, query.

The kinds of index (:mod:`grtool.index.kinds`) register themselves with :data:`grtool.index.base.KINDS` when
defined; importing them here makes every kind known to :meth:`grtool.index.base.Index.open` whichever module of
the package is imported first.
"""

from grtool.index import kinds  # noqa: F401
