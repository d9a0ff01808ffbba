"""Stage 3 of retrieval: each image's matcher encoder tokens, encoded once and kept, and which of them are its own
content (not shared with many neighbours): masks, the content-token stage and content crops."""
