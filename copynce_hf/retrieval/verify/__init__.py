"""Stage 4 of retrieval: the matcher verifies candidate pairs (one scoring path, cached encoder tokens, chunks on disk)."""
