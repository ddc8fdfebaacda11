"""One adapter per RL framework, each plugging the client into that framework's own extension point
(no fork): `verl` (a custom async ``compute_score``), `openrlhf` (a ``remote_rm_url`` file with
``reward_func``), `slime` (``--custom-rm-path``) and `relax` (the same hook, and a stand-in for its
``GenRMClient``). They share `judging`: the pool from the environment, the judge prompt and the
reading of a score. Each raises the client's typed error when a sample cannot be judged; none ever
returns a number that is not a verdict.
"""
