"""Record a trace from a running vLLM server's KV-cache events (``kvtier trace capture``).

**Wire format**, as read in vLLM's ``vllm/distributed/kv_events.py`` (``ZmqEventPublisher``,
``KVEventBatch``, ``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``; commit
0181ea3173e53eea8cf04a86891488e3dc89bb34) and its ``examples/online_serving/
kv_events_subscriber.py``: the server (``--kv-events-config '{"enable_kv_cache_events": true,
"publisher": "zmq", "endpoint": "tcp://*:5557"}'``) binds a ZMQ PUB socket and sends, per
scheduler step with cache changes, a three-frame message ``(topic, seq, payload)``: the
configured topic (default empty), an 8-byte big-endian sequence number counting batches from 0,
and a msgpack ``KVEventBatch``. msgspec encodes the batch ``array_like`` as ``[ts, events,
data_parallel_rank]`` and each event as ``[tag, *fields]`` with tag ``"BlockStored"``
(``block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
extra_keys, group_idx, ...``; trailing defaults omitted), ``"BlockRemoved"`` (``block_hashes,
medium, group_idx``) or ``"AllBlocksCleared"``. The map form (``{"ts", "events"}``, events with
a ``"type"`` key) of some builds is read too. Block hashes are 32-byte digests, or 64-bit
integers with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``; both become vLLM's 64-bit form (the
digest's last 8 bytes, big-endian), which is also what ``trace import --from openai-log``
computes, so the two agree for a server hashing with ``sha256_cbor`` and ``PYTHONHASHSEED=0``.

**Reconstruction** (:func:`requests_from_events`; docs/traces.md says what it cannot recover).
The events say which blocks were *computed* and when, and their chain (``parent_block_hash``),
but not requests: requests are inferred.

* A ``BlockStored`` event is one request's newly full blocks in one step. Its prompt is the
  chain of its parent (blocks it found cached, hits) followed by its blocks.
* An event that extends the last block of a request seen at most ``join_gap_s`` earlier with
  more than one block is a further chunk of that request's prefill (chunked prefill); one that
  extends it by exactly one block is a block of its *output* (decode fills one block per step):
  ``output_tokens`` grows by the block size, the prompt does not.
* Anything else starts a request: arrival is the batch time (the step that scheduled its
  prefill, so queueing before it is not seen), input is its full blocks times the block size
  (the partial last block of a prompt is never stored, so it is not seen).
* Only GPU blocks (``medium`` unset or ``"GPU"``) of KV-cache group 0 count; offload copies and
  other groups are counted in the metadata and skipped. ``BlockRemoved`` and
  ``AllBlocksCleared`` are counted (evictions measure the server's cache pressure); a cleared
  cache closes every open request.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from kvtier.errors import InputError
from kvtier.trace.format import Trace

_MASK64 = (1 << 64) - 1
DEFAULT_JOIN_GAP_S = 0.5
_GPU_MEDIA = (None, "GPU")


@dataclass(frozen=True)
class Batch:
    """One received ``KVEventBatch``: its sequence number, time and decoded events."""

    seq: int
    ts: float
    events: list[dict[str, Any]]


@dataclass
class CaptureStats:
    """What a capture saw, kept as trace metadata (``capture.*``)."""

    batches: int = 0
    missed_batches: int = 0
    blocks_stored: int = 0
    blocks_removed: int = 0
    clears: int = 0
    skipped_events: int = 0
    unknown_parents: int = 0
    decode_blocks: int = 0
    extra: dict[str, str] = field(default_factory=dict)

    def metadata(self) -> dict[str, str]:
        out = {f"capture.{k}": str(v) for k, v in vars(self).items() if k != "extra"}
        out.update(self.extra)
        return out


# -- decoding --------------------------------------------------------------------------------------
def block_hash64(value: object) -> int:
    """vLLM's ``ExternalBlockHash`` (bytes or int) in its 64-bit form."""
    if isinstance(value, bytes | bytearray):
        return int.from_bytes(value, "big") & _MASK64
    if isinstance(value, int) and not isinstance(value, bool):
        return value & _MASK64  # older servers publish Python hash() values, possibly negative
    raise ValueError(f"not a block hash: {value!r}")


_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
_KINDS = {"BlockStored": _STORED_FIELDS, "BlockRemoved": _REMOVED_FIELDS, "AllBlocksCleared": ()}


def _event(raw: object) -> dict[str, Any]:
    if isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
        kind, values = raw[0], list(raw[1:])
        if kind not in _KINDS:
            raise ValueError(f"unknown event type {kind!r}")
        names = _KINDS[kind]
        if kind == "BlockStored" and len(values) < 4:
            raise ValueError("BlockStored has fewer than 4 fields")
        event = dict(zip(names, values, strict=False))
    elif isinstance(raw, dict) and isinstance(raw.get("type"), str):
        kind = raw["type"]
        if kind not in _KINDS:
            raise ValueError(f"unknown event type {kind!r}")
        event = {k: raw.get(k) for k in _KINDS[kind]}
    else:
        raise ValueError("an event is neither [tag, ...] nor {'type': ...}")
    event["type"] = kind
    if kind != "AllBlocksCleared":
        hashes = event.get("block_hashes")
        if not isinstance(hashes, list):
            raise ValueError(f"{kind}.block_hashes is not a list")
        event["block_hashes"] = [block_hash64(h) for h in hashes]
    if kind == "BlockStored":
        parent = event.get("parent_block_hash")
        event["parent_block_hash"] = None if parent is None else block_hash64(parent)
        size = event.get("block_size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"BlockStored.block_size is {size!r}")
    return event


def decode_batch(seq: int, payload: bytes) -> Batch:
    """A msgpack ``KVEventBatch`` (array or map form); errors name the sequence number."""
    import msgpack

    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as err:  # msgpack raises several types (FormatError, ExtraData, ...)
        raise InputError(
            f"batch seq {seq}: not msgpack ({type(err).__name__})", option="--kv-events"
        ) from None
    try:
        if isinstance(raw, list | tuple) and len(raw) >= 2:
            ts, events = raw[0], raw[1]
        elif isinstance(raw, dict):
            ts, events = raw.get("ts"), raw.get("events")
        else:
            raise ValueError("not a [ts, events, ...] batch")
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not np.isfinite(ts):
            raise ValueError(f"batch ts is {ts!r}")
        if not isinstance(events, list):
            raise ValueError("batch events is not a list")
        return Batch(seq, float(ts), [_event(e) for e in events])
    except (ValueError, TypeError) as err:
        raise InputError(
            f"batch seq {seq}: not a KVEventBatch: {err}", option="--kv-events"
        ) from None


# -- subscribing -----------------------------------------------------------------------------------
def check_endpoint(endpoint: str) -> str:
    scheme, sep, rest = endpoint.partition("://")
    if scheme == "tcp" and sep:
        host, colon, port = rest.rpartition(":")
        if colon and host and port.isdigit() and 0 < int(port) < 65536:
            return endpoint
    elif scheme == "ipc" and sep and rest:
        return endpoint
    raise InputError(
        f"expected tcp://HOST:PORT (or ipc://PATH), got '{endpoint}'", option="--kv-events"
    )


def subscribe(
    endpoint: str,
    *,
    duration_s: float | None = None,
    max_events: int | None = None,
    topic: str = "",
    poll_ms: int = 100,
) -> tuple[list[Batch], int]:
    """Receive batches from vLLM's PUB socket until ``duration_s`` passes, ``max_events``
    events arrived or the user presses Ctrl-C; returns the batches and the number of batches
    missed (sequence gaps)."""
    import zmq

    check_endpoint(endpoint)
    if duration_s is None and max_events is None:
        raise InputError("give --duration or --max-events to end the capture", option="--kv-events")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    batches: list[Batch] = []
    missed = 0
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as err:
            raise InputError(f"cannot connect: {err}", option="--kv-events") from None
        deadline = None if duration_s is None else time.monotonic() + duration_s
        n_events, last_seq = 0, None
        while max_events is None or n_events < max_events:
            wait = poll_ms
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                wait = min(poll_ms, max(1, int(left * 1000)))
            try:
                if not sock.poll(wait, zmq.POLLIN):
                    continue
                frames = sock.recv_multipart()
            except KeyboardInterrupt:  # Ctrl-C ends the capture; what arrived is kept
                break
            if len(frames) != 3 or len(frames[1]) != 8:
                raise InputError(
                    f"expected (topic, seq, payload) frames, got {len(frames)} frames",
                    option="--kv-events",
                )
            seq = int.from_bytes(frames[1], "big", signed=True)
            if last_seq is not None and seq > last_seq + 1:
                missed += seq - last_seq - 1
            last_seq = seq if last_seq is None else max(last_seq, seq)
            batch = decode_batch(seq, frames[2])
            batches.append(batch)
            n_events += len(batch.events)
    finally:
        sock.close(0)
        ctx.term()
    return batches, missed


# -- reconstruction --------------------------------------------------------------------------------
@dataclass
class _Request:
    arrival: float
    tail: int  # last block of the request (prompt or output)
    last_ts: float
    prompt_tail: int
    output_blocks: int = 0


def requests_from_events(
    batches: Iterable[Batch],
    *,
    join_gap_s: float = DEFAULT_JOIN_GAP_S,
    source: str = "kv-events",
    missed_batches: int = 0,
) -> Trace:
    """Requests inferred from ``BlockStored`` chains (module docstring), as a trace at the
    server's block size."""
    if not join_gap_s >= 0:
        raise InputError(f"must be >= 0, got {join_gap_s}", option="--join-gap")
    stats = CaptureStats(missed_batches=missed_batches)
    parent_of: dict[int, int | None] = {}  # block -> parent, as first seen
    open_tail: dict[int, int] = {}  # last block of an open request -> its index
    requests: list[_Request] = []
    block_size: int | None = None
    ordered = sorted(batches, key=lambda b: (b.ts, b.seq))
    for batch in ordered:
        stats.batches += 1
        for ev in batch.events:
            kind = ev["type"]
            if kind == "AllBlocksCleared":
                stats.clears += 1
                open_tail.clear()
                continue
            if ev.get("medium") not in _GPU_MEDIA or ev.get("group_idx") not in (None, 0):
                stats.skipped_events += 1
                continue
            if kind == "BlockRemoved":
                stats.blocks_removed += len(ev["block_hashes"])
                continue
            hashes: list[int] = ev["block_hashes"]
            if not hashes:
                continue
            if block_size is None:
                block_size = ev["block_size"]
            elif ev["block_size"] != block_size:
                stats.skipped_events += 1
                continue
            stats.blocks_stored += len(hashes)
            parent = ev["parent_block_hash"]
            if parent is not None and parent not in parent_of:
                stats.unknown_parents += 1
                parent = None  # stored before the capture began: the chain starts here
            prev = parent
            for h in hashes:
                parent_of.setdefault(h, prev)
                prev = h
            owner = open_tail.pop(parent, None) if parent is not None else None
            req = requests[owner] if owner is not None else None
            if req is not None and len(hashes) == 1:
                req.output_blocks += 1
                stats.decode_blocks += 1
            elif req is not None and batch.ts - req.last_ts <= join_gap_s and not req.output_blocks:
                req.prompt_tail = hashes[-1]
            else:  # a new request (an extended one, if any, stays closed)
                req = _Request(batch.ts, hashes[-1], batch.ts, hashes[-1])
                requests.append(req)
                owner = len(requests) - 1
            req.tail, req.last_ts = hashes[-1], batch.ts
            open_tail[hashes[-1]] = owner
    if not requests or block_size is None:
        raise InputError(
            f"no BlockStored events in {stats.batches} batches: is the server's "
            "enable_kv_cache_events on and the endpoint right?",
            option="--kv-events",
        )
    chains = [_chain(parent_of, r.prompt_tail) for r in requests]
    counts = np.fromiter((len(c) for c in chains), dtype=np.int64, count=len(chains))
    offsets = np.zeros(len(chains) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    flat = [h for c in chains for h in c]
    arrivals = np.fromiter((r.arrival for r in requests), dtype=np.float64, count=len(requests))
    stats.extra["capture.block_size"] = str(block_size)
    return Trace.from_arrays(
        arrival_s=arrivals - arrivals.min(),
        input_tokens=counts * block_size,
        output_tokens=np.fromiter(
            (r.output_blocks * block_size for r in requests), dtype=np.int64, count=len(requests)
        ),
        hash_offsets=offsets,
        hashes=np.array(flat, dtype=np.uint64),
        block_tokens=block_size,
        source=source,
        extra_columns={"capture_ts": pa.array(arrivals)},
        metadata=stats.metadata(),
    )


def _chain(parent_of: dict[int, int | None], tail: int) -> list[int]:
    out = [tail]
    p = parent_of[tail]
    while p is not None:
        out.append(p)
        p = parent_of[p]
        if len(out) > len(parent_of):  # a cycle: only a 64-bit collision could make one
            raise InputError("block hashes form a cycle (hash collision?)", option="--kv-events")
    out.reverse()
    return out
