"""The ``copynce`` command line, one module per command (as ``transformers``' ``commands/``).

Each command module declares its subcommand with ``register(subcommands)`` (its own options, the shared ones
from :mod:`.options`) and runs it with ``run(args)``: the parsed options become one request object of the
library, one library function runs it, and ``run`` prints what it did (:mod:`.console`). The entry point,
:mod:`copynce_hf.cli`, only registers the commands. Command modules import the library inside ``run``, so that
``copynce --help`` loads no torch, transformers or faiss.
"""
