"""A differential fuzzer: random kiln programs run eagerly and compiled, compared call by call.

``python -m tests.fuzz --programs 2000`` runs it and prints a summary; ``tests/fuzz/test_fuzz.py``
runs the small profile in the test suite.
"""
