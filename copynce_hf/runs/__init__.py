"""Each command's one call: a request (models, settings, inputs, outputs) in, its files written and a result out."""
