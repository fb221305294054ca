"""The ``fuzz`` marker: ``pytest -m "not fuzz"`` leaves the fuzzer's CI profile out."""


def pytest_configure(config):
    config.addinivalue_line("markers", "fuzz: the differential fuzzer's CI profile (deselect with -m 'not fuzz')")
