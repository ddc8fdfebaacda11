"""One call driven as the clients drive it, without I/O: the same request id on every attempt,
retries counted by cause, the verdict or the typed error at the end."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable

import pytest
from genrm_client import calls
from genrm_client.call import Send, Sleep, attempts
from genrm_client.errors import BadAnswer, EngineFailed, JudgeError, MixedJudges, Refused, RevisionRetired
from genrm_client.retry import Answer, Broken, Failure, Outcome, RetryPolicy
from genrm_client.verdict import Verdict

DRAINING = Answer(503, {"x-genrm-reason": "draining", "x-should-retry": "true", "retry-after": "1"}, b"{}")
FULL = Answer(503, {"x-genrm-reason": "holdQueueFull", "x-should-retry": "true", "retry-after": "1"}, b"{}")
CHAT = {"choices": [{"message": {"content": "Score: 7"}}], "metadata": {"weight_version": "rev-a"}}


def ok(body: object, **headers: str) -> Answer:
    return Answer(200, headers, json.dumps(body).encode())


def drive(outcomes: Iterable[Outcome], request: calls.JudgeRequest | None = None,
          ) -> tuple[Verdict | JudgeError, list[Send], list[Sleep]]:
    """Run one call over scripted outcomes, with a clock that advances by the waits."""
    now = [0.0]
    plan = attempts(request or calls.chat([{"role": "user", "content": "judge"}]), RetryPolicy(), random.Random(1),
                    clock=lambda: now[0], wall=lambda: 0.0)
    sends: list[Send] = []
    sleeps: list[Sleep] = []
    script = iter(outcomes)
    reply: Outcome | None = None
    try:
        while True:
            action = plan.send(reply)
            if isinstance(action, Sleep):
                sleeps.append(action)
                now[0] += action.seconds
                reply = None
            else:
                sends.append(action)
                reply = next(script)
    except StopIteration as done:
        return done.value, sends, sleeps
    except JudgeError as error:
        return error, sends, sleeps


def test_every_attempt_carries_the_same_request_and_id() -> None:
    request = calls.generate("judge this", sampling_params={"max_new_tokens": 8})
    verdict, sends, _ = drive([Failure(Broken.CONNECT, "refused"), DRAINING, Failure(Broken.CLOSED, "closed"),
                               ok({"text": "7", "meta_info": {"weight_version": "rev-a"}})], request)
    assert isinstance(verdict, Verdict)
    assert [s.request for s in sends] == [request] * 4 and [s.attempt for s in sends] == [1, 2, 3, 4]
    assert verdict.request_id == request.id and verdict.attempts == 4
    assert verdict.retries == {"connect": 1, "unavailable": 1, "closed": 1}
    assert verdict.text == "7" and verdict.revision == "rev-a"
    assert verdict.latency_s >= 1.0, "the latency counts the waits"


def test_an_overload_retry_says_so_when_it_waits() -> None:
    _, _, sleeps = drive([FULL, ok(CHAT)])
    assert [s.cause for s in sleeps] == ["overload"] and sleeps[0].seconds >= 1.0


def test_a_failure_is_an_error_with_the_calls_history_never_a_number() -> None:
    error, sends, _ = drive([DRAINING, Answer(502, {"x-genrm-reason": "engineDisconnected"},
                                                    b'{"error": {"message": "died"}}')])
    assert isinstance(error, EngineFailed) and error.status == 502 and error.reason == "engineDisconnected"
    assert error.request_id == sends[0].request.id and error.attempts == 2 and error.retries == {"unavailable": 1}
    assert "died" in str(error) and sends[0].request.id in str(error)


def test_a_4xx_is_refused_at_once() -> None:
    error, sends, _ = drive([Answer(401, {"x-genrm-reason": "invalidApiKey", "x-should-retry": "false"}, b"{}")])
    assert isinstance(error, Refused) and error.status == 401 and len(sends) == 1


def test_a_retired_revision_is_its_own_error_at_once_and_a_judge_switch_is_retried() -> None:
    """A pinned call that the pool refuses ``revisionRetired`` (the pin's judge is gone) ends at once with
    the pool's words, which name both revisions; a replica fenced by the switch is retried like a
    draining one (its next connection reaches the new judge)."""
    message = "judge revision 3f9a is retired: the pool's judge changed to 4b1e"
    retired = Answer(409, {"x-genrm-reason": "revisionRetired", "x-should-retry": "false"},
                     json.dumps({"error": {"reason": "revisionRetired", "code": 409, "message": message}}).encode())
    switched = Answer(503, {"x-genrm-reason": "judgeSwitched", "x-should-retry": "true", "retry-after": "1"}, b"{}")
    error, sends, sleeps = drive([switched, retired])
    assert isinstance(error, RevisionRetired) and not isinstance(error, Refused)
    assert (error.status, error.reason, error.attempts, error.retries) == (409, "revisionRetired", 2,
                                                                          {"unavailable": 1})
    assert message in str(error)
    assert len(sends) == 2 and [s.cause for s in sleeps] == ["unavailable"] and sleeps[0].seconds >= 1.0


def test_an_answer_that_is_not_json_is_a_bad_answer() -> None:
    error, _, _ = drive([Answer(200, {}, b"<html>")])
    assert isinstance(error, BadAnswer)


def test_the_revision_header_wins_over_the_body() -> None:
    verdict, _, _ = drive([ok(CHAT, **{"x-genrm-revision": "7f9c"})])
    assert isinstance(verdict, Verdict) and verdict.revision == "7f9c" and verdict.gateway_named
    from_body, _, _ = drive([ok(CHAT)])
    assert isinstance(from_body, Verdict) and from_body.revision == "rev-a" and not from_body.gateway_named


@pytest.mark.parametrize(("header", "held"), [("2.503", 2.503), ("0.000", 0.0), (None, 0.0), ("nan", 0.0),
                                              ("-1", 0.0), ("inf", 0.0), ("soon", 0.0)])
def test_the_activators_hold_time_is_read_and_a_bad_one_is_no_time(header: str | None, held: float) -> None:
    headers = {} if header is None else {"x-genrm-held-seconds": header}
    verdict, _, _ = drive([ok(CHAT, **headers)])
    assert isinstance(verdict, Verdict) and verdict.held_s == held


def test_a_batch_answered_by_two_revisions_is_mixed() -> None:
    body = [{"text": "1", "meta_info": {"weight_version": "a"}}, {"text": "2", "meta_info": {"weight_version": "b"}}]
    error, _, _ = drive([ok(body)], calls.generate(["x", "y"]))
    assert isinstance(error, MixedJudges) and error.revisions == ("a", "b")


def test_verdicts_read_texts_and_scores() -> None:
    verdict = Verdict([{"embedding": [0.5]}, {"embedding": [-1.0]}], "r", None, 0.1, 1, {})
    assert verdict.scores == [0.5, -1.0]
    with pytest.raises(BadAnswer):
        _ = verdict.score
    assert Verdict({"embedding": [2.0]}, "r", None, 0.1, 1, {}).score == 2.0
    assert Verdict([{"text": "a"}, {"text": "b"}], "r", None, 0.1, 1, {}).texts == ["a", "b"]
    with pytest.raises(BadAnswer):
        _ = Verdict({"embedding": [1.0]}, "r", None, 0.1, 1, {}).text


def test_requests_are_the_routes_json() -> None:
    assert calls.chat([{"role": "user", "content": "x"}], "judge", temperature=0).body == {
        "messages": [{"role": "user", "content": "x"}], "model": "judge", "temperature": 0}
    assert calls.generate(input_ids=[1, 2]).body == {"input_ids": [1, 2]}
    assert calls.classify(["a", "b"]).path == "/classify"
    hint = calls.demand("t1-step-3", 4096, 30)
    assert hint.body == {"id": "t1-step-3", "requests": 4096, "startsWithinSeconds": 0, "forSeconds": 30}
    with pytest.raises(ValueError):
        calls.generate()
