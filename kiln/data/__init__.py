"""``kiln.data``: datasets, samplers and the DataLoader (next issue)."""
