"""The per-request front-end cost: what a client's TTFT holds besides the engine's iterations.

A benchmark client's TTFT counts the HTTP request, the tokenization, the scheduler picking the
request up, the first token's detokenization and the streamed response, none of which is in
the operator times or the roofline. Both step-time backends add this cost to every request's
first token and finish (:mod:`kvtier.sim.timing`, ``T_FRONTEND``).

Calibration (docs/sources.md, "Front-end cost"; ``kvtier validate serving`` shows it as a
calibration row and never counts it): NVIDIA's NIM 1.8.0 benchmark of Llama-3.3-70B fp8 TP2 on
2 x H100, 500 input tokens at concurrency 1, TTFT 47.77 ms; the measured backend's prefill of
those 500 tokens (TensorRT-LLM data) leaves the value below. The same software path is assumed
for every framework: no published concurrency-1 run separates vLLM's or SGLang's front end from
its prefill under conditions that can be replayed here, so they carry TensorRT-LLM's figure.
"""

from __future__ import annotations

# 47.77 ms published - 44.617 ms modelled (measured backend, fe = 0; kvtier validate serving)
FRONTEND_TRTLLM_S = 3.15e-3
FRONTEND_S: dict[str, float] = {
    "trtllm": FRONTEND_TRTLLM_S,
    "vllm": FRONTEND_TRTLLM_S,
    "sglang": FRONTEND_TRTLLM_S,
}


def frontend_s(framework: str) -> float:
    """Seconds per request outside the engine for ``framework`` (0 for one not listed)."""
    return FRONTEND_S.get(framework, 0.0)
