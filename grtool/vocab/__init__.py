"""The vocabulary the stages share, on a floor below all of them: the records of questions and responses
(``readers``), the records of exports and checkpoints (``provenance``), the retrieval prompt (``prompt``), the
steps of generative multi-hop retrieval (``gmr``) and the reading of a chain's text (``text``). Export, retrieve,
evaluation, train, chains, filters and the index import it; it imports none of them."""
