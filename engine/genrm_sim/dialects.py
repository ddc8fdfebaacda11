"""The request/response shapes the engine speaks: SGLang native and OpenAI generation, and
SGLang's reward-model classification (``/classify``, ``/v1/classify``).

Why: a judge client may use any of them and the gateway proxies them all, so the simulator must
reproduce each one's field names, defaults, streaming framing and refusals (SGLang rejects unknown
``sampling_params`` keys with 400); the generation underneath is shared.
"""

from __future__ import annotations

import math
import time
import uuid
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from genrm_sim import contract
from genrm_sim.answers import DEFAULT_MAX_NEW_TOKENS, SamplingParams
from genrm_sim.model import Timeline

JSON = dict[str, Any]

# SGLang's documented default when --enable-deterministic-inference is on and no seed is given.
DETERMINISTIC_DEFAULT_SEED = 42
DEFAULT_MODEL_NAME = "default"
"""The ``model`` SGLang's OpenAI request models fill in (and answer under) when the client sends none."""


class BadRequest(ValueError):
    """The body does not describe a request this API accepts (HTTP 400)."""


class EarlyRefusal(BadRequest):
    """Refused before SGLang's route runs, so never as an event of an already open stream."""


class SchemaError(EarlyRefusal):
    """The body is not what the route's pydantic model takes (malformed JSON, not an object, a field of
    the wrong type, a required one missing): FastAPI's validation error, which SGLang's handler
    answers on every route in OpenAI's ``ErrorResponse`` shape with type ``Bad Request``."""


class ContractError(EarlyRefusal):
    """The body breaks SGLang's ``/generate`` schema (checked before anything else, own 400 shape)."""


def openai_error(exc: ValueError) -> JSON:
    """OpenAI's ``ErrorResponse``: ``Bad Request`` for a validation error, ``BadRequestError`` for a
    refusal of SGLang's serving code (ranges, context length, duplicate id, empty messages)."""
    kind = "Bad Request" if isinstance(exc, SchemaError) else "BadRequestError"
    return {"object": "error", "message": str(exc), "type": kind, "param": None, "code": 400}


def native_error(exc: ValueError) -> JSON:
    """A native route's 400 body: the validation error's, the schema check's ``{"error": text}``, or
    the tokenizer manager's ``{"error": {"message": ...}}``."""
    if isinstance(exc, SchemaError):
        return openai_error(exc)
    if isinstance(exc, ContractError):
        return {"error": str(exc)}
    return {"error": {"message": str(exc)}}


def require(valid: bool, name: str, expected: str) -> None:
    """A validation error about field ``name`` unless ``valid`` (the wording is the simulator's, not
    pydantic's)."""
    if not valid:
        raise SchemaError(f"1 validation error: {name}: {expected}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _ints(value: object) -> bool:
    return isinstance(value, list) and all(_is_int(i) for i in value)


def _unknown_field(key: str, fields: list[str]) -> ContractError:
    """SGLang's (serde's) text for a key outside a strict schema."""
    listed = ", ".join(f"`{f}`" for f in fields)
    return ContractError(f"unknown field `{key}`, expected one of {listed}")


_SCALAR_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "number": (int, float), "bool": (bool,), "str": (str,)}


def _unexpected(value: object) -> str:
    """serde's ``Unexpected`` wording, as SGLang's ``api_types._unexpected`` renders it."""
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    return "sequence" if isinstance(value, list) else "map" if isinstance(value, dict) else type(value).__name__


def _strict_sampling_params(sampling: JSON) -> None:
    """SGLang's schema check of ``sampling_params`` (``decode_SamplingParams``): keys in order, an
    unknown one or a scalar of the wrong JSON type is a 400 with serde's text (null means the
    default)."""
    known, types = contract.load().sampling_params, contract.load().sampling_param_types
    for key, value in sampling.items():
        if key not in known:
            raise _unknown_field(key, sorted(known))
        kind = types.get(key)
        if kind is None or value is None:
            continue
        allowed = _SCALAR_TYPES[kind[0]]
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise ContractError(f"invalid type: {_unexpected(value)}, expected {kind[1]}")


_SAMPLING_EPS = 1e-6
"""SGLang's ``_SAMPLING_EPS``: a temperature below it is greedy (top-k 1)."""


def verify_sampling(sampling: JSON) -> None:
    """SGLang's ``SamplingParams.__post_init__`` and ``verify`` for the keys that have ranges, with
    its messages (a ``ValueError`` in the tokenizer manager: 400 ``{"error": {"message": ...}}``)."""
    def get(key: str, default: Any) -> Any:
        value = sampling.get(key)
        return default if value is None else value

    temperature, top_p, top_k = get("temperature", 1.0), get("top_p", 1.0), get("top_k", -1)
    min_p, min_new = get("min_p", 0.0), get("min_new_tokens", 0)
    if 0 <= temperature < _SAMPLING_EPS:
        temperature, top_k = 1.0, 1
    if top_k == -1:
        top_k = 1 << 30
    beam_width = sampling.get("beam_width")
    if beam_width is not None and beam_width < 1:
        raise BadRequest(f"beam_width must be at least 1, got {beam_width}.")
    if not math.isfinite(temperature) or temperature < 0.0:
        raise BadRequest(f"temperature must be a non-negative finite number, got {temperature}.")
    if not 0.0 < top_p <= 1.0:
        raise BadRequest(f"top_p must be in (0, 1], got {top_p}.")
    if not 0.0 <= min_p <= 1.0:
        raise BadRequest(f"min_p must be in [0, 1], got {min_p}.")
    if top_k < 1 or top_k == -1:
        raise BadRequest(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    for key in ("frequency_penalty", "presence_penalty"):
        if not -2.0 <= get(key, 0.0) <= 2.0:
            raise BadRequest(f"{key} must be in [-2, 2], got {get(key, 0.0)}.")
    repetition = get("repetition_penalty", 1.0)
    if not 0.0 < repetition <= 2.0:
        raise BadRequest(f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {repetition}.")
    if not 0 <= min_new:
        raise BadRequest(f"min_new_tokens must be in [0, max_new_tokens], got {min_new}.")
    max_new = sampling.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if max_new is not None:
        if max_new < 0:
            raise BadRequest(f"max_new_tokens must be at least 0, got {max_new}.")
        if not min_new <= max_new:
            raise BadRequest(f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {min_new}.")


@dataclass(frozen=True)
class Call:
    """One parsed request: what to answer and how to frame the answer."""

    rid: str | None
    prompt: object
    params: SamplingParams
    stream: bool
    include_usage: bool
    model: str
    members: tuple[Call, ...] = ()
    """A batched ``/generate``: one call per prompt, each under its own rid (empty otherwise)."""
    requested_max_new_tokens: int | None = None
    """The output length the client asked for, if it did (SGLang checks the context length only then)."""


@dataclass(frozen=True)
class Outcome:
    """The finished (or partial) generation that a response reports."""

    rid: str
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    output_ids: tuple[int, ...] = ()
    timeline: Timeline = field(default_factory=Timeline)


VOCABULARY = 32000
"""The size of the stand-in vocabulary ``token_id`` maps into."""


def token_id(token: str) -> int:
    """A stable stand-in id for a generated token (the simulator has no vocabulary)."""
    return zlib.crc32(token.encode()) % VOCABULARY


def _number(body: JSON, name: str, default: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    require(_is_number(value), name, "a number")
    return float(value)


def _seed(value: object, deterministic: bool) -> int | None:
    if value is None:
        return DETERMINISTIC_DEFAULT_SEED if deterministic else None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError("1 validation error: seed: an integer")
    return value


def _rid(body: JSON) -> str | None:
    rid = body.get("rid")
    return rid if isinstance(rid, str) else None


def _batch(prompt: object) -> list[object] | None:
    """The prompts of a batched ``/generate`` (SGLang's ``_determine_batch_size``: a list of texts,
    or a list of token-id lists), else None."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return list(prompt)
    return None


def _member_rids(given: object, size: int) -> list[str]:
    """SGLang's ``_normalize_rid``: a fresh id per prompt, ``<rid>_<i>`` for one string, or the
    client's list, which must have one id per prompt."""
    if given is None:
        return [uuid.uuid4().hex for _ in range(size)]
    if isinstance(given, str):
        return [f"{given}_{i}" for i in range(size)]
    if isinstance(given, list) and all(isinstance(item, str) for item in given):
        if len(given) != size:
            raise BadRequest("The specified rids length mismatch with the batch_size for batch processing.")
        return list(given)
    raise BadRequest("The rid should be a string or a list of strings.")


class Dialect(ABC):
    """Parses requests and renders responses for one route."""

    finish_in_last_token = False
    """Whether the chunk of the last token carries the finish reason (else a closing chunk does)."""
    errors_in_stream = False
    """Whether a streamed request's refusals past the schema check come as a 200 stream's error event."""

    def __init__(self, weight_version: str = "default", metrics: bool = False) -> None:
        self.weight_version = weight_version
        self.metrics = metrics
        """SGLang's ``--enable-metrics``: its responses then carry the request's timings."""

    @abstractmethod
    def parse(self, body: JSON, model: str, deterministic: bool) -> Call: ...

    @abstractmethod
    def response(self, call: Call, outcome: Outcome) -> JSON: ...

    @abstractmethod
    def chunk(self, call: Call, outcome: Outcome, delta: str) -> JSON: ...

    def error(self, exc: ValueError) -> JSON:
        """The body of a 400 (OpenAI's ``ErrorResponse`` shape; the native routes override it)."""
        return openai_error(exc)

    def opening_chunks(self, call: Call, outcome: Outcome) -> list[JSON]:
        """Chunks sent before the first token's."""
        return []

    @abstractmethod
    def closing_chunks(self, call: Call, outcome: Outcome, reported: bool) -> list[JSON]:
        """Chunks sent after the last token, before ``[DONE]``; ``reported``: the last token's chunk
        carried the finish reason already."""

    def _versions(self, outcome: Outcome) -> list[JSON]:
        """SGLang's ``weight_versions``: which weights produced which output tokens (one span here)."""
        return [{"version": self.weight_version, "start": 0, "end": outcome.completion_tokens}]


class NativeGenerate(Dialect):
    """SGLang ``/generate``: ``text``/``input_ids`` + ``sampling_params``; streams cumulative text."""

    def parse(self, body: JSON, model: str, deterministic: bool) -> Call:
        text, ids, sampling, rid = (body.get(k) for k in ("text", "input_ids", "sampling_params", "rid"))
        # GenerateReqInput's field types (FastAPI validates them before the route runs)
        require(text is None or isinstance(text, str) or (isinstance(text, list)
                                                          and all(isinstance(t, str) for t in text)),
                "text", "a string or a list of strings")
        require(ids is None or _ints(ids) or (isinstance(ids, list) and all(_ints(i) for i in ids)),
                "input_ids", "a list of integers or a list of lists of integers")
        require(sampling is None or isinstance(sampling, dict) or (isinstance(sampling, list) and all(
            isinstance(item, dict) for item in sampling)), "sampling_params", "an object or a list of objects")
        require(rid is None or isinstance(rid, str) or (isinstance(rid, list) and all(
            isinstance(r, str) for r in rid)), "rid", "a string or a list of strings")
        samplings: list[JSON] = sampling if isinstance(sampling, list) else [sampling or {}]
        for item in samplings:
            _strict_sampling_params(item)
        prompt = text if text is not None else ids
        if prompt is None:
            raise BadRequest("Either text, input_ids or input_embeds should be provided.")
        for item in samplings:
            verify_sampling(item)
        stream = bool(body.get("stream"))
        prompts = _batch(prompt)
        if prompts is None:
            return Call(_rid(body), prompt, self._params(samplings[0], deterministic), stream, False, model,
                        requested_max_new_tokens=samplings[0].get("max_new_tokens"))
        rids = _member_rids(rid, len(prompts))
        if len(samplings) not in (1, len(prompts)):
            raise BadRequest("sampling_params must be an object or one per prompt")
        members = tuple(Call(rid, item, self._params(samplings[i % len(samplings)], deterministic), stream, False,
                             model, requested_max_new_tokens=samplings[i % len(samplings)].get("max_new_tokens"))
                        for i, (rid, item) in enumerate(zip(rids, prompts, strict=True)))
        return Call(None, prompt, members[0].params, stream, False, model, members)

    @staticmethod
    def _params(sampling: JSON, deterministic: bool) -> SamplingParams:
        return SamplingParams(
            temperature=_number(sampling, "temperature", 1.0),
            top_p=_number(sampling, "top_p", 1.0),
            top_k=int(_number(sampling, "top_k", -1)),
            max_new_tokens=int(_number(sampling, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS)),
            sampling_seed=_seed(sampling.get("sampling_seed"), deterministic),
            ignore_eos=sampling.get("ignore_eos") is True,
        )

    def response(self, call: Call, outcome: Outcome) -> JSON:
        return {"text": outcome.text, "output_ids": list(outcome.output_ids), "meta_info": self._meta(outcome)}

    def error(self, exc: ValueError) -> JSON:
        return native_error(exc)

    errors_in_stream = True
    """SGLang's ``/generate`` opens a stream before its tokenizer manager validates the request
    (``stream_results`` in ``http_server.py``): only the schema check is a plain 400."""
    finish_in_last_token = True
    """SGLang's native stream ends with the last token's chunk, its ``finish_reason`` set; an
    aborted request's last chunk is the abort's (``finish_reason.type`` ``abort``)."""

    def chunk(self, call: Call, outcome: Outcome, delta: str) -> JSON:
        """SGLang streams the cumulative text, so a chunk is the response so far."""
        return self.response(call, outcome)

    def closing_chunks(self, call: Call, outcome: Outcome, reported: bool) -> list[JSON]:
        return [] if reported else [self.response(call, outcome)]

    def _meta(self, outcome: Outcome) -> JSON:
        """``meta_info`` as SGLang's tokenizer manager builds it (``_handle_batch_output``): counts,
        weight version, no cache hits and, under ``--enable-metrics``, the request's timings; a
        finished request adds its spans and latencies; a stream's first chunk when it was sent."""
        times, finished = outcome.timeline, outcome.finish_reason is not None
        meta: JSON = {"id": outcome.rid, "finish_reason": _finish(outcome), "prompt_tokens": outcome.prompt_tokens,
                      "weight_version": self.weight_version, "num_retractions": 0}
        if self.metrics:
            meta |= {"storage_prefetch_wait": 0.0, "storage_staging_wait": 0.0}
            meta |= {k: v for k, v in (("forward_entry_time", times.scheduled),
                                       ("prefill_finished_time", times.first_token)) if v}
            meta["queue_time"] = max(0.0, times.scheduled - times.received) if times.scheduled else 0.0
        meta |= {"reasoning_tokens": 0, "completion_tokens": outcome.completion_tokens, "cached_tokens": 0}
        if finished:
            meta["weight_versions"] = self._versions(outcome)
        meta |= {"cached_tokens_details": None, "dp_rank": None}
        now = time.time()
        if finished:
            meta["e2e_latency"] = (times.finished or now) - times.received
            if self.metrics:
                meta |= {"request_received_ts": times.received, "api_server_dispatch_finish_ts": times.received}
                if times.first_token:
                    meta["first_token_latency"] = times.first_token - times.received
                    decode = (times.finished or now) - times.first_token
                    if decode > 0 and outcome.completion_tokens > 1:
                        meta["decode_throughput"] = (outcome.completion_tokens - 1) / decode
                meta["request_finished_ts"] = times.finished or now
            meta["response_sent_to_client_ts"] = now
        elif outcome.completion_tokens == 1:
            meta["response_sent_to_client_ts"] = now
        return meta


EOS_TOKEN_ID = 2
"""The end-of-sequence token a ``stop`` finish reports as matched (the simulator has no vocabulary)."""


def _finish(outcome: Outcome) -> JSON | None:
    """``meta_info.finish_reason`` as SGLang's ``BaseFinishReason.to_json``: ``FINISH_MATCHED_TOKEN``,
    ``FINISH_LENGTH`` (the length reached) or ``FINISH_ABORT`` (``/abort_request`` gives no message,
    so SGLang's ``Aborted`` and no status code)."""
    if outcome.finish_reason == "stop":
        return {"type": "stop", "matched": EOS_TOKEN_ID}
    if outcome.finish_reason == "length":
        return {"type": "length", "length": outcome.completion_tokens}
    if outcome.finish_reason == "abort":
        return {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
    return None


_OPENAI_NUMBERS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                   "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
                   "repetition_penalty": "repetition_penalty", "min_tokens": "min_new_tokens"}
"""OpenAI body fields SGLang hands to ``SamplingParams`` (and so to ``verify``), by their sampling name."""


class _OpenAI(Dialect):
    """Fields shared by the OpenAI-compatible routes."""

    object_name: str
    chunk_object_name: str
    default_max_tokens: int
    default_requested: int | None = None
    """The ``max_tokens`` SGLang's OpenAI request model fills in when the client sends none."""

    def parse(self, body: JSON, model: str, deterministic: bool) -> Call:
        """The request model's field types (a validation error), then SGLang's serving checks:
        the prompt, ``SamplingParams.verify``'s ranges."""
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        require(max_tokens is None or _is_int(max_tokens), "max_tokens", "an integer")
        require(isinstance(body.get("model", ""), str), "model", "a string")
        given = {key: body[key] for key in _OPENAI_NUMBERS if body.get(key) is not None}
        for key, value in given.items():
            require(_is_number(value), key, "a number")
        sampling = {_OPENAI_NUMBERS[key]: value for key, value in given.items()}
        prompt = self.prompt(body)
        verify_sampling(sampling | ({} if max_tokens is None else {"max_new_tokens": max_tokens}))
        params = SamplingParams(
            temperature=float(sampling.get("temperature", 1.0)),
            top_p=float(sampling.get("top_p", 1.0)),
            top_k=int(sampling.get("top_k", -1)),
            max_new_tokens=max_tokens if max_tokens is not None else self.default_max_tokens,
            sampling_seed=_seed(body.get("seed", body.get("sampling_seed")), deterministic),
            ignore_eos=body.get("ignore_eos") is True,
        )
        options = body.get("stream_options") or {}
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        requested = max_tokens if max_tokens is not None else self.default_requested
        return Call(_rid(body), prompt, params, bool(body.get("stream")), include_usage,
                    body.get("model", DEFAULT_MODEL_NAME), requested_max_new_tokens=requested)

    @abstractmethod
    def prompt(self, body: JSON) -> object: ...

    @abstractmethod
    def choice(self, text: str | None, outcome: Outcome, streaming: bool) -> JSON: ...

    def _envelope(self, call: Call, outcome: Outcome, object_name: str, choices: list[JSON]) -> JSON:
        """SGLang answers under the model name the request gave, whatever it serves."""
        return {
            "id": outcome.rid,
            "object": object_name,
            "created": int(time.time()),
            "model": call.model,
            "choices": choices,
        }

    @staticmethod
    def _usage(outcome: Outcome, details: bool = True) -> JSON:
        counts = {"prompt_tokens": outcome.prompt_tokens,
                  "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
                  "completion_tokens": outcome.completion_tokens}
        if not details:
            return counts | {"reasoning_tokens": 0}
        return counts | {"prompt_tokens_details": None, "reasoning_tokens": 0, "completion_tokens_details": None}

    def response(self, call: Call, outcome: Outcome) -> JSON:
        choice = self.choice(outcome.text, outcome, streaming=False)
        return self._envelope(call, outcome, self.object_name, [choice]) | {
            "usage": self._usage(outcome),
            "metadata": {"weight_version": self.weight_version, "weight_versions": self._versions(outcome)}}

    def chunk(self, call: Call, outcome: Outcome, delta: str) -> JSON:
        return self._envelope(call, outcome, self.chunk_object_name, [self.choice(delta, outcome, streaming=True)])

    def _usage_chunks(self, call: Call, outcome: Outcome, details: bool) -> list[JSON]:
        if not call.include_usage:
            return []
        return [self._envelope(call, outcome, self.chunk_object_name, []) | {"usage": self._usage(outcome, details)}]


def _matched(outcome: Outcome) -> int | None:
    return EOS_TOKEN_ID if outcome.finish_reason == "stop" else None


class ChatCompletions(_OpenAI):
    """``/v1/chat/completions``; a stream opens with the role's chunk and closes with the finish
    reason's, which carries no content (SGLang's ``serving_chat``)."""

    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"
    default_max_tokens = DEFAULT_MAX_NEW_TOKENS

    def prompt(self, body: JSON) -> object:
        messages = body.get("messages")
        require(messages is not None, "messages", "Field required")
        require(isinstance(messages, list), "messages", "a list")
        if not messages:
            raise BadRequest("Messages cannot be empty.")
        return messages

    def choice(self, text: str | None, outcome: Outcome, streaming: bool) -> JSON:
        message: JSON = {"role": "assistant", "content": text, "reasoning_content": None}
        if streaming:
            message = {"reasoning_content": None} if text is None else {"reasoning_content": None, "content": text}
        return {"index": 0, "delta" if streaming else "message": message, "logprobs": None,
                "finish_reason": outcome.finish_reason, "matched_stop": _matched(outcome)}

    def opening_chunks(self, call: Call, outcome: Outcome) -> list[JSON]:
        role = {"index": 0, "delta": {"reasoning_content": None, "role": "assistant", "content": ""},
                "logprobs": None, "finish_reason": None, "matched_stop": None}
        return [self._envelope(call, outcome, self.chunk_object_name, [role])]

    def closing_chunks(self, call: Call, outcome: Outcome, reported: bool) -> list[JSON]:
        finish = self._envelope(call, outcome, self.chunk_object_name, [self.choice(None, outcome, streaming=True)])
        return [finish, *self._usage_chunks(call, outcome, details=True)]


class Completions(_OpenAI):
    """``/v1/completions``; a stream's chunks carry ``usage: null`` and the last token's the finish
    reason (SGLang's ``serving_completions``)."""

    object_name = "text_completion"
    chunk_object_name = "text_completion"
    default_max_tokens = 16
    default_requested = 16
    finish_in_last_token = True

    def prompt(self, body: JSON) -> object:
        prompt = body.get("prompt")
        require(prompt is not None, "prompt", "Field required")
        return prompt

    def choice(self, text: str | None, outcome: Outcome, streaming: bool) -> JSON:
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": outcome.finish_reason,
                "matched_stop": _matched(outcome)}

    def chunk(self, call: Call, outcome: Outcome, delta: str) -> JSON:
        return super().chunk(call, outcome, delta) | {"usage": None}

    def closing_chunks(self, call: Call, outcome: Outcome, reported: bool) -> list[JSON]:
        finish = [] if reported else [self.chunk(call, outcome, "")]
        return [*finish, *self._usage_chunks(call, outcome, details=False)]


@dataclass(frozen=True)
class ClassifyCall:
    """One parsed ``/classify`` or ``/v1/classify`` request (a single input or a batch)."""

    rid: str | None
    inputs: tuple[object, ...]
    batch: bool
    model: str
    rids: tuple[str, ...] = ()
    """A batch's own request ids, one per input."""


def parse_classify(body: JSON, model: str, openai: bool) -> ClassifyCall:
    """``/classify`` takes SGLang's embedding input (``text`` or ``input_ids``); ``/v1/classify`` ``input``."""
    value = body.get("input") if openai else body.get("text", body.get("input_ids"))
    if value is None:
        raise BadRequest("input is required" if openai else "either text or input_ids is required")
    batch = isinstance(value, list) and bool(value) and not all(isinstance(t, int) for t in value)
    given = body.get("rid")
    rids = tuple(str(r) for r in given) if isinstance(given, list) else ()
    if batch and rids and len(rids) != len(value):
        raise BadRequest("The specified rids length mismatch with the batch_size for batch processing.")
    return ClassifyCall(_rid(body), tuple(value) if batch else (value,), batch, str(body.get("model") or model), rids)


def classify_response(call: ClassifyCall, rids: list[str], scores: list[float], prompt_tokens: list[int],
                      openai: bool) -> JSON | list[JSON]:
    """Native: the raw score as a one-element ``embedding``. OpenAI: SGLang's softmax over the labels,
    which for a one-label reward model is always ``[1.0]`` (so reward clients use the native route)."""
    if openai:
        return {
            "id": f"classify-{rids[0]}", "object": "list", "created": int(time.time()), "model": call.model,
            "data": [{"index": i, "label": "LABEL_0", "probs": [1.0], "num_classes": 1} for i in range(len(scores))],
            "usage": {"prompt_tokens": sum(prompt_tokens), "completion_tokens": 0,
                      "total_tokens": sum(prompt_tokens)},
        }
    items = [{"embedding": [score], "meta_info": {"id": rid, "prompt_tokens": tokens, "finish_reason": None}}
             for rid, score, tokens in zip(rids, scores, prompt_tokens, strict=True)]
    return items if call.batch else items[0]
