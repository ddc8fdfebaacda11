"""The defaults of the gateway's per-client limits, defined once.

Why here: the gateway's flags (``genrm_gateway.config.Limits``) and the pool API's
``spec.gateway.limits`` (``genrm_operator.api.spec.GatewayLimits``) both default to these, so a
pool that sets nothing runs the gateway as shipped, and neither side imports the other. What each
limit means, and why these values, is said where it is enforced (``genrm_gateway.config``).
"""

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100
HEAD_TIMEOUT_SECONDS = 10.0
BODY_TIMEOUT_SECONDS = 30.0
MAX_JSON_DEPTH = 32
MAX_JSON_CONTAINERS = 10_000
MAX_BATCH_SIZE = 4096
MAX_CONNECTIONS = 4096
WRITE_TIMEOUT_SECONDS = 30.0
KEEP_ALIVE_SECONDS = 75.0
MAX_CONNECTION_AGE_SECONDS = 300.0
ENGINE_WAIT_SECONDS = 0.0
ENGINE_HEAD_TIMEOUT_SECONDS = 600.0
ENGINE_READ_TIMEOUT_SECONDS = 300.0
