"""scripts/prompt_bytes_per_token.py: the UTF-8 bytes of text decoded from random token ids."""

from __future__ import annotations

import base64
import importlib.util
from pathlib import Path

import pytest

from tests.helpers import REPO


def script():
    path = REPO / "scripts/prompt_bytes_per_token.py"
    spec = importlib.util.spec_from_file_location("prompt_bytes_per_token", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_vocabulary(path: Path, tokens: list[bytes]) -> Path:
    rows = [f"{base64.b64encode(t).decode()} {rank}" for rank, t in enumerate(tokens)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_invalid_utf8_is_counted_as_the_replacement_characters_bytes(tmp_path: Path) -> None:
    # "ab" is two bytes; a lone 0xff is invalid UTF-8 and decodes to U+FFFD, three bytes (a run
    # of them, one each): a uniform draw of the two averages 2.5 bytes a token
    m = script()
    vocabulary = m.load_vocabulary(write_vocabulary(tmp_path / "v.tiktoken", [b"ab", b"\xff"]))
    assert vocabulary == [b"ab", b"\xff"]
    mean, sd = m.bytes_per_token(vocabulary, 4000, 10, seed=0)
    assert mean == pytest.approx(2.5, abs=0.02)
    assert sd < 0.02
    # one token: exactly its bytes
    assert m.bytes_per_token([b"xyz"], 10, 2, seed=1) == (3.0, 0.0)


def test_a_malformed_vocabulary_names_its_row(tmp_path: Path) -> None:
    m = script()
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("YWI= 0\nnot-base64!! 1\n")
    with pytest.raises(SystemExit, match="row 2"):
        m.load_vocabulary(bad)
    gap = write_vocabulary(tmp_path / "gap.tiktoken", [b"a", b"b"])
    gap.write_text(gap.read_text().replace(" 1\n", " 5\n"))
    with pytest.raises(SystemExit, match="ranks do not run"):
        m.load_vocabulary(gap)
