"""Bytes of UTF-8 text per token of a random-token benchmark prompt, for
``serving.epp_prompt_bytes_per_token``.

llm-d's EPP indexes prompts by their text, at 4 bytes a token (docs/model.md, "Routing"), so
how many tokens an index entry covers depends on how dense the prompt's text is. Benchmarks
that build prompts from random token ids make text far denser than prose: inference-perf's
shared-prefix generator (``inference_perf/datagen/shared_prefix_datagen.py``) draws ids
uniformly from ``[0, tokenizer.vocab_size)`` and sends ``tokenizer.decode(ids)``. This script
repeats that with a byte-level BPE vocabulary in tiktoken's format (one ``base64-token rank``
per line: OpenAI's ``o200k_base.tiktoken`` for gpt-oss, Qwen's ``qwen.tiktoken`` for Qwen2 and
Qwen3, Llama 3's ``tokenizer.model``): the ids' bytes joined, decoded as UTF-8 with invalid
sequences replaced (U+FFFD, as the tokenizers' byte-level decoder does), and measured again in
UTF-8, the bytes the EPP hashes.

    python scripts/prompt_bytes_per_token.py o200k_base.tiktoken [--tokens 16000]

The vocabularies the catalogue's figures came from, and where each was found, are in
docs/sources.md [EPP-text-blocks].
"""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path

import numpy as np


def load_vocabulary(path: Path) -> list[bytes]:
    """The token byte strings of a tiktoken-format file, by rank (ranks must run 0..n-1)."""
    tokens: dict[int, bytes] = {}
    for row, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            encoded, rank = line.split()
            tokens[int(rank)] = base64.b64decode(encoded, validate=True)
        except ValueError:
            raise SystemExit(f"{path}: row {row}: expected 'base64-token rank'") from None
    if sorted(tokens) != list(range(len(tokens))):
        raise SystemExit(f"{path}: ranks do not run 0..{len(tokens) - 1}")
    return [tokens[i] for i in range(len(tokens))]


def bytes_per_token(
    vocabulary: list[bytes], tokens: int, samples: int, seed: int
) -> tuple[float, float]:
    """Mean and standard deviation, over ``samples`` prompts of ``tokens`` uniform random ids,
    of the decoded text's UTF-8 bytes per id."""
    rng = np.random.default_rng(seed)
    per = []
    for _ in range(samples):
        ids = rng.integers(0, len(vocabulary), tokens)
        text = b"".join(vocabulary[i] for i in ids).decode("utf-8", errors="replace")
        per.append(len(text.encode("utf-8")) / tokens)
    return float(np.mean(per)), float(np.std(per))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("vocabulary", type=Path, help="tiktoken-format vocabulary file")
    ap.add_argument("--tokens", type=int, default=16000, help="ids per prompt (16000)")
    ap.add_argument("--samples", type=int, default=40, help="prompts drawn (40)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.tokens < 1 or args.samples < 1:
        ap.error("--tokens and --samples must be >= 1")
    if not args.vocabulary.is_file():
        ap.error(f"{args.vocabulary}: no such file")
    vocabulary = load_vocabulary(args.vocabulary)
    mean, sd = bytes_per_token(vocabulary, args.tokens, args.samples, args.seed)
    print(f"{args.vocabulary}: {len(vocabulary):,} tokens; {mean:.4f} bytes a token (sd {sd:.4f})")


if __name__ == "__main__":
    sys.exit(main())
