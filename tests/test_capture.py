"""trace capture: vLLM KV-cache events published by the test on a local socket, to a trace."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from kvtier.trace.capture import Batch, decode_batch, requests_from_events
from kvtier.trace.importers.vllm_hash import prompt_block_hashes
from kvtier.trace.io import read_trace
from tests.helpers import assert_one_line_error, invoke

BS = 4
A = [0xA1, 0xA2, 0xA3, 0xA4, 0xA5, 0xA6, 0xA7]
DIGEST_B3 = bytes(24) + (0xB3).to_bytes(8, "big")  # a 32-byte hash whose 64-bit form is 0xB3


def stored(hashes: list, parent: object, medium: str | None = "GPU") -> list:
    """A BlockStored event in msgspec's array_like form: [tag, fields...]."""
    return ["BlockStored", hashes, parent, list(range(BS * len(hashes))), BS, None, medium]


def array_batch(ts: float, events: list) -> bytes:
    return msgpack.packb([ts, events, 0])


# (seq, payload): one request with a chunked prefill and two decode blocks, a second request
# hitting two of its blocks, evictions, a CPU copy (skipped), a clear and a recompute; seq 5 is
# never sent (a missed batch); batch 6 uses the map form.
BATCHES = [
    (0, array_batch(100.0, [stored(A[:3], None)])),
    (1, array_batch(100.01, [stored(A[3:5], A[2])])),
    (2, array_batch(100.3, [stored(A[5:6], A[4])])),
    (3, array_batch(100.6, [stored(A[6:7], A[5])])),
    (4, array_batch(102.0, [stored([DIGEST_B3, 0xB4], A[1]), stored([0xC1], None, "CPU")])),
    (6, msgpack.packb({"ts": 102.5, "events": [{"type": "BlockRemoved", "block_hashes": [A[6]],
                                                "medium": "GPU"}]})),
    (7, array_batch(103.0, [["AllBlocksCleared"]])),
    (8, array_batch(104.0, [stored(A[:1], None)])),
]  # fmt: skip
N_EVENTS = 9


def check_trace(trace) -> None:  # noqa: ANN001
    assert trace.block_tokens == BS
    assert trace.arrival_s.tolist() == [0.0, 2.0, 4.0]
    assert trace.input_tokens.tolist() == [5 * BS, 4 * BS, 1 * BS]
    assert trace.output_tokens.tolist() == [2 * BS, 0, 0]
    hashes = trace.table.column("block_hashes").to_pylist()
    assert hashes == [A[:5], [A[0], A[1], 0xB3, 0xB4], [A[0]]]
    meta = trace.table.schema.metadata
    assert meta[b"capture.blocks_removed"] == b"1"
    assert meta[b"capture.clears"] == b"1"
    assert meta[b"capture.skipped_events"] == b"1"
    assert meta[b"capture.decode_blocks"] == b"2"


def test_reconstruction_from_decoded_batches() -> None:
    batches = [decode_batch(seq, payload) for seq, payload in BATCHES]
    check_trace(requests_from_events(batches))


def publish(port_box: list, ready: threading.Event, batches: list, topic: bytes = b"") -> None:
    """An XPUB socket (wire-compatible with vLLM's PUB) that publishes once a subscriber's
    subscription has arrived, so no batch is lost to the subscriber's late join."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.LINGER, 1000)
    try:
        port_box.append(sock.bind_to_random_port("tcp://127.0.0.1"))
        ready.set()
        if not sock.poll(10_000, zmq.POLLIN):  # the subscription message, or give up
            return
        sock.recv()
        for seq, payload in batches:
            sock.send_multipart([topic, seq.to_bytes(8, "big"), payload])
    finally:
        sock.close()
        ctx.term()


def start_publisher(batches: list, topic: bytes = b"") -> tuple[threading.Thread, int]:
    port_box: list[int] = []
    ready = threading.Event()
    thread = threading.Thread(target=publish, args=(port_box, ready, batches, topic), daemon=True)
    thread.start()
    assert ready.wait(10)
    return thread, port_box[0]


def test_capture_from_a_local_publisher(tmp_path: Path) -> None:
    thread, port = start_publisher(BATCHES, b"kv")
    out = tmp_path / "captured.parquet"
    r = invoke("trace", "capture", "--kv-events", f"tcp://127.0.0.1:{port}", "--topic", "kv",
               "--max-events", str(N_EVENTS), "--duration", "20", "-o", str(out))  # fmt: skip
    thread.join(20)
    assert r.code == 0, r.stderr
    assert "1 event batches were missed" in r.stderr
    assert "wrote 3 requests" in r.stdout
    trace = read_trace(out)
    check_trace(trace)
    assert trace.table.schema.metadata[b"capture.missed_batches"] == b"1"


def test_capture_ends_after_duration_without_events(tmp_path: Path) -> None:
    thread, port = start_publisher([])
    r = invoke("trace", "capture", "--kv-events", f"tcp://127.0.0.1:{port}", "--duration", "0.3",
               "-o", str(tmp_path / "x.parquet"))  # fmt: skip
    thread.join(20)
    assert_one_line_error(r, "--kv-events", "no BlockStored events")


def test_capture_hashes_match_imported_prompts(tmp_path: Path) -> None:
    """Blocks a server stores for a prompt, hashed by vLLM's rule, are the blocks the text
    importer computes for the same tokens: the two sources agree block for block."""
    tokens = np.arange(3, 3 + 4 * BS + 2, dtype=np.uint32)
    offsets, hashes = prompt_block_hashes([tokens], BS)
    full = [int(h) for h in hashes[: len(tokens) // BS]]
    digests = [bytes(24) + h.to_bytes(8, "big") for h in full]
    batch = Batch(0, 5.0, [decode_batch(0, array_batch(5.0, [stored(digests, None)])).events[0]])
    trace = requests_from_events([batch])
    assert trace.table.column("block_hashes").to_pylist() == [full]


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        (b"\xc1not msgpack", "not msgpack"),
        (msgpack.packb([1.0, [["BlockExploded", []]]]), "unknown event type"),
        (msgpack.packb([1.0, [["BlockStored", [1], None, [1], 0]]]), "block_size"),
        (msgpack.packb("hello"), "not a [ts, events"),
    ],
)
def test_malformed_batches_are_one_line_errors(payload: bytes, needle: str, tmp_path: Path) -> None:
    thread, port = start_publisher([(0, payload)])
    r = invoke("trace", "capture", "--kv-events", f"tcp://127.0.0.1:{port}", "--duration", "20",
               "--max-events", "5", "-o", str(tmp_path / "x.parquet"))  # fmt: skip
    thread.join(20)
    assert_one_line_error(r, "--kv-events", "batch seq 0", needle)


def test_capture_options_are_checked(tmp_path: Path) -> None:
    out = str(tmp_path / "x.parquet")
    r = invoke("trace", "capture", "-o", out)
    assert_one_line_error(r, "exactly one of --kv-events and --from-log")
    r = invoke("trace", "capture", "--kv-events", "localhost:5557", "--duration", "1", "-o", out)
    assert_one_line_error(r, "--kv-events", "tcp://HOST:PORT")
    r = invoke("trace", "capture", "--kv-events", "tcp://127.0.0.1:5557", "-o", out)
    assert_one_line_error(r, "--duration or --max-events")
    r = invoke("trace", "capture", "--kv-events", "tcp://127.0.0.1:5557", "--duration", "1",
               "--tokenizer", "t.json", "-o", out)  # fmt: skip
    assert_one_line_error(r, "--tokenizer", "--from-log only")
    r = invoke("trace", "capture", "--from-log", "x.jsonl", "--duration", "1", "-o", out)
    assert_one_line_error(r, "--duration", "--kv-events only")


def test_capture_from_a_gateway_log(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["hello there how are you"], trainers.WordLevelTrainer())
    tok.save(str(tmp_path / "tokenizer.json"))
    log = tmp_path / "gateway.jsonl"
    row = {"timestamp": 7.0, "request": {"prompt": "hello there how are you"},
           "response": {"usage": {"completion_tokens": 3}}}  # fmt: skip
    log.write_text(json.dumps(row) + "\n" + json.dumps({**row, "timestamp": 9.5}) + "\n")
    out = tmp_path / "t.parquet"
    r = invoke("trace", "capture", "--from-log", str(log), "--tokenizer",
               str(tmp_path / "tokenizer.json"), "-B", "2", "-o", str(out))  # fmt: skip
    assert r.code == 0, r.stderr
    trace = read_trace(out)
    assert trace.arrival_s.tolist() == [0.0, 2.5]
    assert trace.input_tokens.tolist() == [5, 5]
    assert trace.table.column("block_hashes")[0] == trace.table.column("block_hashes")[1]


def test_events_of_an_infinite_cache_rebuild_the_prompts() -> None:
    """Events a server with an unbounded prefix cache would publish for known prompts (each
    request stores the full blocks it misses, after the last block it hits) rebuild exactly
    those prompts' full-block chains, for every request that stores more than one block or
    does not extend some request's last block (the documented ambiguity: one more block on a
    request's last block reads as a block of its output)."""
    rng = np.random.default_rng(3)
    system = rng.integers(0, 5000, 10).tolist()
    prompts, arrivals = [], []
    for s in range(40):
        history = system + rng.integers(0, 5000, int(rng.integers(1, 9))).tolist()
        t = float(s * 3.0 + rng.random())
        for _ in range(4):
            prompts.append(np.asarray(history, dtype=np.uint32))
            arrivals.append(t)
            history = history + rng.integers(0, 5000, int(rng.integers(1, 13))).tolist()
            t += 0.5 + float(rng.random())
    order = np.argsort(arrivals, kind="stable")
    offsets, hashes = prompt_block_hashes(prompts, BS)
    stored_set: set[int] = set()
    batches, expected = [], []
    tails: set[int] = set()  # last blocks of the requests so far, as the rebuild tracks them
    for seq, i in enumerate(order):
        full = [int(h) for h in hashes[offsets[i] : offsets[i] + len(prompts[i]) // BS]]
        miss = next((j for j, h in enumerate(full) if h not in stored_set), len(full))
        new = full[miss:]
        if not new:
            continue
        parent = full[miss - 1] if miss else None
        stored_set.update(new)
        event = stored([bytes(24) + h.to_bytes(8, "big") for h in new], parent)
        batches.append(decode_batch(seq, array_batch(arrivals[i], [event])))
        ambiguous = len(new) == 1 and parent in tails
        expected.append(None if ambiguous else (arrivals[i], full))
        tails.discard(parent)  # type: ignore[arg-type]
        tails.add(new[-1])
    trace = requests_from_events(batches, join_gap_s=0.0)
    got = list(zip(trace.column_numpy("capture_ts").tolist(),
                   trace.table.column("block_hashes").to_pylist(), strict=True))  # fmt: skip
    want = [e for e in expected if e is not None]
    assert len(want) > 90  # of 160 prompts: those that store blocks, less the ambiguous
    assert got == want
