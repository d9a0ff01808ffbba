"""Stage 1 of retrieval: descriptors of images and of their LCE views, extracted (resumably) and whitened."""
