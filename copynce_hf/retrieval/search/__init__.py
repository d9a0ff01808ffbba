"""Layer 1 of retrieval: image sources, descriptors, LCE views, faiss indexes, whitening, score
normalisation, candidates, the one search and the one prediction type. Imports no other retrieval layer."""
