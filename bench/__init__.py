"""Every benchmark, one module per ``make bench-*`` target (development tools, never shipped; run from
the repository root): ``gateway`` (``make bench-gateway``) with its load generator ``loadgen``, ``parts``
(``make bench-parts``), ``autoscaler`` (``make bench-autoscaler``) with the closed-loop autoscaler
simulation ``simulate`` (also run by ``tests/autoscaling``), ``spread`` (``make bench-spread``) and
``operator_storm`` (``make bench-operator``). The cluster benchmarks use the e2e suite's harness."""
