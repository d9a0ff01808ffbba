"""Stage 6 of retrieval: copies inside one collection (self-search, verified pairs, groups)."""
