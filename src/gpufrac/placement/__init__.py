"""The placement engine: filters, scorers and GPU pickers, and `decide`."""
