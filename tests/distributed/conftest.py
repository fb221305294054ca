# The worker scripts run inside launched jobs, never under pytest.
collect_ignore = ["workers"]
