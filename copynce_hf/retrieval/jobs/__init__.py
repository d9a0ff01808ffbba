"""Layer 2 of retrieval: resumable work on disk (chunked descriptor extraction, chunked pair scoring,
the work folder that records what is done) and the matcher's encoder-token cache. Imports :mod:`..search` only."""
