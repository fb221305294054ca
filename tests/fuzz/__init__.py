"""A differential fuzzer: random kiln programs run eagerly and compiled, compared call by call.

``python -m tests.fuzz --programs 2000`` runs it and prints a summary; ``--kinds`` picks the kinds
of programs (tests/fuzz/kinds.py: op chains, layers, whole-model training steps, optimizers and
schedulers whose hyperparameters change, Python containers and configs; all mixed by default).
``tests/fuzz/test_fuzz.py`` runs the small profile in the test suite.
"""
