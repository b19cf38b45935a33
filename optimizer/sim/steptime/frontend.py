"""The front-end costs: what a client's TTFT holds besides the engine's iterations.

A benchmark client's TTFT counts the HTTP request, the tokenization, the scheduler picking the
request up, the first token's detokenization and the streamed response, none of which is in
the operator times or the roofline. Both step-time backends add these costs to every
request's first token and finish (:mod:`kvtier.sim.timing`, ``T_FRONTEND`` per request and
``T_FRONTEND_TOKEN`` per prompt token).

Per prompt token (docs/sources.md, "Front-end cost"): the tokenization of the prompt text,
43.7 ms for a prompt of about 38,000 tokens as TensorRT-LLM's input processor ran it
(TensorRT-LLM PR #18389, nsys on a GLM-5.2 context server), taken for every framework (each
tokenizes with a Hugging Face fast tokenizer before the engine sees the request); and, in vLLM,
the incremental detokenizer's priming: ``FastIncrementalDetokenizer`` starts its
``DecodeStream`` from the whole prompt (vLLM 0.22.0 and 0.34.0, ``v1/engine/detokenizer.py``),
which decodes it at the first generated token, on the API server's event loop, before that
token is sent: about 9 ms at 15,000 prompt tokens (vLLM PR #51281, tokenizers 0.22.2). SGLang's
detokenizer starts a few tokens before the answer, so it has no such term; TensorRT-LLM's was
not read and is left out. Neither figure was measured on the runs kvtier replays (their
tokenizers, texts and CPUs differ): the rates are of the right order, not exact.

Per request, the rest (calibration; ``kvtier validate serving`` shows it as a calibration row
and never counts it): NVIDIA's NIM 1.8.0 benchmark of Llama-3.3-70B fp8 TP2 on 2 x H100, 500
input tokens at concurrency 1, TTFT 47.77 ms; the measured backend's prefill of those 500
tokens (TensorRT-LLM data) and their tokenization leave the value below. The same software
path is assumed for every framework: no published concurrency-1 run separates vLLM's or
SGLang's front end from its prefill under conditions that can be replayed here, so they carry
TensorRT-LLM's figure.
"""

from __future__ import annotations

# TensorRT-LLM PR #18389 (2026-08-28): "tokenize prompt" 43.7 ms/request at ~38k-token prompts
TOKENIZE_S_PER_TOKEN = 43.7e-3 / 38_000
# vLLM PR #51281 (2026-08-06): DecodeStream priming "~9 ms 15K" prompt ids (tokenizers 0.22.2)
DETOKENIZER_PRIME_S_PER_TOKEN = 9e-3 / 15_000
# 47.77 ms published - 44.617 ms modelled (measured backend, no front end; kvtier validate
# serving: its FP8 weights and KV run at the tables' short-burst speed on the H100, whose FP8
# factor at the power limit is not measured, docs/model.md "Compute at the power limit") - the
# tokenization of its 500 prompt tokens, floored at 0 (a model whose engine alone took longer
# would leave nothing for the rest of the front end)
CALIBRATION_PROMPT_TOKENS = 500
CALIBRATION_MODELLED_S = 44.617e-3
FRONTEND_TRTLLM_S = max(
    0.0, 47.77e-3 - CALIBRATION_MODELLED_S - CALIBRATION_PROMPT_TOKENS * TOKENIZE_S_PER_TOKEN
)
FRONTEND_S: dict[str, float] = {
    "trtllm": FRONTEND_TRTLLM_S,
    "vllm": FRONTEND_TRTLLM_S,
    "sglang": FRONTEND_TRTLLM_S,
}
FRONTEND_TOKEN_S: dict[str, float] = {
    "trtllm": TOKENIZE_S_PER_TOKEN,
    "vllm": TOKENIZE_S_PER_TOKEN + DETOKENIZER_PRIME_S_PER_TOKEN,
    "sglang": TOKENIZE_S_PER_TOKEN,
}


def frontend_s(framework: str) -> float:
    """Seconds per request outside the engine for ``framework`` (0 for one not listed)."""
    return FRONTEND_S.get(framework, 0.0)


def frontend_token_s(framework: str) -> float:
    """Seconds per prompt token outside the engine for ``framework`` (0 for one not listed)."""
    return FRONTEND_TOKEN_S.get(framework, 0.0)
