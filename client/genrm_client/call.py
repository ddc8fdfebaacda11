"""One judge call as a sequence of attempts, written once for both clients.

Why a generator: the sync and the async client differ only in how they send a request and how they
wait. :func:`attempts` is the whole call: it yields :class:`Send` (the caller sends the request and
sends back the :data:`~genrm_client.retry.Outcome`) and :class:`Sleep` (the caller waits), and
returns the :class:`~genrm_client.verdict.Verdict` or raises the typed error. Each client drives it
with a loop of a few lines (`sync`, `aio`), so the retry decisions, the counts, the deadline and the
verdict's reading exist once, and the tests drive the same generator without any I/O.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass

from genrm_client import wire
from genrm_client.calls import JudgeRequest
from genrm_client.errors import BadAnswer, JudgeError
from genrm_client.retry import Answer, Cause, Outcome, Retry, RetryPolicy, decide
from genrm_client.verdict import Verdict, held_of, revision_of


@dataclass(frozen=True)
class Send:
    request: JudgeRequest
    attempt: int


@dataclass(frozen=True)
class Sleep:
    seconds: float
    cause: Cause
    """Why the call waits (an overload shrinks a batch's window at once, not when the call ends)."""


Action = Send | Sleep
Attempts = Generator[Action, Outcome | None, Verdict]


def attempts(request: JudgeRequest, policy: RetryPolicy, rng: random.Random,
             clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> Attempts:
    """The call of ``request`` under ``policy``; ``clock`` measures its deadline and latency, ``wall``
    reads ``Retry-After`` dates."""
    started = clock()
    retries: Counter[str] = Counter()
    attempt = 0
    while True:
        attempt += 1
        outcome = yield Send(request, attempt)
        assert outcome is not None, "a Send is answered with its outcome"
        decision = decide(outcome, attempt, clock() - started, policy, rng, wall())
        if isinstance(decision, Retry):
            retries[decision.cause] += 1
            yield Sleep(decision.wait_s, decision.cause)
            continue
        if isinstance(decision, JudgeError):
            raise decision.settled(request.id, attempt, retries)
        assert isinstance(outcome, Answer)
        try:
            body = json.loads(outcome.body)
            revision = revision_of(outcome.headers, body)
        except ValueError:
            raise BadAnswer(f"{outcome.status}: the answer is not JSON",
                            status=outcome.status).settled(request.id, attempt, retries) from None
        except JudgeError as error:
            raise error.settled(request.id, attempt, retries) from None
        return Verdict(body, request.id, revision, clock() - started, attempt, dict(retries), held_of(outcome.headers),
                       bool(outcome.headers.get(wire.REVISION_HEADER)))
