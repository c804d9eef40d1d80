"""The benchmark harness behind bench/run: one module per job (measure, tools, checks, data,
scenarios, report, charts)."""
