"""Looking at the data: `grtool show` (rows of one stage beside their question, gold documents and the verdict of
each docid) and `grtool report` (one self-contained HTML page of a whole run directory).

- :mod:`grtool.inspect.sources`: what a path is (a chains, filtered, responses or triples stage, or an exported
  file) and which corpus and triples it was made from (its records say so; ``--corpus`` / ``--triples`` win).
- :mod:`grtool.inspect.rows`: the rows asked for (by qid, a seeded sample, or the rejects of one filter rule),
  joined with their questions, the documents' titles and the verdict of every docid.
- :mod:`grtool.inspect.render`: those rows for a terminal (colours), as plain text, or as JSON.
- :mod:`grtool.inspect.report`: the HTML report.
"""
