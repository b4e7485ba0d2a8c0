"""The test suite: one folder per package stage (tests/<stage>/), shared models and helpers in
tests/support/, shared fixtures in tests/conftest.py. A package, so that every test module has a
unique dotted name (tests.runtime.test_codegen, ...) and `tests.support` imports the same way from
tests, benchmarks and scripts."""
