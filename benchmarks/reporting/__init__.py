"""The parts of benchmarks/report.py, the driver that renders docs/results.md,
README.md's results block and docs/performance.md's tables (its docstring has
the module map). Nothing here imports the driver."""
