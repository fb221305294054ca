def pytest_configure(config):
    config.addinivalue_line("markers", "fuzz: the differential fuzzer's CI profile (deselect with -m 'not fuzz')")
