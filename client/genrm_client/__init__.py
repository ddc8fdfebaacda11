"""genrm-client: call a genrm-operator judge pool from a trainer, without ever turning a failure
into a reward.

``JudgeClient`` (blocking) and ``AsyncJudgeClient`` send OpenAI chat completions, SGLang's
``/generate`` and ``/classify`` with the pool's API key; retry only what the pool did not judge
(`genrm_client.retry`); return a :class:`Verdict` or raise a typed :class:`JudgeError` (a batch
returns :class:`Unjudged` in its place); and run a training step's judge phase with a demand hint,
one judge revision and its figures (``client.step(n, expected=N, within_s=S)``). The framework
adapters are in `genrm_client.adapters`. Documentation: the project's ``docs/trainers.md``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("genrm-client")
except PackageNotFoundError:  # run from a source tree that was not installed
    __version__ = "0+unknown"

from genrm_client.aio import AsyncJudgeClient
from genrm_client.calls import JudgeRequest, chat, classify, generate
from genrm_client.config import PoolConfig
from genrm_client.errors import (
    BadAnswer,
    EngineFailed,
    JudgeError,
    JudgeTimeout,
    JudgeUnavailable,
    MixedJudges,
    Refused,
    RevisionRetired,
    Unjudged,
)
from genrm_client.retry import RetryPolicy
from genrm_client.step import Step, StepReport
from genrm_client.sync import JudgeClient
from genrm_client.verdict import Verdict
from genrm_client.window import WindowLaw

__all__ = ["AsyncJudgeClient", "BadAnswer", "EngineFailed", "JudgeClient", "JudgeError", "JudgeRequest",
           "JudgeTimeout", "JudgeUnavailable", "MixedJudges", "PoolConfig", "Refused", "RetryPolicy",
           "RevisionRetired", "Step", "StepReport", "Unjudged", "Verdict", "WindowLaw", "__version__", "chat",
           "classify", "generate"]
