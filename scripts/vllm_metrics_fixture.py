"""Write tests/data/vllm-metrics/vllm-0.34.0-offload.txt: a /metrics scrape as vLLM 0.34.0 shows it.

The metrics are declared exactly as vLLM 0.34.0 declares them (names, help strings, label names,
bucket boundaries: ``vllm/v1/metrics/loggers.py``, ``vllm/v1/metrics/buckets.py``,
``vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py`` of the released wheel)
with the same ``prometheus_client`` classes vLLM uses, for a server with two engines and the
OffloadingConnector, then fed fixed observations; the text is what ``generate_latest`` prints,
as vLLM's ``/metrics`` endpoint does. Run: python scripts/vllm_metrics_fixture.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    generate_latest,
)

from kvtier.trace.vllm_metrics import ITL_BUCKETS, TRANSFER_SIZE_BUCKETS, TTFT_BUCKETS

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "vllm-metrics"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LABELS = ["model_name", "engine"]


def main() -> None:
    reg = CollectorRegistry()
    # the interpreter's own collectors, as on prometheus_client's default registry; the cache
    # configuration as loggers.py's log_metrics_info writes it (a gauge set to 1), with a
    # subset of CacheConfig's labels
    GCCollector(registry=reg)
    PlatformCollector(registry=reg)
    info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                 ["block_size", "cache_dtype", "enable_prefix_caching", "engine"],
                 registry=reg)  # fmt: skip
    info.labels("16", "auto", "True", "0").set(1)
    rng = np.random.default_rng(7)
    running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                    LABELS, registry=reg)  # fmt: skip
    usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                  LABELS, registry=reg)  # fmt: skip
    queries = Counter("vllm:prefix_cache_queries",
                      "Prefix cache queries, in terms of number of queried tokens.",
                      LABELS, registry=reg)  # fmt: skip
    hits = Counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        LABELS,
        registry=reg,
    )
    ext_q = Counter(
        "vllm:external_prefix_cache_queries",
        "External prefix cache queries from KV connector cross-instance cache "
        "sharing, in terms of number of queried tokens.",
        LABELS,
        registry=reg,
    )
    ext_h = Counter(
        "vllm:external_prefix_cache_hits",
        "External prefix cache hits from KV connector cross-instance cache sharing, "
        "in terms of number of cached tokens.",
        LABELS,
        registry=reg,
    )
    prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", LABELS,
                     registry=reg)  # fmt: skip
    gen = Counter("vllm:generation_tokens", "Number of generation tokens processed.", LABELS,
                  registry=reg)  # fmt: skip
    success = Counter("vllm:request_success", "Count of successfully processed requests.",
                      LABELS + ["finished_reason"], registry=reg)  # fmt: skip
    ttft = Histogram("vllm:time_to_first_token_seconds",
                     "Histogram of time to first token in seconds.", LABELS,
                     buckets=TTFT_BUCKETS, registry=reg)  # fmt: skip
    itl = Histogram("vllm:inter_token_latency_seconds",
                    "Histogram of inter-token latency in seconds.", LABELS,
                    buckets=ITL_BUCKETS, registry=reg)  # fmt: skip
    tpot = Histogram("vllm:request_time_per_output_token_seconds",
                     "Histogram of time_per_output_token_seconds per request.", LABELS,
                     buckets=ITL_BUCKETS, registry=reg)  # fmt: skip
    load_bytes = Counter(
        "vllm:kv_offload_load_bytes",
        "Total bytes loaded from offload storage to GPU.",
        LABELS,
        registry=reg,
    )
    load_time = Counter("vllm:kv_offload_load_time",
                        "Total load time from offload storage to GPU, in seconds.", LABELS,
                        registry=reg)  # fmt: skip
    load_size = Histogram("vllm:kv_offload_load_size",
                          "Histogram of KV offload load operation size, in bytes.", LABELS,
                          buckets=TRANSFER_SIZE_BUCKETS, registry=reg)  # fmt: skip
    for engine in ("0", "1"):
        lv = (MODEL, engine)
        running.labels(*lv).set(3)
        usage.labels(*lv).set(0.41)
        for _ in range(50):
            n_in, n_out = int(rng.integers(200, 4000)), int(rng.integers(20, 200))
            hit = int(rng.integers(0, n_in // 16)) * 16
            queries.labels(*lv).inc(n_in)
            hits.labels(*lv).inc(hit)
            ext_q.labels(*lv).inc(n_in - hit)
            ext_h.labels(*lv).inc((n_in - hit) // 32 * 16)
            prompt.labels(*lv).inc(n_in)
            gen.labels(*lv).inc(n_out)
            success.labels(*lv, "length" if n_out % 3 else "stop").inc()
            ttft.labels(*lv).observe(0.02 + n_in * 4e-5)
            gaps = rng.gamma(4.0, 0.004, n_out - 1)
            for g in gaps:
                itl.labels(*lv).observe(float(g))
            tpot.labels(*lv).observe(float(gaps.mean()))
            size = float(rng.integers(2, 80)) * 1e6
            load_bytes.labels(*lv).inc(size)
            load_time.labels(*lv).inc(size / 20e9 + 1e-4)
            load_size.labels(*lv).observe(size)
        for reason in ("abort", "error", "repetition"):
            success.labels(*lv, reason)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "vllm-0.34.0-offload.txt").write_bytes(generate_latest(reg))


if __name__ == "__main__":
    main()
