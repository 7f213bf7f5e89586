"""grtool: data and indexes for chain-of-thought generative retrieval."""

__version__ = "0.1.0"
