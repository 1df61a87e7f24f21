"""The inductor layer: tunecache as the backend of torch.compile's (Inductor's) remote caches.

Beside the tuner: above the core, the store and trust, below exchange, report and the CLI. This file
imports nothing (importing torch._inductor costs seconds): import the modules by name, e.g.
``tunecache.inductor.enable``.
"""
