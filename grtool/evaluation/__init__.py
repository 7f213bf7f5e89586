"""Scoring model responses against gold documents (`grtool eval recall`)."""
