"""Layer 4 of retrieval: what people look at: affinity maps and match galleries. Imports the layers below."""
