"""Text to trace: tokenizing (chat templates), vLLM's block-hash rule, sessions, errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from kvtier.trace.importers import ImportOptions, import_trace
from kvtier.trace.importers.vllm_hash import cbor, cbor_uint_array, none_hash
from kvtier.trace.io import read_trace
from tests.helpers import assert_one_line_error, invoke

B = 4
SYSTEM = "you are a helpful assistant answer briefly you are a helpful assistant answer"
WORDS = (
    f"{SYSTEM} what is the capital of france paris is hello there how are you i am fine "
    "thanks user assistant system tell me more about it sure"
)


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "<s>"])
    tok.train_from_iterator([WORDS, "<|im_start|> <|im_end|> <| |>"], trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def encode(tokenizer_path: str, text: str) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(tokenizer_path).encode(text, add_special_tokens=False).ids


def chatml(messages: list[dict[str, str]]) -> str:
    body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return body + "<|im_start|>assistant\n"


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def shared_leading(a: list[int], b: list[int]) -> int:
    return common_prefix(list(a), list(b))


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def chat_row(t: float, system: str, user: str, **extra: object) -> dict:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return {
        "timestamp": t,
        "request": {"messages": messages, **extra.pop("request", {})},  # type: ignore[dict-item]
        "response": {"usage": {"completion_tokens": 5}},
        **extra,
    }


def hashes_of(trace, i: int) -> list[int]:  # noqa: ANN001
    return trace.table.column("block_hashes")[i].as_py()


# -- the vLLM rule ---------------------------------------------------------------------------------
def test_cbor_matches_rfc8949_examples() -> None:
    examples = {
        0: "00",
        23: "17",
        24: "1818",
        100: "1864",
        1000: "1903e8",
        1000000: "1a000f4240",
        1000000000000: "1b000000e8d4a51000",
        None: "f6",
        b"": "40",
        "a": "6161",
        "\u00fc": "62c3bc",
        (1, 2, 3): "83010203",
        (1, (2, 3), (4, 5)): "8301820203820405",
    }
    for value, hex_ in examples.items():
        assert cbor(value).hex() == hex_, value
    ids = np.array([0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32], dtype=np.uint64)
    data, starts = cbor_uint_array(ids)
    assert data == b"".join(cbor(int(i)) for i in ids)
    assert [data[starts[i] : starts[i + 1]] for i in range(len(ids))] == [cbor(int(i)) for i in ids]


def vllm_reference(tokens: list[int], block: int, salt: str | None = None) -> list[int]:
    """vLLM's ``hash_block_tokens`` chain with ``sha256_cbor`` and PYTHONHASHSEED=0, written
    against cbor2 (the library vLLM uses), 64-bit form as in ``maybe_convert_block_hash``."""
    cbor2 = pytest.importorskip("cbor2")

    def sha256_cbor(x: object) -> bytes:
        return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()

    parent, out = sha256_cbor("0"), []
    for start in range(0, len(tokens), block):
        extra = (salt,) if salt and start == 0 else None
        parent = sha256_cbor((parent, tuple(tokens[start : start + block]), extra))
        out.append(int.from_bytes(parent, "big") & (2**64 - 1))
    return out


def test_none_hash_is_vllm_seed_hash() -> None:
    assert none_hash("0") == hashlib.sha256(bytes.fromhex("6130")).digest()


def test_hashes_follow_vllm_rule_exactly(tokenizer_path: str, tmp_path: Path) -> None:
    rows = [
        chat_row(0.0, SYSTEM, "what is the capital of france"),
        chat_row(1.0, SYSTEM, "hello there", request={"cache_salt": "team-a"}),
    ]
    log = write_jsonl(tmp_path / "log.jsonl", rows)
    trace = import_trace("openai-log", log, ImportOptions(tokenizer=tokenizer_path, block_tokens=B))
    for i, row in enumerate(rows):
        tokens = encode(tokenizer_path, chatml(row["request"]["messages"]))
        salt = row["request"].get("cache_salt")
        assert trace.input_tokens[i] == len(tokens)
        assert hashes_of(trace, i) == vllm_reference(tokens, B, salt)


# -- shared-prefix structure -----------------------------------------------------------------------
def test_shared_system_prompt_shares_exactly_the_full_blocks(
    tokenizer_path: str, tmp_path: Path
) -> None:
    users = ["what is the capital of france", "hello there how are you", "tell me more"]
    rows = [chat_row(float(i), SYSTEM, u) for i, u in enumerate(users)]
    log = write_jsonl(tmp_path / "log.jsonl", rows)
    for block in (1, 3, 4, 16):
        trace = import_trace(
            "openai-log", log, ImportOptions(tokenizer=tokenizer_path, block_tokens=block)
        )
        toks = [encode(tokenizer_path, chatml(r["request"]["messages"])) for r in rows]
        for i in range(3):
            assert len(hashes_of(trace, i)) == -(-len(toks[i]) // block)
            for j in range(i + 1, 3):
                lcp = common_prefix(toks[i], toks[j])
                assert lcp >= len(encode(tokenizer_path, f"<|im_start|>system\n{SYSTEM}"))
                shared = shared_leading(hashes_of(trace, i), hashes_of(trace, j))
                assert shared == lcp // block, (block, i, j)


def test_cache_salt_and_tenant_do_not_share(tokenizer_path: str, tmp_path: Path) -> None:
    user = "what is the capital of france"
    rows = [
        chat_row(0.0, SYSTEM, user),
        chat_row(1.0, SYSTEM, user, request={"cache_salt": "a"}),
        chat_row(2.0, SYSTEM, user, request={"cache_salt": "b"}),
        chat_row(3.0, SYSTEM, user, request={"cache_salt": "a"}),
        chat_row(4.0, SYSTEM, user, tenant="a"),
        chat_row(5.0, SYSTEM, user, tenant="c"),
    ]
    log = write_jsonl(tmp_path / "log.jsonl", rows)
    trace = import_trace("openai-log", log, ImportOptions(tokenizer=tokenizer_path, block_tokens=B))
    h = [hashes_of(trace, i) for i in range(len(rows))]
    full = trace.input_tokens[0] // B
    assert full >= 5
    # the same salt shares every block; different salts or no salt share none
    assert h[1] == h[3] == h[4]
    for a, b in [(0, 1), (1, 2), (0, 2), (0, 5), (1, 5)]:
        assert shared_leading(h[a], h[b]) == 0, (a, b)
    assert trace.table.column("tenant").to_pylist() == ["", "a", "b", "a", "a", "c"]


SHAREGPT = [
    {
        "id": "c1",
        "conversations": [
            {"from": "system", "value": SYSTEM},
            {"from": "human", "value": "what is the capital of france"},
            {"from": "gpt", "value": "paris is"},
            {"from": "human", "value": "tell me more about it"},
            {"from": "gpt", "value": "sure paris is the capital of france"},
            {"from": "human", "value": "thanks"},
            {"from": "gpt", "value": "you are fine"},
        ],
    },
    {
        "id": "c2",
        "conversations": [
            {"from": "human", "value": "hello there how are you"},
            {"from": "gpt", "value": "i am fine thanks"},
        ],
    },
]


def test_sharegpt_turns_are_sessions_sharing_history(tokenizer_path: str, tmp_path: Path) -> None:
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(SHAREGPT, indent=1))
    trace = import_trace(
        "sharegpt", str(path), ImportOptions(tokenizer=tokenizer_path, block_tokens=B)
    )
    assert trace.n_requests == 4
    rows = trace.table.to_pylist()
    c1 = [r for r in rows if r["conversation_id"] == "c1"]
    assert [r["turn"] for r in c1] == [0, 1, 2]
    assert len({r["session_id"] for r in c1}) == 1
    assert {r["session_id"] for r in rows if r["conversation_id"] == "c2"}.isdisjoint(
        {c1[0]["session_id"]}
    )
    role = {"system": "system", "human": "user", "gpt": "assistant"}
    msgs = [{"role": role[m["from"]], "content": m["value"]} for m in SHAREGPT[0]["conversations"]]
    for k, end in enumerate((2, 4, 6)):
        tokens = encode(tokenizer_path, chatml(msgs[:end]))
        assert c1[k]["input_tokens"] == len(tokens)
        assert c1[k]["output_tokens"] == len(encode(tokenizer_path, msgs[end]["content"]))
    for k in range(2):
        prev = encode(tokenizer_path, chatml(msgs[: 2 + 2 * k]))
        nxt = encode(tokenizer_path, chatml(msgs[: 4 + 2 * k]))
        assert nxt[: len(prev)] == prev  # the template makes turn k a prefix of turn k+1
        shared = shared_leading(c1[k]["block_hashes"], c1[k + 1]["block_hashes"])
        assert shared == len(prev) // B
    arrivals = [r["arrival_s"] for r in c1]
    assert arrivals == sorted(arrivals) and arrivals[0] < arrivals[-1]


def test_sharegpt_json_lines_and_array_agree(tokenizer_path: str, tmp_path: Path) -> None:
    array, lines = tmp_path / "a.json", tmp_path / "l.jsonl"
    array.write_text(json.dumps(SHAREGPT))
    write_jsonl(lines, SHAREGPT)
    opts = ImportOptions(tokenizer=tokenizer_path, block_tokens=B, seed=3)
    a = import_trace("sharegpt", str(array), opts).table
    b = import_trace("sharegpt", str(lines), opts).table
    assert a.equals(b)


def test_synthetic_schedule_is_seeded_and_documented(tokenizer_path: str, tmp_path: Path) -> None:
    convs = [dict(SHAREGPT[1], id=f"c{i}") for i in range(200)]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(convs))
    opts = ImportOptions(tokenizer=tokenizer_path, block_tokens=B, session_rate=4.0, seed=7)
    t1 = import_trace("sharegpt", str(path), opts)
    t2 = import_trace("sharegpt", str(path), opts)
    assert np.array_equal(t1.arrival_s, t2.arrival_s)
    gaps = np.diff(t1.arrival_s)
    assert t1.arrival_s[0] == 0.0
    assert abs(gaps.mean() - 0.25) < 0.06  # Poisson session starts at 4 per second


def test_lmsys_tstamp_starts_sessions(tokenizer_path: str, tmp_path: Path) -> None:
    def row(cid: str, t: float) -> dict:
        conv = [
            {"role": "user", "content": "hello there"},
            {"role": "assistant", "content": "how are you"},
            {"role": "user", "content": "i am fine"},
            {"role": "assistant", "content": "thanks"},
        ]
        return {"conversation_id": cid, "model": "vicuna", "conversation": conv, "tstamp": t}

    path = write_jsonl(tmp_path / "lm.jsonl", [row("a", 1000.0), row("b", 1050.0)])
    opts = ImportOptions(tokenizer=tokenizer_path, block_tokens=B, think_time_s=5.0)
    trace = import_trace("lmsys", path, opts)
    rows = trace.table.to_pylist()
    firsts = {r["conversation_id"]: r["arrival_s"] for r in rows if r["turn"] == 0}
    assert firsts == {"a": 0.0, "b": 50.0}
    assert {r["model"] for r in rows} == {"vicuna"}
    seconds = {r["conversation_id"]: r["arrival_s"] for r in rows if r["turn"] == 1}
    assert all(seconds[c] > firsts[c] for c in "ab")


def test_chat_template_from_tokenizer_config(tokenizer_path: str, tmp_path: Path) -> None:
    template = (
        "{{ bos_token }}{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}assistant{% endif %}"
    )
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": template, "bos_token": {"content": "<s>"}}))
    log = write_jsonl(tmp_path / "log.jsonl", [chat_row(0.0, "system", "hello there")])
    opts = ImportOptions(tokenizer=tokenizer_path, chat_template=str(config), block_tokens=B)
    trace = import_trace("openai-log", log, opts)
    expected = encode(tokenizer_path, "<s>system system user hello there assistant")
    assert trace.input_tokens[0] == len(expected)
    assert hashes_of(trace, 0) == vllm_reference(expected, B)


def test_completion_prompt_adds_no_template(tokenizer_path: str, tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "request": {"prompt": "hello there how"},
         "response": {"usage": {"completion_tokens": 2}}},
        {"timestamp": 1, "request": {"prompt": [7, 8, 9, 10, 11]},
         "response": {"choices": [{"text": "paris is"}]}},
    ]  # fmt: skip
    log = write_jsonl(tmp_path / "l.jsonl", rows)
    trace = import_trace("openai-log", log, ImportOptions(tokenizer_path, None, B))
    assert trace.input_tokens.tolist() == [3, 5]
    assert trace.output_tokens.tolist() == [2, 2]
    assert hashes_of(trace, 1) == vllm_reference([7, 8, 9, 10, 11], B)


def test_logged_prompt_tokens_that_differ_are_warned(tokenizer_path: str, tmp_path: Path) -> None:
    row = chat_row(0.0, SYSTEM, "hello there")
    tokens = len(encode(tokenizer_path, chatml(row["request"]["messages"])))
    rows = [row, dict(row, response={"usage": {"completion_tokens": 2, "prompt_tokens": tokens}})]
    log = write_jsonl(tmp_path / "same.jsonl", rows)
    r = _import("openai-log", log, "--tokenizer", tokenizer_path)
    assert r.code == 0 and "warning" not in r.stderr, r.stderr  # type: ignore[attr-defined]
    rows.append(dict(row, response={"usage": {"completion_tokens": 2, "prompt_tokens": 3}}))
    log = write_jsonl(tmp_path / "other.jsonl", rows)
    r = _import("openai-log", log, "--tokenizer", tokenizer_path)
    assert r.code == 0, r.stderr  # type: ignore[attr-defined]
    stderr = r.stderr  # type: ignore[attr-defined]
    assert "1 of 2 requests have usage.prompt_tokens other than the tokenized prompt" in stderr
    assert f"(first at line 3: 3 logged, {tokens} tokenized)" in stderr


# -- CLI: round trip and errors --------------------------------------------------------------------
def test_round_trip_through_cli(tokenizer_path: str, tmp_path: Path) -> None:
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(SHAREGPT))
    out = tmp_path / "t.parquet"
    r = invoke("trace", "import", "--from", "sharegpt", str(path), "--tokenizer", tokenizer_path,
               "-B", str(B), "--seed", "5", "--think-time", "2", "-o", str(out))  # fmt: skip
    assert r.code == 0, r.stderr
    assert "4 requests" in r.stdout
    back = read_trace(out)
    direct = import_trace(
        "sharegpt",
        str(path),
        ImportOptions(tokenizer=tokenizer_path, block_tokens=B, seed=5, think_time_s=2.0),
    )
    assert back.table.equals(direct.table)
    assert back.block_tokens == B
    assert back.table.schema.metadata[b"import.block_hash"] == b"vllm-sha256_cbor-seed0"


def _import(kind: str, path: str, *extra: str) -> object:
    return invoke("trace", "import", "--from", kind, path, "-o", path + ".parquet", *extra)


def _lines(*rows: object) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


_OK = {"usage": {"completion_tokens": 1}}
_HI = {"prompt": "hi"}
_CONV = [{"role": "user", "content": "hi"}]
MALFORMED = [
    ("openai-log", _lines({"timestamp": 1, "request": _HI, "response": _OK}, '{"timestamp": 2,'),
     ("line 2", "malformed JSON")),
    ("openai-log", _lines({"timestamp": 1, "request": {}, "response": {}}),
     ("line 1", "request.messages", "missing")),
    ("openai-log", _lines({"request": _HI, "response": _OK}),
     ("line 1", "'timestamp'", "missing field")),
    ("openai-log", _lines({"timestamp": 1, "request": _HI}), ("line 1", "'response'")),
    ("openai-log",
     _lines({"timestamp": 1, "request": _HI, "response": {"usage": {"completion_tokens": -3}}}),
     ("line 1", "response.usage.completion_tokens", ">= 0")),
    ("openai-log", _lines({"timestamp": "yesterday", "request": _HI, "response": _OK}),
     ("line 1", "'timestamp'", "ISO 8601")),
    ("openai-log",
     _lines({"timestamp": 1, "request": {"messages": [{"role": "user", "content": 5}]},
             "response": _OK}),
     ("line 1", "request.messages[0].content")),
    ("sharegpt",
     "[\n" + json.dumps({"id": "a", "conversations": [{"from": "human", "value": "hi"}]})
     + ",\n" + json.dumps({"id": "b", "conversations": [{"from": "human", "value": "hi"},
                                                        {"from": "robot", "value": "x"}]})
     + "\n]",
     ("line 3", "conversations[1].from", "unknown speaker", "gpt")),
    ("sharegpt", json.dumps([{"id": "a", "conversations": [{"from": "human"}]}]),
     ("line 1", "conversations[0].value", "missing")),
    ("sharegpt", '[{"id": "a", "conversations": []},\n{"id": "b"',
     ("line 2", "malformed JSON")),
    ("lmsys", _lines({"conversation_id": "a", "model": "m"}),
     ("line 1", "'conversation'", "missing")),
    ("lmsys",
     _lines({"conversation_id": "a", "model": "m", "conversation": _CONV, "tstamp": "noon"}),
     ("line 1", "'tstamp'", "a number")),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "content", "needles"), MALFORMED)
def test_malformed_input_is_one_line_error(
    kind: str, content: str, needles: tuple[str, ...], tokenizer_path: str, tmp_path: Path
) -> None:
    path = tmp_path / "input.txt"
    path.write_text(content)
    r = _import(kind, str(path), "--tokenizer", tokenizer_path)
    assert_one_line_error(r, str(path), *needles)  # type: ignore[arg-type]


def test_bad_tokenizer_and_template_files(tokenizer_path: str, tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "log.jsonl", [chat_row(0.0, SYSTEM, "hello")])
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"version": "1.0", "model": {"type": "Nonsense"}}')
    r = _import("openai-log", log, "--tokenizer", str(bad))
    assert_one_line_error(r, str(bad), "tokenizer.json")  # type: ignore[arg-type]
    r = _import("openai-log", log)  # no usage.prompt_tokens to fall back on
    assert_one_line_error(r, "usage.prompt_tokens", "--tokenizer", "line 1")  # type: ignore[arg-type]
    r = _import("sharegpt", log)  # no token counts at all in the format
    assert_one_line_error(r, "--tokenizer", "tokenizer.json")  # type: ignore[arg-type]
    config = tmp_path / "tokenizer_config.json"
    config.write_text('{"bos_token": "<s>"}')
    r = _import("openai-log", log, "--tokenizer", tokenizer_path, "--chat-template", str(config))
    assert_one_line_error(r, str(config), "'chat_template'")  # type: ignore[arg-type]
    jinja = tmp_path / "t.jinja"
    jinja.write_text(
        "{% for m in messages %}{{ raise_exception('roles must alternate') }}{% endfor %}"
    )
    r = _import("openai-log", log, "--tokenizer", tokenizer_path, "--chat-template", str(jinja))
    assert_one_line_error(r, str(jinja), "roles must alternate", "line 1")  # type: ignore[arg-type]
    jinja.write_text("{% for m in messages %}")
    r = _import("openai-log", log, "--tokenizer", tokenizer_path, "--chat-template", str(jinja))
    assert_one_line_error(r, str(jinja), "does not parse")  # type: ignore[arg-type]


def test_options_that_do_not_apply_are_refused(tokenizer_path: str, tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "log.jsonl", [chat_row(0.0, SYSTEM, "hello")])
    r = _import("openai-log", log, "--tokenizer", tokenizer_path, "--session-rate", "2")
    assert_one_line_error(r, "--session-rate", "openai-log")  # type: ignore[arg-type]
    r = _import("sharegpt", log, "--tokenizer", tokenizer_path, "--columns", "arrival=x")
    assert_one_line_error(r, "--columns", "sharegpt")  # type: ignore[arg-type]
    r = _import("sharegpt", log, "--tokenizer", tokenizer_path, "--session-rate", "0")
    assert_one_line_error(r, "--session-rate", "> 0")  # type: ignore[arg-type]


# -- tokenizers offline: a model directory, or the log's own counts --------------------------------
def _model_dir(tokenizer_path: str, root: Path, files: dict[str, str]) -> Path:
    import shutil

    model = root / "Some-Model-8B"
    model.mkdir()
    shutil.copy(tokenizer_path, model / "tokenizer.json")
    for name, text in files.items():
        (model / name).write_text(text)
    return model


def test_a_model_directory_is_its_tokenizer_and_chat_template(
    tokenizer_path: str, tmp_path: Path
) -> None:
    rows = [chat_row(0.0, SYSTEM, "hello there"), chat_row(1.0, SYSTEM, "how are you")]
    log = write_jsonl(tmp_path / "log.jsonl", rows)
    template = (
        "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} "
        "{% endfor %}[assistant]"
    )
    # the template in tokenizer_config.json, as most Hugging Face snapshots carry it
    with_config = _model_dir(
        tokenizer_path,
        tmp_path,
        {"tokenizer_config.json": json.dumps({"chat_template": template, "bos_token": "<s>"})},
    )
    got = import_trace("openai-log", log, ImportOptions(tokenizer=str(with_config)))
    want = import_trace(
        "openai-log",
        log,
        ImportOptions(
            tokenizer=tokenizer_path, chat_template=str(with_config / "tokenizer_config.json")
        ),
    )
    assert got.table.column("block_hashes").equals(want.table.column("block_hashes"))
    assert got.table.column("input_tokens").equals(want.table.column("input_tokens"))
    assert got.metadata["import.tokenizer"] == "Some-Model-8B/tokenizer.json"
    assert got.metadata["import.chat_template"] == "tokenizer_config.json"
    first = encode(tokenizer_path, f"<s>[system] {SYSTEM} [user] hello there [assistant]")
    assert got.table.column("input_tokens")[0].as_py() == len(first)
    # newer snapshots: chat_template.jinja beside a config with the special tokens only
    jinja_dir = tmp_path / "jinja"
    jinja_dir.mkdir()
    model = _model_dir(
        tokenizer_path,
        jinja_dir,
        {"chat_template.jinja": template, "tokenizer_config.json": '{"bos_token": "<s>"}'},
    )
    got = import_trace("openai-log", log, ImportOptions(tokenizer=str(model)))
    assert got.metadata["import.chat_template"] == "chat_template.jinja"
    assert got.table.column("block_hashes").equals(want.table.column("block_hashes"))
    # both: the .jinja file wins, as in transformers
    (model / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{{ raise_exception('not this one') }}", "bos_token": "<s>"})
    )
    got = import_trace("openai-log", log, ImportOptions(tokenizer=str(model)))
    assert got.metadata["import.chat_template"] == "chat_template.jinja"
    assert got.table.column("block_hashes").equals(want.table.column("block_hashes"))
    # a directory without a template: the documented default (ChatML), as for a file
    bare = tmp_path / "bare"
    bare.mkdir()
    got = import_trace(
        "openai-log", log, ImportOptions(tokenizer=str(_model_dir(tokenizer_path, bare, {})))
    )
    assert got.metadata["import.chat_template"] == "chatml"
    # and through the command line
    r = _import("openai-log", log, "--tokenizer", str(model))
    assert r.code == 0, r.stderr  # type: ignore[attr-defined]


def test_a_directory_without_tokenizer_json_says_what_to_do(tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "log.jsonl", [chat_row(0.0, SYSTEM, "hello")])
    slow = tmp_path / "slow-model"
    slow.mkdir()
    (slow / "tokenizer.model").write_bytes(b"sentencepiece")
    r = _import("openai-log", log, "--tokenizer", str(slow))
    assert_one_line_error(r, str(slow), "no tokenizer.json", "save_pretrained")  # type: ignore[arg-type]
    empty = tmp_path / "empty"
    empty.mkdir()
    r = _import("openai-log", log, "--tokenizer", str(empty))
    assert_one_line_error(r, str(empty), "no tokenizer.json")  # type: ignore[arg-type]
    r = _import("openai-log", log, "--tokenizer", str(tmp_path / "missing"))
    assert_one_line_error(r, "missing", "no such file or directory")  # type: ignore[arg-type]


def test_without_a_tokenizer_the_logs_own_counts_make_a_lengths_trace(tmp_path: Path) -> None:
    from kvtier.trace.importers.text import LoggedCountsWarning

    rows = []
    for i, (p, c) in enumerate([(120, 7), (95, 3), (300, 40)]):
        row = chat_row(10.0 - i, SYSTEM, f"question {i}", tenant="team-a")
        row["response"] = {"usage": {"prompt_tokens": p, "completion_tokens": c}}
        rows.append(row)
    rows.append(
        {
            "timestamp": 20.0,
            "request": {"prompt": [5, 6, 7, 8]},  # token ids count themselves
            "response": {"usage": {"completion_tokens": 2}},
        }
    )
    log = write_jsonl(tmp_path / "log.jsonl", rows)
    with pytest.warns(LoggedCountsWarning, match="no block hashes"):
        trace = import_trace("openai-log", log, ImportOptions())
    assert not trace.has_prefix_info
    # sorted by arrival: the rows were written latest first
    assert trace.table.column("input_tokens").to_pylist() == [300, 95, 120, 4]
    assert trace.table.column("output_tokens").to_pylist() == [40, 3, 7, 2]
    assert trace.table.column("arrival_s").to_pylist() == [0.0, 1.0, 2.0, 12.0]
    assert trace.metadata["import.tokenizer"].startswith("none")
    r = _import("openai-log", log)
    assert r.code == 0, r.stderr  # type: ignore[attr-defined]
    assert "warning" in r.stderr and "no block hashes" in r.stderr  # type: ignore[attr-defined]
    assert len(r.stderr.strip().splitlines()) == 1  # type: ignore[attr-defined]
    r = _import("openai-log", log, "--chat-template", str(tmp_path / "t.jinja"))
    assert_one_line_error(r, "--chat-template", "--tokenizer only")  # type: ignore[arg-type]
    rows[1]["response"] = {"choices": [{"text": "an answer"}]}  # a text output needs one
    log = write_jsonl(tmp_path / "log2.jsonl", rows)
    r = _import("openai-log", log)
    assert_one_line_error(r, "line 2", "usage.prompt_tokens", "--tokenizer")  # type: ignore[arg-type]
