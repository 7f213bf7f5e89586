"""Training data for the train tests: small SFT and KTO files about a few people's birthplaces."""

from __future__ import annotations

from pathlib import Path
import orjson
from grtool.export.formats import dataset_info_stanza, kto_row, sft_row, update_dataset_info
from grtool.index.tokenizer import DOCID_END, DOCID_START
from grtool.vocab.prompt import instruction


PEOPLE = [("Ada Lovelace", "London", "England"), ("Marie Curie", "Warsaw", "Poland"), ("Alan Turing", "Maida Vale", "England"),
          ("Niels Bohr", "Copenhagen", "Denmark"), ("Emmy Noether", "Erlangen", "Germany"), ("Enrico Fermi", "Rome", "Italy"),
          ("Lise Meitner", "Vienna", "Austria"), ("Paul Dirac", "Bristol", "England")]  # fmt: skip


def question(i: int) -> str:
    person = PEOPLE[i % len(PEOPLE)][0]
    return f"In which country is the birthplace of {person}?" if i < len(PEOPLE) else f"Which country holds the city where {person} was born?"


def chain(i: int, good: bool = True) -> str:
    person, city, country = PEOPLE[i % len(PEOPLE)]
    first = f"{DOCID_START}{person}, place of birth, {city}{DOCID_END}"
    if not good:
        return f"{first} The triples do not say where {city} is, so the question cannot be answered."
    return f"{person} was born in {first}. {city} lies in {DOCID_START}{city}, country, {country}{DOCID_END}. So the answer is {country}."


def write_sft(path: Path, n: int = 16, fmt: str = "llamafactory-sharegpt") -> Path:
    """Rows exactly as `export sft` writes them, registered in dataset_info.json like it does."""
    rows = [sft_row(fmt, instruction(question(i)), chain(i), None) for i in range(n)]
    if fmt.startswith("llamafactory"):
        path.write_bytes(orjson.dumps(rows))
        update_dataset_info(path.parent, {path.stem: dataset_info_stanza(fmt, path.name, system=False)})
    else:
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def write_kto(path: Path, desirable: int = 8, undesirable: int = 8, fmt: str = "llamafactory") -> Path:
    rows = [kto_row(fmt, instruction(question(i)), chain(i, True), True, None) for i in range(desirable)]
    rows += [kto_row(fmt, instruction(question(i)), chain(i, False), False, None) for i in range(undesirable)]
    if fmt == "llamafactory":
        path.write_bytes(orjson.dumps(rows))
        update_dataset_info(path.parent, {path.stem: dataset_info_stanza("llamafactory-sharegpt", path.name, system=False, kto=True)})
    else:
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path
