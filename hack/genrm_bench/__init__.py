"""Benchmarks and load generators (development tools, not shipped): ``python -m genrm_bench.gateway``
(``make bench-gateway``), the load generator it runs (``genrm_bench.loadgen``) and the closed-loop
autoscaler simulation (``genrm_bench.simulate``)."""
