"""The audit: ``grtool validate``'s checks of every artifact kind grtool writes (stage directories, indexes,
lookups, exports, pipeline records).

It sits above the stage packages because it checks their outputs with their own readers; the status of a stage
directory (:mod:`grtool.store.status`) stays in ``store/``.
"""
